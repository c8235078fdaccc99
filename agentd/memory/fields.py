"""Validation of memory inputs, shared by the HTTP routes and the agent tools.

Every check raises BadRequest with a message naming the field, so a route or a tool can
pass user input straight in.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from agentd.errors import BadRequest
from agentd.jsonsafe import NUL_MESSAGE, holds_nul
from agentd.schema_fields import is_blank

SOURCES = ("conversation", "document", "observation", "inference", "user_provided", "system")
MAX_CONTENT = 32_000
MAX_NAME = 256
MAX_DEPTH = 16
ENTITY_TYPES = ("person", "organization", "project", "concept", "event", "location", "document", "tool")
RELATION_TYPES = ("works_at", "knows_about", "related_to", "depends_on", "owned_by", "created_by", "located_in",
                  "part_of", "uses", "produces")


@dataclass
class MemoryFilter:
    """Recall filters; `after`/`before` are epoch seconds (exclusive bounds on created_at)."""

    source: str | None = None
    scope: str | None = None
    min_confidence: float | None = None
    after: float | None = None
    before: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    agent_id: str | None = None  # the spec's filter field; a per-agent recall matches only its own


def _encodable(value: str, name: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"{name} is not valid Unicode (lone surrogate)") from None
    return value


def text(value: Any, name: str, limit: int = MAX_CONTENT) -> str:
    if not isinstance(value, str) or is_blank(value):
        raise BadRequest(f"{name} must be a non-empty string")
    _encodable(value, name)
    if holds_nul(value):
        raise BadRequest(f"{name} {NUL_MESSAGE}")
    if len(value) > limit:
        raise BadRequest(f"{name} is too long ({len(value)} characters, limit {limit})")
    return value


def source(value: Any) -> str:
    if value not in SOURCES:
        raise BadRequest(f"source must be one of {', '.join(SOURCES)}")
    return value


def confidence(value: Any, name: str = "confidence") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not 0 <= value <= 1:
        raise BadRequest(f"{name} must be a number between 0 and 1")
    return float(value)


def obj(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{name} must be a JSON object")
    for key in value:
        if not key or len(key) > MAX_NAME:
            raise BadRequest(f"{name} keys must be 1-{MAX_NAME} characters")
        _encodable(key, f"{name} key")
    if holds_nul(value):
        raise BadRequest(f"{name}: a string {NUL_MESSAGE}")
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        raise BadRequest(f"{name} must not hold NaN or infinite numbers") from None
    return value


def integer(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"{name} must be an integer between {low} and {high}")
    return value


def depth(value: Any) -> int:
    """A graph query's `max_depth`: any integer from 1, walked to at most MAX_DEPTH hops (a
    deeper walk would only cost more; the spec leaves the integer unbounded). As in JSON
    Schema, 3.0 is the integer 3."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest("max_depth must be an integer of at least 1")
    return min(value, MAX_DEPTH)


def score(value: Any, name: str = "min_score") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not -1 <= value <= 1:
        raise BadRequest(f"{name} must be a number between -1 and 1")
    return float(value)


# The date forms datetime.fromisoformat reads: YYYY-MM-DD, YYYYMMDD, YYYY-Www[-D], YYYYWww[D].
_DATE = re.compile(r"[0-9]{4}(?:-[0-9]{2}-[0-9]{2}|[0-9]{4}|-W[0-9]{2}(?:-[0-9])?|W[0-9]{2}[0-9]?)")


def parse_time(value: Any, name: str) -> datetime:
    """An RFC 3339 / ISO 8601 time as aware UTC (a naive time is UTC)."""
    if isinstance(value, str):
        # Python's parser (3.11+) takes a Z and any number of fractional digits, but not a
        # lower-case z; and it reads ANY character after the date as the date-time separator,
        # so "2024-01-01+05:00" (a date with an offset) would be 05:00 UTC. RFC 3339 separates
        # them with T (or t) or a space only.
        text = value.strip().upper()
        date = _DATE.match(text)
        if date is not None and text[date.end():date.end() + 1] in ("", "T", " "):
            try:
                parsed = datetime.fromisoformat(text)
                return (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
            except (ValueError, OverflowError):
                pass
    raise BadRequest(f"{name} must be an ISO 8601 timestamp")


def timestamp(value: Any, name: str) -> float:
    """ISO 8601 (a naive time is UTC) or epoch seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    # An aware time's timestamp() is a plain subtraction: it cannot overflow.
    return parse_time(value, name).timestamp()


def memory_filter(value: Any) -> MemoryFilter:
    """The `filter` object of a recall."""
    if value is None:
        return MemoryFilter()
    data = obj(value, "filter")
    known = {"agent_id", "source", "scope", "min_confidence", "after", "before", "metadata"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise BadRequest(f"filter has unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    flt = MemoryFilter()
    if data.get("agent_id") is not None:
        flt.agent_id = text(data["agent_id"], "filter.agent_id", MAX_NAME)
    if data.get("source") is not None:
        flt.source = source(data["source"])
    if data.get("scope") is not None:
        flt.scope = text(data["scope"], "filter.scope", MAX_NAME)
    if data.get("min_confidence") is not None:
        flt.min_confidence = confidence(data["min_confidence"], "filter.min_confidence")
    if data.get("after") is not None:
        flt.after = timestamp(data["after"], "filter.after")
    if data.get("before") is not None:
        flt.before = timestamp(data["before"], "filter.before")
    if data.get("metadata") is not None:
        flt.metadata = obj(data["metadata"], "filter.metadata")
    return flt


def kind(value: Any, name: str) -> str:
    """An entity or relation type: a spec name or any custom word (`{"custom": "x"}` too)."""
    if isinstance(value, dict) and set(value) == {"custom"}:
        value = value["custom"]
    return text(value, name, 64).strip()
