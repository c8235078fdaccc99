"""Trigger patterns: which events a trigger listens to.

A pattern is an object with exactly one key:

* `{"memory_key_pattern": "<glob>"}` -- a KV key of the trigger's agent is set or deleted
  (shell-style glob: `*`, `?`, `[...]`, case-sensitive);
* `{"content_match": "<text>"}` -- a custom event (`event_publish`, `POST /api/events`) whose
  type or payload (as JSON) contains the text, case-insensitively;
* `{"workflow_completed": "<workflow id or *>"}` -- a workflow run completed;
* `{"agent_failed": "<agent id or *>"}` -- an agent's run failed;
* `{"channel_message": {"channel": "<name or *>", "match": "<regex>"}}` -- a message arrived
  on a channel and the regex matches somewhere in its text.
"""

from __future__ import annotations

import fnmatch
import json
import re
from typing import Any

from agentd.schema_fields import is_blank
from agentd.errors import BadRequest
from agentd.triggers.bus import AGENT, CHANNEL, CUSTOM, MEMORY, WORKFLOW, Event

KINDS = {
    "memory_key_pattern": MEMORY,
    "content_match": CUSTOM,
    "workflow_completed": WORKFLOW,
    "agent_failed": AGENT,
    "channel_message": CHANNEL,
}
MAX_TEXT = 1000


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or is_blank(value):
        raise BadRequest(f"{where}: must be a non-empty string")
    if len(value) > MAX_TEXT:
        raise BadRequest(f"{where}: at most {MAX_TEXT} characters")
    return value


def validate(pattern: Any, where: str = "pattern") -> tuple[str, dict[str, Any]]:
    """(kind, the normalised pattern); a 400 naming what is wrong otherwise."""
    if not isinstance(pattern, dict) or len(pattern) != 1:
        raise BadRequest(f"{where}: must be an object with exactly one of {', '.join(KINDS)}")
    kind, value = next(iter(pattern.items()))
    if kind not in KINDS:
        raise BadRequest(f"{where}: unknown pattern {kind!r}; expected one of {', '.join(KINDS)}")
    if kind != "channel_message":
        return kind, {kind: _text(value, f"{where}.{kind}")}
    if not isinstance(value, dict) or set(value) - {"channel", "match"} or "channel" not in value:
        raise BadRequest(f"{where}.channel_message: must be an object {{\"channel\", \"match\"}}")
    channel = _text(value["channel"], f"{where}.channel_message.channel")
    match = value.get("match", "")
    if not isinstance(match, str) or len(match) > MAX_TEXT:
        raise BadRequest(f"{where}.channel_message.match: must be a regular expression of at most "
                         f"{MAX_TEXT} characters")
    try:
        re.compile(match)
    except (re.error, OverflowError, RecursionError) as exc:
        # OverflowError: a repeat count past what the engine holds (a{99999999999}).
        raise BadRequest(f"{where}.channel_message.match: invalid regular expression: {exc}") from None
    return kind, {kind: {"channel": channel, "match": match}}


def matches(pattern: dict[str, Any], owner: str, event: Event) -> bool:
    """Whether `event` fires a trigger of agent `owner` with `pattern` (already validated)."""
    kind, value = next(iter(pattern.items()))
    if KINDS.get(kind) != event.kind:
        return False
    payload = event.payload
    if kind == "memory_key_pattern":
        return event.agent_id == owner and fnmatch.fnmatchcase(str(payload.get("key", "")), value)
    if kind == "content_match":
        text = f"{event.type} {json.dumps(payload, ensure_ascii=False, sort_keys=True)}"
        return value.lower() in text.lower()
    if kind == "workflow_completed":
        return value == "*" or value in (payload.get("workflow_id"), payload.get("workflow_name"))
    if kind == "agent_failed":
        return value == "*" or value in (payload.get("agent_id"), payload.get("agent_name"))
    channel = value["channel"]
    if channel != "*" and channel != payload.get("channel"):
        return False
    return re.search(value["match"], str(payload.get("text", ""))) is not None


def render(template: str, event: Event) -> str:
    """The prompt: `{{event}}` becomes the event as JSON; nothing else is touched."""
    return template.replace("{{event}}", json.dumps(event.as_json(), ensure_ascii=False))
