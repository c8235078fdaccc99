"""Manifest TOML written for people who fill in a form instead of writing it.

tomlkit writes the text (quoting and escaping are its job) and keeps the rest of an
existing manifest, comments included, when only its model changes.
"""

from __future__ import annotations

import tomlkit
from tomlkit.exceptions import TOMLKitError

from agentd.errors import BadRequest


def split_model(ref: str) -> tuple[str, str]:
    """A model picker's value as (provider, model): `provider/model`, or `default`."""
    ref = (ref or "").strip()
    if not ref or ref == "default":
        return "default", "default"
    provider, sep, model = ref.partition("/")
    if not sep or not provider or not model:
        raise BadRequest(f"model: expected provider/model or default, got {ref!r}")
    return provider, model


def build(name: str, model_ref: str, profile: str = "", system_prompt: str = "", description: str = "") -> str:
    """A manifest from the spawn form's fields (the manifest parser validates them)."""
    provider, model = split_model(model_ref)
    doc = tomlkit.document()
    doc["name"] = (name or "").strip()
    if description.strip():
        doc["description"] = description.strip()
    if profile.strip():
        doc["profile"] = profile.strip()
    table = tomlkit.table()
    table["provider"] = provider
    table["model"] = model
    if system_prompt.strip():
        table["system_prompt"] = system_prompt.replace("\r\n", "\n").strip()
    doc["model"] = table
    return doc.as_string()


def with_model(manifest_toml: str, model_ref: str) -> str:
    """`manifest_toml` with its `[model]` provider and model set to `model_ref`'s."""
    provider, model = split_model(model_ref)
    try:
        doc = tomlkit.parse(manifest_toml)
    except TOMLKitError as exc:
        raise BadRequest(f"invalid manifest format: {exc}") from None
    table = doc.get("model")
    if table is None:
        table = tomlkit.table()
        doc["model"] = table
    elif not isinstance(table, dict):
        raise BadRequest("invalid manifest format: model must be a table")
    table["provider"] = provider
    table["model"] = model
    table.pop("name", None)  # `name` is the parser's older spelling of `model`
    return doc.as_string()
