"""marshmallow schemas of the trigger, event and task request bodies (agentd/triggers/,
agentd/tasks/ check the same rules again for the tools and the manifest)."""

from __future__ import annotations

from typing import Any

from marshmallow import EXCLUDE, Schema, ValidationError, fields, validate

from agentd.api.schemas import _Body
from agentd.jsonsafe import NUL_MESSAGE, holds_nul
from agentd.schema_fields import NOT_BLANK, StrictBoolean, StrictFloat
from agentd.tasks.board import MAX_TEXT, MAX_TITLE, STATUSES
from agentd.triggers.patterns import MAX_TEXT as PATTERN_MAX
from agentd.triggers.service import MAX_TEMPLATE

_TEXT = {"type": "string", "minLength": 1, "maxLength": PATTERN_MAX, "pattern": NOT_BLANK}


def _one(key: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": [key], "additionalProperties": False, "properties": {key: value}}


PATTERN_SHAPES = [
    _one("memory_key_pattern", _TEXT),
    _one("content_match", _TEXT),
    _one("workflow_completed", _TEXT),
    _one("agent_failed", _TEXT),
    _one("channel_message", {"type": "object", "required": ["channel"], "additionalProperties": False,
                             "properties": {"channel": _TEXT,
                                            "match": {"type": "string", "maxLength": PATTERN_MAX,
                                                      "format": "regex"}}}),
]


class StrictInteger(fields.Integer):
    """A JSON integer (5, or 5.0 as JSON Schema counts it) only: "5", 5.5 and true are type errors."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError("Not a valid integer.")
        return super()._deserialize(value, attr, data, **kwargs)


class _Loose(Schema):
    class Meta:
        unknown = EXCLUDE


def _caps() -> dict[str, fields.Field]:
    return {
        "max_runs_per_day": StrictInteger(allow_none=True, validate=validate.Range(min=1, max=1_000_000), metadata={
            "description": "Runs per UTC day; reaching it pauses the trigger until midnight UTC"}),
        "max_cost_usd_per_day": StrictFloat(allow_none=True, validate=validate.Range(min=0, min_inclusive=False),
                                            metadata={"exclusiveMinimum": 0,
                                                      "description": "Spend per UTC day; reaching it pauses the "
                                                                     "trigger until midnight UTC"}),
        "rate_limit_per_minute": StrictInteger(allow_none=True, validate=validate.Range(min=1, max=1_000_000),
                                               metadata={"description": "Firings per minute (default: "
                                                                        "[triggers] rate_limit_per_minute)"}),
    }


_TEMPLATE = {"validate": [validate.Length(min=1, max=MAX_TEMPLATE), validate.Regexp(NOT_BLANK)],
             "metadata": {"description": "The run's message; `{{event}}` becomes the event as JSON"}}

TriggerCreateSchema = _Body.from_dict({
    "agent_id": fields.String(required=True, validate=validate.Length(min=1, max=200),
                              metadata={"description": "The agent to run (id or name)"}),
    "pattern": fields.Raw(required=True, metadata={"oneOf": PATTERN_SHAPES,
                                                   "description": "Which events fire the trigger"}),
    "prompt_template": fields.String(required=True, **_TEMPLATE),
    "enabled": StrictBoolean(load_default=True),
    # The original's lifetime cap on firings; only its "no limit" is taken, so a trigger
    # meant to fire a few times is never created to fire without end.
    "max_fires": StrictInteger(load_only=True, validate=validate.Equal(
        0, error="only 0 (no limit) is taken: cap a trigger with max_runs_per_day, max_cost_usd_per_day or "
                 "rate_limit_per_minute"),
        metadata={"description": "The original's lifetime cap on firings: only 0 (no limit) is accepted"}),
    **_caps(),
}, name="TriggerCreateSchema")

# A change names only what it may change: a pattern or agent given here would otherwise be
# dropped without a word while the answer says 200.
TriggerUpdateSchema = _Body.from_dict({
    "enabled": StrictBoolean(metadata={"description": "false pauses the trigger; true resumes it (a paused "
                                                      "trigger too)"}),
    "prompt_template": fields.String(**_TEMPLATE),
    **_caps(),
}, name="TriggerUpdateSchema")


class TriggerQuery(_Loose):
    agent_id = fields.String(metadata={"description": "Only this agent's triggers (its id or name; an unknown "
                                                      "agent has none; empty: every trigger)"})


def _no_nul(value: str) -> None:
    if holds_nul(value):
        raise ValidationError(NUL_MESSAGE)


class EventSchema(_Loose):
    event_type = fields.String(required=True, validate=[validate.Length(min=1, max=200), validate.Regexp(NOT_BLANK),
                                                        _no_nul],
                               metadata={"description": "The event's type (e.g. `code_review_requested`)"})
    payload = fields.Dict(load_default=dict, metadata={"description": "Any JSON object"})


class TaskCreateSchema(_Loose):
    title = fields.String(required=True, validate=[validate.Length(min=1, max=MAX_TITLE), validate.Regexp(NOT_BLANK)])
    description = fields.String(load_default="", validate=validate.Length(max=MAX_TEXT))
    assigned_to = fields.String(allow_none=True, load_default=None, validate=validate.Length(min=1, max=200),
                                metadata={"description": "An agent's id or name"})


class TaskQuery(_Loose):
    status = fields.String(validate=validate.OneOf(STATUSES))
    assigned_to = fields.String(metadata={"description": "Only tasks assigned to this agent (id or name)"})
    claimed_by = fields.String(metadata={"description": "Only tasks claimed by this agent (id or name)"})


class TaskClaimSchema(_Loose):
    agent_id = fields.String(required=True, validate=validate.Length(min=1, max=200),
                             metadata={"description": "The claiming agent (id or name)"})


class TaskCompleteSchema(_Loose):
    result = fields.String(required=True, validate=validate.Length(max=MAX_TEXT))
    agent_id = fields.String(validate=validate.Length(min=1, max=200),
                             metadata={"description": "When given, only the agent that claimed the task may "
                                                      "complete it"})
