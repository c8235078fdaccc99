"""Responses of the trigger, event and task routes."""

from __future__ import annotations

from marshmallow import fields

from agentd.api.schemas_out.base import Bool, Int, NullStr, Num, Out, Str, req, reply, status

__all__ = ["TriggerSchema", "TriggerDeletedSchema", "EventAcceptedSchema", "TaskSchema", "TaskDeletedSchema"]


class TriggerSchema(Out):
    id = Str()
    trigger_id = Str(metadata={"description": "The same as `id`"})
    agent_id = Str()
    pattern = req(fields.Dict())
    prompt_template = Str()
    enabled = Bool()
    source = Str(metadata={"description": "`api`, or `manifest` for a proactive condition of the agent's manifest"})
    max_runs_per_day = req(fields.Integer(allow_none=True))
    max_cost_usd_per_day = req(fields.Float(allow_none=True))
    rate_limit_per_minute = req(fields.Integer(allow_none=True))
    paused = Bool()
    paused_reason = NullStr()
    runs_today = Int()
    cost_today_usd = Num()
    fire_count = Int()
    last_fired_at = NullStr()
    key_id = req(fields.String(allow_none=True, metadata={
        "description": "The scoped API key that created the trigger; its runs act as that key (its budget, "
                       "agent list and state apply). null: the admin's"}))
    created_at = Str()


TriggerDeletedSchema = reply("TriggerDeletedSchema", "removed", trigger_id=Str())


class EventAcceptedSchema(Out):
    status = status("accepted")
    event_id = Str()


class TaskSchema(Out):
    id = Str()
    title = Str()
    description = Str()
    status = status("pending", "in_progress", "completed")
    assigned_to = NullStr()
    created_by = NullStr()
    claimed_by = NullStr()
    result = NullStr()
    created_at = Str()
    claimed_at = NullStr()
    completed_at = NullStr()


TaskDeletedSchema = reply("TaskDeletedSchema", "removed", task_id=Str())
