"""The shared task board (/api/tasks)."""

from __future__ import annotations

from flask import Blueprint, jsonify, request
from marshmallow import ValidationError

from agentd.agents.handle import parse_uuid
from agentd.api import body
from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api.principal import TASK_AGENTS, reach_agent, reachable
from agentd.api.routes_system import kernel
from agentd.api.schemas_triggers import TaskClaimSchema, TaskCompleteSchema, TaskCreateSchema, TaskQuery
from agentd.errors import BadRequest, NotFound

bp = Blueprint("tasks", __name__)
_TASK = {"type": "array", "items": out.TaskSchema}


def _reach(ref: str | None) -> None:
    """An agent outside a scoped key's list is refused as an unknown one is."""
    reach_agent(ref, lambda name: NotFound(f"no agent with id or name {name!r}"))


@bp.get("/api/tasks")
@doc("List the newest 500 tasks, oldest first", tags="tasks", query=TaskQuery, response=_TASK)
def list_tasks():
    try:
        args = TaskQuery().load(request.args)
    except ValidationError as exc:
        raise BadRequest(f"invalid query: {body.format_validation(exc.messages)}") from None
    return jsonify(reachable(kernel().tasks.list(**args), *TASK_AGENTS))


@bp.post("/api/tasks")
@doc("Post a task", tags="tasks", body=TaskCreateSchema, ok=201, response=out.TaskSchema,
     body_example={"title": "Review the release notes", "description": "Check links and versions"},
     errors={404: "`assigned_to` names no agent"},
     links={"GetTask": ("tasks.detail", {"task_id": "$response.body#/id"}),
            "DeleteTask": ("tasks.delete", {"task_id": "$response.body#/id"})})
def create():
    data = body.load(TaskCreateSchema())
    _reach(data["assigned_to"])
    return jsonify(kernel().tasks.post(data["title"], data["description"], data["assigned_to"])), 201


@bp.get("/api/tasks/<task_id>")
@doc("One task", tags="tasks", response=out.TaskSchema)
def detail(task_id: str):
    return jsonify(kernel().tasks.get(parse_uuid(task_id, "task")))


@bp.post("/api/tasks/<task_id>/claim")
@doc("Claim a task for an agent", tags="tasks", body=TaskClaimSchema, response=out.TaskSchema,
     description="Exactly one of several concurrent claims of a pending task succeeds; the others get 409.",
     errors={404: "No such task, or no agent with that id or name",
             409: "The task is not pending, or is assigned to another agent"})
def claim(task_id: str):
    key = parse_uuid(task_id, "task")
    agent = body.load(TaskClaimSchema())["agent_id"]
    _reach(agent)
    return jsonify(kernel().tasks.claim(key, agent))


@bp.post("/api/tasks/<task_id>/complete")
@doc("Complete a claimed task with its result", tags="tasks", body=TaskCompleteSchema, response=out.TaskSchema,
     errors={404: "No such task, or no agent with that id or name",
             409: "The task is not in progress, or another agent claimed it"})
def complete(task_id: str):
    key = parse_uuid(task_id, "task")
    data = body.load(TaskCompleteSchema())
    _reach(data.get("agent_id"))
    return jsonify(kernel().tasks.complete(key, data["result"], data.get("agent_id")))


@bp.delete("/api/tasks/<task_id>")
@doc("Delete a task", tags="tasks", response=out.TaskDeletedSchema)
def delete(task_id: str):
    kernel().tasks.delete(parse_uuid(task_id, "task"))
    return jsonify({"status": "removed", "task_id": task_id})
