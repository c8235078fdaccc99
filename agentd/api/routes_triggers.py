"""Triggers (/api/triggers) and events (/api/events)."""

from __future__ import annotations

from flask import Blueprint, jsonify, request

from agentd.api import body
from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api.principal import principal, reach_agent, reachable
from agentd.api.routes_system import kernel
from agentd.api.schemas_triggers import EventSchema, TriggerCreateSchema, TriggerQuery, TriggerUpdateSchema

bp = Blueprint("triggers", __name__)


@bp.post("/api/triggers")
@doc("Create a trigger", tags="triggers", body=TriggerCreateSchema, ok=201, response=out.TriggerSchema,
     description="Runs the agent with `prompt_template` (`{{event}}` replaced by the event as JSON) whenever "
                 "an event matches `pattern`. A run a trigger started never fires its own agent's triggers. "
                 "A trigger created with a scoped API key runs as that key (`key_id`): its spend counts toward "
                 "the key's budget, and a firing is refused (audited `trigger.refused`) once the key is deleted, "
                 "disabled, expired, over its budget or no longer reaches the agent.",
     body_example={"agent_id": "3f0c8a52-6f1e-4c39-9a57-2d8f3c1b7e10", "pattern": {"content_match": "deploy"},
                   "prompt_template": "Something happened: {{event}}", "max_runs_per_day": 20},
     errors={404: "No agent with that id or name"},
     links={"GetTrigger": ("triggers.detail", {"trigger_id": "$response.body#/id"}),
            "UpdateTrigger": ("triggers.update", {"trigger_id": "$response.body#/id"}),
            "DeleteTrigger": ("triggers.delete", {"trigger_id": "$response.body#/id"})})
def create():
    data = body.load(TriggerCreateSchema())
    reach_agent(data.get("agent_id"))
    return jsonify(kernel().triggers.create(data, key_id=principal().key_id)), 201


@bp.get("/api/triggers")
@doc("List triggers, oldest first", tags="triggers", query=TriggerQuery,
     response={"type": "array", "items": out.TriggerSchema})
def list_triggers():
    return jsonify(reachable(kernel().triggers.list(request.args.get("agent_id") or None)))


@bp.get("/api/triggers/<trigger_id>")
@doc("One trigger, with its counters for today", tags="triggers", response=out.TriggerSchema)
def detail(trigger_id: str):
    return jsonify(kernel().triggers.get(trigger_id))


@bp.patch("/api/triggers/<trigger_id>")
@doc("Change a trigger: enable or pause it, its caps, its template", tags="triggers", body=TriggerUpdateSchema,
     response=out.TriggerSchema, description="`enabled: true` also resumes a trigger paused by a cap.")
def update(trigger_id: str):
    return jsonify(kernel().triggers.update(trigger_id, body.load(TriggerUpdateSchema()), principal().key_id))


@bp.delete("/api/triggers/<trigger_id>")
@doc("Delete a trigger", tags="triggers", response=out.TriggerDeletedSchema)
def delete(trigger_id: str):
    kernel().triggers.delete(trigger_id)
    return jsonify({"status": "removed", "trigger_id": trigger_id})


@bp.post("/api/events")
@doc("Publish an event", tags="triggers", body=EventSchema, ok=202, response=out.EventAcceptedSchema,
     body_example={"event_type": "deploy_finished", "payload": {"service": "web", "version": "1.4.2"}},
     description="The daemon that receives the event evaluates the triggers (`content_match` patterns) "
                 "after answering; each matching trigger fires once, on this daemon.",
     errors={413: "Event over 64 KB"})
def publish_event():
    event = kernel().publish_event(body.load(EventSchema(), 65_536), principal().key_id)
    return jsonify({"status": "accepted", "event_id": event}), 202
