"""Tools agents cooperate with: the shared task board (task_*), events (event_publish) and
agent_activate. The board and the bus are the daemon's (agentd/tasks/, agentd/triggers/)."""

from __future__ import annotations

import json
from typing import Any

from agentd.agents.tools.base import ToolContext, ToolError, tool
from agentd.jsonsafe import NUL_MESSAGE, holds_nul

# What the model sees of a task list: the newest tasks, each description and result cut.
LIST_MAX = 50
DESCRIPTION_MAX = 500
PAYLOAD_MAX = 65_536


def _cut(text: str | None) -> str | None:
    return text if text is None or len(text) <= DESCRIPTION_MAX else text[:DESCRIPTION_MAX] + "..."


def _short(task: dict[str, Any]) -> dict[str, Any]:
    return {**task, "description": _cut(task["description"]), "result": _cut(task["result"])}


@tool("task_post", "Post a task to the shared task queue for another agent to pick up.",
      {"title": {"type": "string", "description": "Short task title"},
       "description": {"type": "string", "description": "Detailed task description"},
       "assigned_to": {"type": "string", "description": "Agent name or ID to assign the task to (optional)"}},
      ("title", "description"))
def task_post(ctx: ToolContext, args: dict[str, Any]) -> str:
    task = ctx.require_ops().task_post(ctx.agent_id, args["title"], args["description"], args.get("assigned_to"))
    return json.dumps({"task_id": task["id"], "status": task["status"], "assigned_to": task["assigned_to"]})


@tool("task_claim", "Claim the next available task from the task queue assigned to you or unassigned.", {})
def task_claim(ctx: ToolContext, args: dict[str, Any]) -> str:
    task = ctx.require_ops().task_claim(ctx.agent_id)
    if task is None:
        return "no pending task to claim"
    return json.dumps(_short(task), ensure_ascii=False)


@tool("task_complete", "Mark a previously claimed task as completed with a result.",
      {"task_id": {"type": "string", "description": "The task ID to complete"},
       "result": {"type": "string", "description": "The result or outcome of the task"}},
      ("task_id", "result"))
def task_complete(ctx: ToolContext, args: dict[str, Any]) -> str:
    task = ctx.require_ops().task_complete(ctx.agent_id, args["task_id"], args["result"])
    return f"completed task {task['id']}"


@tool("task_list", "List tasks in the shared queue, optionally filtered by status (pending, in_progress, "
      "completed).",
      {"status": {"type": "string", "description": "Filter by status: pending, in_progress, completed (optional)"}},
      read_only=True)
def task_list(ctx: ToolContext, args: dict[str, Any]) -> str:
    tasks = ctx.require_ops().task_list(ctx.agent_id, args.get("status") or None)
    if not tasks:
        return "no tasks"
    shown = [_short(t) for t in tasks[-LIST_MAX:]]
    note = f" (the newest {LIST_MAX} of {len(tasks)})" if len(tasks) > LIST_MAX else ""
    return json.dumps(shown, ensure_ascii=False) + note


@tool("event_publish", "Publish a custom event that can trigger proactive agents. Use to broadcast signals to "
      "the agent fleet.",
      {"event_type": {"type": "string", "description": "Type identifier for the event (e.g., "
                                                       "'code_review_requested')"},
       "payload": {"type": "object", "description": "JSON payload data for the event"}},
      ("event_type",))
def event_publish(ctx: ToolContext, args: dict[str, Any]) -> str:
    event_type = args["event_type"].strip()
    if not event_type or len(event_type) > 200:
        raise ToolError("event_type: must be a non-empty string of at most 200 characters")
    if holds_nul(event_type):
        raise ToolError(f"event_type: {NUL_MESSAGE}")
    payload = args.get("payload") or {}
    if len(json.dumps(payload)) > PAYLOAD_MAX:
        raise ToolError(f"payload: at most {PAYLOAD_MAX} bytes of JSON")
    event_id = ctx.require_ops().event_publish(ctx.agent_id, event_type, payload)
    return f"published event {event_id} ({event_type})"


@tool("agent_activate", "Activate (wake up) an inactive agent so it can receive messages and process events. "
      "Use this when agent_list shows an agent that is not Running and you want to delegate work to it via "
      "agent_send. Terminated agents cannot be revived.",
      {"agent_id": {"type": "string", "description": "The target agent's UUID or human-readable name"}},
      ("agent_id",))
def agent_activate(ctx: ToolContext, args: dict[str, Any]) -> str:
    return json.dumps(ctx.require_ops().activate_agent(ctx.agent_id, args["agent_id"]))
