"""Triggers and the task board: what fires the agents on its own, and what they work on."""

from __future__ import annotations

from flask import render_template, request, url_for

from agentd.api.pages import bp, form_post, kernel, see_other
from agentd.api.pages.confirm import ask_first
from agentd.api.principal import TASK_AGENTS, principal, reach_agent, reachable
from agentd.api.pages.notes import see_other_with
from agentd.api.pages.schedule_form import TRIGGER_FIELDS, _number, trigger_body, typed
from agentd.api.pages.schedules import page_of
from agentd.errors import AgentdError, BadRequest, NotFound
from agentd.triggers import patterns


def _agent_names() -> dict[str, str]:
    return {h.id: h.name for h in principal().visible(kernel().agents.handles())}


TRIGGERS_SHOWN = 30  # triggers a page of /triggers (the 60 KB page budget)


CAPS = ("max_runs_per_day", "max_cost_usd_per_day", "rate_limit_per_minute")


def _triggers_page(status: int = 200, error: str = "", form: dict | None = None, editing: dict | None = None,
                   edit_error: str = ""):
    """`editing`: the trigger whose edit form shows ({"trigger": ..., "form": what it holds})."""
    paged = page_of(reachable(kernel().triggers.list()), TRIGGERS_SHOWN)
    return render_template("triggers.html", triggers=paged["items"], paged=paged, names=_agent_names(),
                           error=error, form=form or {}, kinds=patterns.KINDS, editing=editing,
                           edit_error=edit_error), status


def _editable(trigger: dict) -> dict[str, str]:
    form = {key: "" if trigger[key] is None else f"{trigger[key]:g}" for key in CAPS}
    form["prompt_template"] = trigger["prompt_template"]
    return form


@bp.get("/triggers")
def triggers():
    edit = request.args.get("edit")
    if not edit:
        return _triggers_page()
    trigger = kernel().triggers.get(edit)  # unknown: the ordinary 404 page
    reach_agent(trigger["agent_id"], lambda _: NotFound("trigger not found"))
    return _triggers_page(editing={"trigger": trigger, "form": _editable(trigger)})


@form_post("/triggers/<trigger_id>/edit", "pages.triggers", keeps=("prompt_template",))
def trigger_edit(trigger_id: str):
    """Change the trigger's prompt and caps as PATCH /api/triggers/{id} does (an emptied cap is
    removed); a refusal comes back above the edit form, with what was typed."""
    service = kernel().triggers
    trigger = service.get(trigger_id)
    form = typed(CAPS, "prompt_template")
    changes = {"prompt_template": form["prompt_template"]}
    changes.update({key: _cap(form[key], float if key == "max_cost_usd_per_day" else int) for key in CAPS})
    try:
        service.update(trigger_id, changes, principal().key_id)
    except AgentdError as exc:
        return _triggers_page(exc.status, editing={"trigger": trigger, "form": form}, edit_error=exc.message)
    return see_other_with("pages.triggers", [f"trigger saved for {_agent_names().get(trigger['agent_id'])}"],
                          _anchor=f"trigger-{trigger_id}")


def _cap(text: str, kind: type):
    """A typed cap: None when empty (no cap), else as the add form reads it."""
    return _number(text, kind) if text else None



@bp.post("/triggers")
def trigger_create():
    """Create a trigger as POST /api/triggers does; a refusal comes back above the form, with
    what was typed."""
    form = typed(TRIGGER_FIELDS, "prompt_template")
    try:
        if not form["agent_id"]:
            raise BadRequest("agent_id: choose the agent to run")
        body = trigger_body(form)
        reach_agent(body.get("agent_id"))
        trigger = kernel().triggers.create(body, key_id=principal().key_id)
    except AgentdError as exc:
        return _triggers_page(exc.status, exc.message, form)
    return see_other_with("pages.triggers", [f"trigger created for {_agent_names().get(trigger['agent_id'])}"],
                          _anchor=f"trigger-{trigger['id']}")


@bp.route("/triggers/<trigger_id>/<action>", methods=["GET", "POST"])
def trigger_action(trigger_id: str, action: str):
    """enable (also resumes a paused trigger), disable or delete (once confirmed), as the JSON API does."""
    service = kernel().triggers
    try:
        trigger = service.get(trigger_id)  # (an unknown one: its 404 above the list)
        if action == "delete":
            asked = ask_first(f"Delete this trigger of {_agent_names().get(trigger['agent_id'])}?",
                              "It stops firing, with its counters. This cannot be undone.", "Delete the trigger",
                              url_for("pages.triggers", _anchor=f"trigger-{trigger_id}"))
            if asked is not None:
                return asked
            service.delete(trigger_id)
        elif action not in ("enable", "disable"):
            return _triggers_page(404, f"unknown action {action!r}")
        elif request.method != "POST":
            return see_other("pages.triggers")
        else:
            service.update(trigger_id, {"enabled": action == "enable"})
    except AgentdError as exc:
        return _triggers_page(exc.status, exc.message)
    done = {"delete": "deleted", "enable": "enabled", "disable": "disabled"}[action]
    return see_other_with("pages.triggers", [f"trigger {done}"])


TASKS_SHOWN = 30  # tasks a page of /tasks (the 60 KB page budget)


def _tasks_page(status: int = 200, error: str = "", form: dict | None = None):
    wanted = request.args.get("status") or None
    try:
        tasks = reachable(kernel().tasks.list(status=wanted), *TASK_AGENTS)
    except AgentdError as exc:
        tasks, status, error = [], exc.status, exc.message
    paged = page_of(list(reversed(tasks)), TASKS_SHOWN)
    return render_template("tasks.html", tasks=paged["items"], paged=paged, names=_agent_names(), wanted=wanted,
                           error=error, form=form or {}), status


@bp.get("/tasks")
def tasks():
    return _tasks_page()


@bp.post("/tasks")
def task_post():
    """Post a task as POST /api/tasks does; a refusal comes back above the form, with what was typed."""
    form = typed(("title", "assigned_to"), "description")
    try:
        reach_agent(form["assigned_to"], lambda name: NotFound(f"no agent with id or name {name!r}"))
        task = kernel().tasks.post(form["title"], form["description"], form["assigned_to"] or None)
    except AgentdError as exc:
        return _tasks_page(exc.status, exc.message, form)
    return see_other_with("pages.tasks", [f"task {task['title']} posted"], _anchor=f"task-{task['id']}")


@bp.route("/tasks/<task_id>/delete", methods=["GET", "POST"])
def task_delete(task_id: str):
    try:
        task = kernel().tasks.get(task_id)
        asked = ask_first(f"Delete task {task['title']}?", "It leaves the board, with its result. This cannot be "
                          "undone.", "Delete the task", url_for("pages.tasks", _anchor=f"task-{task_id}"))
        if asked is not None:
            return asked
        kernel().tasks.delete(task_id)
    except AgentdError as exc:
        return _tasks_page(exc.status, exc.message)
    return see_other_with("pages.tasks", [f"task {task['title']} deleted"])
