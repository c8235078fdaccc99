"""Agent manifests: TOML text validated with marshmallow into a `Manifest`.

Wrong types and out-of-range values are errors that name the key. Unknown keys
do not fail a spawn (manifests written for other runtimes must still load) but
are reported: each becomes a warning, with a suggestion when it looks like a
typo of a known key (`profle` -> `profile`), returned by POST /api/agents and logged.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from marshmallow import EXCLUDE, Schema, ValidationError, fields, pre_load, validate, validates

from agentd import tomlsafe
from agentd.agents.manifest_schedule import REACTIVE, ScheduleField
from agentd.errors import BadRequest, PayloadTooLarge
from agentd.schema_fields import StrictFloat

PROFILES: dict[str, list[str]] = {
    "minimal": ["file_read", "file_list"],
    "coding": ["file_read", "file_write", "file_list", "shell_exec", "web_fetch"],
    "research": ["web_fetch", "web_search", "file_read", "file_write"],
    "messaging": ["agent_send", "agent_list", "memory_store", "memory_recall"],
    "automation": ["file_read", "file_write", "file_list", "shell_exec", "web_fetch", "web_search",
                   "agent_send", "agent_list", "memory_store", "memory_recall"],
    "full": ["*"],
}
# `custom` is accepted in a manifest (it means "all tools") but not listed as a profile.
PROFILE_NAMES = set(PROFILES) | {"custom"}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\- ]{0,63}$")
MANIFEST_LIMIT = 1024 * 1024
# Messages of the stored session sent to the model with each run (`max_history_messages`,
# where 0 or no value means this).
DEFAULT_HISTORY_MESSAGES = 20


class ManifestError(BadRequest):
    """A manifest that cannot be used; the message starts with `invalid manifest format`."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"invalid manifest format: {detail}")


class _Strict(Schema):
    class Meta:
        unknown = EXCLUDE


class _StrList(fields.List):
    """A list (of strings, as declared) that also accepts one bare string."""

    def _deserialize(self, value: Any, *rest: Any, **kwargs: Any) -> list[str]:
        if isinstance(value, str):
            value = [value]
        return super()._deserialize(value, *rest, **kwargs)


class ModelSchema(_Strict):
    provider = fields.String(load_default="default")
    model = fields.String(load_default="default")
    system_prompt = fields.String(load_default="You are a helpful AI agent.")
    max_tokens = fields.Integer(load_default=4096, strict=True, validate=validate.Range(min=1, max=1_000_000))
    temperature = StrictFloat(load_default=0.7, validate=validate.Range(min=0.0, max=2.0))
    api_key_env = fields.String(load_default="")
    base_url = fields.String(load_default="")

    @pre_load
    def _name_alias(self, data: Any, **_: Any) -> Any:
        if isinstance(data, dict) and "model" not in data and "name" in data:
            data = dict(data)
            data["model"] = data.pop("name")
        return data


class FallbackSchema(_Strict):
    provider = fields.String(required=True)
    model = fields.String(required=True)
    api_key_env = fields.String(load_default="")
    base_url = fields.String(load_default="")


# Grants are arrays in a new manifest: read as a one-item list, `network = "none"` granted
# the network and `shell = "false"` allowed a program named "false". (Agents stored before
# this rule still load: `parse_manifest(..., new=False)`.)
GRANT_LISTS = ("tools", "network", "memory_read", "memory_write", "shell", "agent_message")


class CapabilitiesSchema(_Strict):
    tools = _StrList(fields.String(), load_default=list)
    network = _StrList(fields.String(), load_default=list)
    memory_read = _StrList(fields.String(), load_default=list)
    memory_write = _StrList(fields.String(), load_default=list)
    shell = _StrList(fields.String(), load_default=list)
    agent_message = _StrList(fields.String(), load_default=list)
    agent_spawn = fields.Boolean(load_default=False)
    max_llm_tokens_per_hour = fields.Integer(load_default=0, strict=True, validate=validate.Range(min=0))


class ResourcesSchema(_Strict):
    max_llm_tokens_per_hour = fields.Integer(load_default=0, strict=True, validate=validate.Range(min=0))
    max_iterations = fields.Integer(load_default=None, strict=True, allow_none=True,
                                    validate=validate.Range(min=1, max=1000))
    tool_timeout_secs = StrictFloat(load_default=120.0, validate=validate.Range(min=0.1, max=3600))


class AutonomousSchema(_Strict):
    max_iterations = fields.Integer(load_default=50, strict=True, validate=validate.Range(min=1, max=1000))


class IdentitySchema(_Strict):
    emoji = fields.String(load_default="🤖")
    avatar_url = fields.String(load_default=None, allow_none=True)
    color = fields.String(load_default="#3fb950", validate=validate.Regexp(r"^#[0-9A-Fa-f]{3,8}$"))


class MemorySectionSchema(_Strict):
    # None: the config's `[memory] share_episodic`.
    share_episodic = fields.Boolean(load_default=None, allow_none=True)


class ManifestSchema(_Strict):
    name = fields.String(required=True)
    description = fields.String(load_default="")
    version = fields.String(load_default="0.1.0")
    author = fields.String(load_default="")
    profile = fields.String(load_default=None, allow_none=True)
    tags = _StrList(fields.String(), load_default=list)
    skills = _StrList(fields.String(), load_default=list)
    mcp_servers = _StrList(fields.String(), load_default=list)
    max_history_messages = fields.Integer(load_default=None, strict=True, allow_none=True,
                                          validate=validate.Range(min=0, max=100_000))
    model = fields.Nested(ModelSchema, load_default=lambda: ModelSchema().load({}))
    fallback_models = fields.List(fields.Nested(FallbackSchema), load_default=list)
    capabilities = fields.Nested(CapabilitiesSchema, load_default=lambda: CapabilitiesSchema().load({}))
    resources = fields.Nested(ResourcesSchema, load_default=lambda: ResourcesSchema().load({}))
    autonomous = fields.Nested(AutonomousSchema, load_default=lambda: AutonomousSchema().load({}))
    identity = fields.Nested(IdentitySchema, load_default=lambda: IdentitySchema().load({}))
    schedule = ScheduleField(load_default=lambda: dict(REACTIVE))
    # Only when the manifest has a [memory] table: older manifests' stored form is unchanged.
    memory = fields.Nested(MemorySectionSchema)

    @validates("name")
    def _name(self, value: str, **_: Any) -> None:
        if not NAME_RE.match(value):
            raise ValidationError("must be 1-64 ASCII letters, digits, spaces, '_', '.' or '-', "
                                  "starting with a letter or digit")

    @validates("profile")
    def _profile(self, value: str | None, **_: Any) -> None:
        if value is not None and value.lower() not in PROFILE_NAMES:
            raise ValidationError(f"unknown profile {value!r}; one of {', '.join(sorted(PROFILE_NAMES))}")


_SCHEMA = ManifestSchema()


@dataclass
class Manifest:
    """A validated manifest. `data` is the normalised dict that gets persisted."""

    data: dict[str, Any]
    toml_text: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def profile(self) -> str | None:
        return self.data["profile"]

    @property
    def model(self) -> dict[str, Any]:
        return self.data["model"]

    @property
    def capabilities(self) -> dict[str, Any]:
        return self.data["capabilities"]

    @property
    def max_iterations(self) -> int:
        return self.data["resources"].get("max_iterations") or self.data["autonomous"]["max_iterations"]

    @property
    def tokens_per_hour(self) -> int:
        # The spec shows the key under [capabilities]; other runtimes put it in [resources].
        return self.data["capabilities"]["max_llm_tokens_per_hour"] or self.data["resources"]["max_llm_tokens_per_hour"]

    @property
    def history_messages(self) -> int:
        """How many of the latest stored messages a run sends to the model."""
        return self.data.get("max_history_messages") or DEFAULT_HISTORY_MESSAGES

    @property
    def schedule(self) -> dict[str, Any]:
        """When the agent acts on its own (agentd/agents/manifest_schedule.py)."""
        return self.data.get("schedule") or dict(REACTIVE)

    @property
    def tool_timeout(self) -> float:
        return float(self.data["resources"]["tool_timeout_secs"])


def _flatten(messages: Any, prefix: str = "") -> list[str]:
    """marshmallow's nested error messages as `path: text` lines.

    marshmallow nests dicts (table and list-index keys) down to lists of strings."""
    if not isinstance(messages, dict):
        return [f"{prefix}: {message}" for message in messages]
    out: list[str] = []
    for key, value in messages.items():
        out += _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def _unknown_keys(raw: dict[str, Any], schema: Schema, where: str = "") -> list[str]:
    """Warnings for keys of `raw` that `schema` (and its nested tables) does not define.

    Called only after `schema` loaded `raw`, so every nested table is a dict and every
    list of tables a list."""
    warnings: list[str] = []
    known = dict(schema.fields)
    if isinstance(schema, ModelSchema):
        known.setdefault("name", known["model"])  # accepted alias of `model`
    for key, value in raw.items():
        path = f"{where}.{key}" if where else key
        field_ = known.get(key)
        if field_ is None:
            # get_close_matches lists the best match first; only that one is shown.
            close = difflib.get_close_matches(key, list(known), cutoff=0.75)
            hint = f" (did you mean '{f'{where}.' if where else ''}{close[0]}'?)" if close else ""
            warnings.append(f"unknown key '{path}' ignored{hint}")
        elif isinstance(field_, fields.Nested):
            warnings += _unknown_keys(value, field_.schema, path)
        elif isinstance(field_, fields.List) and isinstance(field_.inner, fields.Nested):
            for i, item in enumerate(value):
                warnings += _unknown_keys(item, field_.inner.schema, f"{path}[{i}]")
    return warnings


def parse_manifest(text: str, new: bool = True) -> Manifest:
    """Parse and validate manifest TOML; raises ManifestError naming what and where.
    `new=False` reads a stored agent's manifest by the rules it was accepted under."""
    if len(text.encode("utf-8")) > MANIFEST_LIMIT:
        # 413 like a too-large `manifest_toml`, also for one inside a signed envelope.
        raise PayloadTooLarge("manifest too large (max 1 MB)")
    try:
        raw = tomlsafe.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"TOML syntax error: {exc}") from None
    grants = raw.get("capabilities")
    if new and isinstance(grants, dict):
        for key in GRANT_LISTS:
            if isinstance(grants.get(key), str):
                raise ManifestError(f"capabilities.{key}: Not a valid list.")
    try:
        data = _SCHEMA.load(raw)
    except ValidationError as exc:
        raise ManifestError("; ".join(_flatten(exc.messages))) from None
    if data["profile"] is not None:
        data["profile"] = data["profile"].lower()
    return Manifest(data=data, toml_text=text, warnings=_unknown_keys(raw, _SCHEMA))


def profile_list() -> list[dict[str, Any]]:
    """The body of GET /api/profiles."""
    return [{"name": name, "tools": list(tools)} for name, tools in PROFILES.items()]
