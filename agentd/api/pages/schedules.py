"""Schedules: the cron jobs (next due time in the viewer's zone, last result, caps), a form
to add one, enable, disable, run now and delete, one job's run history; the triggers' list
is included (templates/_triggers_table.html)."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

from flask import make_response, render_template, request, url_for

from agentd.api.pages import bp, form_post, kernel
from agentd.api.pages.confirm import ask_first
from agentd.api.principal import principal, reachable, reachable_jobs, reachable_workflows
from agentd.api.pages.notes import see_other_with
from agentd.api.pages.schedule_form import FIELDS, job_body, typed
from agentd.errors import AgentdError
from agentd.schedules.spec import find_zone

RUNS_SHOWN = 50
JOBS_SHOWN = 20      # jobs a page of /schedules (the 60 KB page budget)
TRIGGERS_SHOWN = 10  # triggers on /schedules; /triggers pages through them all
TZ_COOKIE = "agentd_tz"


def _zone() -> tuple[str, ZoneInfo, str]:
    """The viewer's zone: `?tz=` (remembered in a cookie), else the cookie, else UTC; and
    what to tell the viewer when the zone asked for is not one."""
    name = request.args.get("tz") or request.cookies.get(TZ_COOKIE) or "UTC"
    zone = find_zone(name)
    if zone is None:
        return "UTC", ZoneInfo("UTC"), f"unknown time zone {name!r}: times are shown in UTC"
    return name, zone, ""


@bp.app_template_filter("in_zone")
def _in_zone(value: str | None, zone: ZoneInfo) -> str:
    """An ISO 8601 UTC time as `YYYY-MM-DD HH:MM:SS` in `zone`."""
    if not value:
        return ""
    when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    try:
        return when.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S")
    except OverflowError:
        # The last hours of year 9999 (UTC) have no wall time in a zone east of UTC.
        return when.strftime("%Y-%m-%d %H:%M:%S") + " UTC"


def _render(template: str, status: int = 200, **values):  # type: ignore[no-untyped-def]
    name, zone, zone_error = _zone()
    response = make_response(render_template(template, tz_name=name, zone=zone, zone_error=zone_error, **values),
                             status)
    if request.args.get("tz") and not zone_error:
        response.set_cookie(TZ_COOKIE, name, max_age=365 * 86400, samesite="Lax", httponly=True)
    return response


def page_of(items: list, size: int) -> dict:
    """One page of `items` (`?page=N`; past the end: the last page) and where it is."""
    pages = max(1, -(-len(items) // size))
    try:
        number = min(max(1, int(request.args.get("page") or 1)), pages)
    except ValueError:
        number = 1
    first = (number - 1) * size
    return {"items": items[first:first + size], "page": number, "pages": pages, "first": first,
            "total": len(items)}


def _due(job: dict) -> str:
    due = job["next_run_at"]
    return f"{due[:19].replace('T', ' ')} UTC" if due else "none"


def _schedules_page(status: int = 200, error: str = "", form: dict | None = None):  # type: ignore[no-untyped-def]
    k = kernel()
    names = {h.id: h.name for h in principal().visible(k.agents.handles())}
    jobs = page_of(reachable_jobs(k.cron.list()), JOBS_SHOWN)
    triggers = reachable(k.triggers.list())
    return _render("schedules.html", status, jobs=jobs, agents=names, error=error,
                   triggers=triggers[:TRIGGERS_SHOWN], triggers_total=len(triggers), names=names,
                   workflows=reachable_workflows(k.workflows.list()), form=form or {"one_shot": ""})


def _workflow_ref(typed_ref: str) -> str:
    """The id of the workflow typed by name (the form's box past 100 workflows), else as typed."""
    named = [w["id"] for w in reachable_workflows(kernel().workflows.list()) if w["name"] == typed_ref]
    return named[0] if len(named) == 1 else typed_ref


@bp.get("/schedules")
def schedules():
    return _schedules_page()


@bp.post("/schedules")
def schedule_create():
    """Create a job as POST /api/cron/jobs does; a refusal comes back above the form, with
    what was typed."""
    form = typed(FIELDS, "message")
    form["one_shot"] = "on" if request.form.get("one_shot") else ""
    try:
        body = job_body({**form, "workflow_id": _workflow_ref(form["workflow_id"])}, bool(form["one_shot"]))
        job = kernel().cron.create(body, by=principal())
    except AgentdError as exc:
        return _schedules_page(exc.status, exc.message, form)
    return see_other_with("pages.schedule_page", [f"cron job {job['name']} created; next run {_due(job)}"],
                          job_id=job["id"])


def _job_page(job_id: str, status: int = 200, error: str = "", form: dict | None = None):  # type: ignore[no-untyped-def]
    k = kernel()
    job = k.cron.get(job_id)
    handle = k.agents.find(job["agent_id"]) if job["agent_id"] else None
    return _render("schedule.html", status, job=job, agent=handle, runs=k.cron.runs(job_id, RUNS_SHOWN),
                   agents={h.id: h.name for h in principal().visible(k.agents.handles())},
                   workflows=reachable_workflows(k.workflows.list()), error=error,
                   form=form or _job_form(job, handle.name if handle else ""))


def _job_form(job: dict, agent_name: str) -> dict[str, str]:
    """The job as the form's fields, to edit it."""
    schedule, action, delivery = job["schedule"], job["action"], job["delivery"]
    form = {"name": job["name"], "agent_id": agent_name, "kind": schedule["kind"],
            "expr": schedule.get("expr", ""), "tz": schedule.get("tz", ""),
            "every_secs": str(schedule.get("every_secs", "")), "at": schedule.get("at", ""),
            "message": action.get("message", ""), "workflow_id": action.get("workflow_id", ""),
            "input": action.get("input", ""), "delivery": delivery["kind"], "channel": delivery.get("channel", ""),
            "chat_id": delivery.get("chat_id") or "", "url": delivery.get("url", ""),
            "secret_env": delivery.get("secret_env", ""), "catch_up": job["catch_up"],
            "one_shot": "on" if job["one_shot"] else ""}
    for key in ("max_runs_per_day", "max_cost_usd_per_day"):
        form[key] = "" if job[key] is None else f"{job[key]:g}"
    return form


@bp.get("/schedules/<job_id>")
def schedule_page(job_id: str):
    return _job_page(job_id)


@form_post("/schedules/<job_id>/edit", "pages.schedule_page", keeps=("message",))
def schedule_edit(job_id: str):
    """Change the job as PATCH /api/cron/jobs/{id} does, from the same form as a new job's; an
    emptied cap or agent is removed. A refusal comes back above the form, with what was typed."""
    k = kernel()
    k.cron.get(job_id)  # unknown: the ordinary 404 page
    form = typed(FIELDS, "message")
    form["one_shot"] = "on" if request.form.get("one_shot") else ""
    try:
        body = job_body({**form, "workflow_id": _workflow_ref(form["workflow_id"])}, bool(form["one_shot"]))
        body.setdefault("agent_id", None)
        body.setdefault("delivery", {"kind": "none"})
        for key in ("max_runs_per_day", "max_cost_usd_per_day"):
            body.setdefault(key, None)
        job = k.cron.update(job_id, body, by=principal())
    except AgentdError as exc:
        if exc.status == 404:
            raise
        return _job_page(job_id, exc.status, exc.message, form)
    return see_other_with("pages.schedule_page", [f"cron job {job['name']} saved; next run {_due(job)}"],
                          job_id=job_id)


def _act(job_id: str, action, done) -> object:  # type: ignore[no-untyped-def]
    """Run `action` on the job, then 303 back to the page the button was on, saying what
    happened (`done(result)`) or why nothing did."""
    name = kernel().cron.get(job_id)["name"]  # unknown: the ordinary 404 page
    back = {"endpoint": "pages.schedule_page", "job_id": job_id} if request.form.get("back") == "job" \
        else {"endpoint": "pages.schedules"}
    try:
        result = action()
    except AgentdError as exc:
        if exc.status == 404:
            raise
        return see_other_with(back.pop("endpoint"), [f"cron job {name}: {exc.message}"], ok=False, **back)
    return see_other_with(back.pop("endpoint"), [f"cron job {name} {done(result)}"], **back)


@form_post("/schedules/<job_id>/enable", "pages.schedule_page")
def schedule_enable(job_id: str):
    return _act(job_id, lambda: kernel().cron.update(job_id, {"enabled": True}, by=principal()),
                lambda job: f"resumed; next run {_due(job)}")


@form_post("/schedules/<job_id>/disable", "pages.schedule_page")
def schedule_disable(job_id: str):
    return _act(job_id, lambda: kernel().cron.update(job_id, {"enabled": False}, by=principal()),
                lambda job: "paused; nothing fires until it is enabled again")


@form_post("/schedules/<job_id>/run", "pages.schedule_page")
def schedule_run(job_id: str):
    k = kernel()
    return _act(job_id, lambda: k.scheduler.run_now(k.cron.get_raw(job_id)),
                lambda run: "started; its result shows in the history")


@bp.route("/schedules/<job_id>/delete", methods=["GET", "POST"])
def schedule_delete(job_id: str):
    name = kernel().cron.get(job_id)["name"]
    asked = ask_first(f"Delete cron job {name}?", "The job stops firing and its run history goes with it. "
                      "This cannot be undone.", f"Delete {name}", url_for("pages.schedule_page", job_id=job_id))
    if asked is not None:
        return asked
    kernel().cron.delete(job_id, by=principal())
    return see_other_with("pages.schedules", [f"cron job {name} deleted, with its history"])
