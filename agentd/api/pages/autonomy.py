"""Triggers and the task board: what fires the agents on its own, and what they work on."""

from __future__ import annotations

from flask import render_template, request

from agentd.api.pages import bp, kernel, see_other
from agentd.api.principal import principal, reachable
from agentd.errors import AgentdError


def _agent_names() -> dict[str, str]:
    return {h.id: h.name for h in principal().visible(kernel().agents.handles())}


def _triggers_page(status: int = 200, error: str = ""):
    return render_template("triggers.html", triggers=reachable(kernel().triggers.list()), names=_agent_names(),
                           error=error), status


@bp.get("/triggers")
def triggers():
    return _triggers_page()


@bp.post("/triggers/<trigger_id>/<action>")
def trigger_action(trigger_id: str, action: str):
    """enable (also resumes a paused trigger), disable or delete, as the JSON API does."""
    service = kernel().triggers
    try:
        if action == "delete":
            service.delete(trigger_id)
        elif action in ("enable", "disable"):
            service.update(trigger_id, {"enabled": action == "enable"})
        else:
            return _triggers_page(404, f"unknown action {action!r}")
    except AgentdError as exc:
        return _triggers_page(exc.status, exc.message)
    return see_other("pages.triggers")


def _tasks_page(status: int = 200, error: str = ""):
    wanted = request.args.get("status") or None
    try:
        tasks = kernel().tasks.list(status=wanted)
    except AgentdError as exc:
        tasks, status, error = [], exc.status, exc.message
    return render_template("tasks.html", tasks=list(reversed(tasks)), names=_agent_names(), wanted=wanted,
                           error=error), status


@bp.get("/tasks")
def tasks():
    return _tasks_page()


@bp.post("/tasks")
def task_post():
    form = request.form
    try:
        kernel().tasks.post(form.get("title", ""), form.get("description", ""), form.get("assigned_to") or None)
    except AgentdError as exc:
        return _tasks_page(exc.status, exc.message)
    return see_other("pages.tasks")


@bp.post("/tasks/<task_id>/delete")
def task_delete(task_id: str):
    try:
        kernel().tasks.delete(task_id)
    except AgentdError as exc:
        return _tasks_page(exc.status, exc.message)
    return see_other("pages.tasks")
