"""Per-request generation parameters across wire formats.

A client of the OpenAI-compatible API may send `top_p`, `stop`, `seed`, penalties,
`response_format` and `user`. Each driver format module maps what its provider has
an equivalent for and lists the rest in `UNSUPPORTED_PARAMS`; those are dropped
(never refused): `dropped()` names them so the API can say so in a response header,
and `log_dropped()` leaves a log line when a call is built without them.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from agentd.llm.types import GenerationParams

log = logging.getLogger("agentd.llm")


def dropped(kind: str, params: GenerationParams) -> list[str]:
    """The parameters in `params` that a provider of wire format `kind` cannot honour."""
    from agentd.llm.drivers import FORMATS

    fmt = FORMATS.get(kind)
    unsupported: frozenset[str] = getattr(fmt, "UNSUPPORTED_PARAMS", frozenset())
    return [name for name in params.given() if name in unsupported]


def log_dropped(provider: str, model: str, kind: str, params: GenerationParams) -> None:
    """One log line naming what this call leaves out (nothing when all were mapped)."""
    names = dropped(kind, params)
    if names:
        log.info("%s model %s: dropping %s (no equivalent in the %s API)", provider, model,
                 ", ".join(names), kind)


def wants_json(params: GenerationParams) -> bool:
    """Whether the client asked for a JSON answer (`json_object` or `json_schema`)."""
    fmt = params.response_format or {}
    return fmt.get("type") in ("json_object", "json_schema")


def json_schema_of(params: GenerationParams) -> dict[str, Any] | None:
    """The JSON schema of a `json_schema` response format, if one was given."""
    fmt = params.response_format or {}
    spec = fmt.get("json_schema") if fmt.get("type") == "json_schema" else None
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return schema if isinstance(schema, dict) else None


def json_instruction(params: GenerationParams) -> str:
    """A system-prompt instruction that asks for JSON, for providers without a JSON mode."""
    if not wants_json(params):
        return ""
    schema = json_schema_of(params)
    text = "Answer with one valid JSON object only: no prose, no code fences."
    if schema is not None:
        text += " It must match this JSON schema: " + json.dumps(schema, separators=(",", ":"))
    return text
