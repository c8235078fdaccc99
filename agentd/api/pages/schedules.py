"""Schedules: the cron jobs (next due time in the viewer's zone, last result, caps), enable,
disable, run now and delete, one job's run history; the triggers' list is included when the
trigger engine provides its partial (templates/triggers_partial.html)."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flask import make_response, redirect, render_template, request, url_for

from agentd.api.pages import bp, kernel, see_other
from agentd.api.principal import principal, reachable
from agentd.errors import AgentdError

RUNS_SHOWN = 50
TZ_COOKIE = "agentd_tz"


def _zone() -> tuple[str, ZoneInfo]:
    """The viewer's zone: `?tz=` (remembered in a cookie), else the cookie, else UTC."""
    name = request.args.get("tz") or request.cookies.get(TZ_COOKIE) or "UTC"
    try:
        return name, ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return "UTC", ZoneInfo("UTC")


@bp.app_template_filter("in_zone")
def _in_zone(value: str | None, zone: ZoneInfo) -> str:
    """An ISO 8601 UTC time as `YYYY-MM-DD HH:MM:SS` in `zone`."""
    if not value:
        return ""
    when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S")


def _render(template: str, **values):  # type: ignore[no-untyped-def]
    name, zone = _zone()
    response = make_response(render_template(template, tz_name=name, zone=zone, **values))
    if request.args.get("tz"):
        response.set_cookie(TZ_COOKIE, name, max_age=365 * 86400, samesite="Lax", httponly=True)
    return response


@bp.get("/schedules")
def schedules():
    k = kernel()
    names = {h.id: h.name for h in principal().visible(k.agents.handles())}
    return _render("schedules.html", jobs=reachable(k.cron.list()), agents=names, error=request.args.get("error", ""),
                   triggers=reachable(k.triggers.list()), names=names)


@bp.get("/schedules/<job_id>")
def schedule_page(job_id: str):
    k = kernel()
    job = k.cron.get(job_id)
    handle = k.agents.find(job["agent_id"]) if job["agent_id"] else None
    return _render("schedule.html", job=job, agent=handle, runs=k.cron.runs(job_id, RUNS_SHOWN))


def _back(job_id: str):  # type: ignore[no-untyped-def]
    return see_other("pages.schedule_page", job_id=job_id) if request.form.get("back") == "job" \
        else see_other("pages.schedules")


def _act(job_id: str, action) -> object:  # type: ignore[no-untyped-def]
    try:
        action()
    except AgentdError as exc:
        if exc.status == 404:
            raise
        return redirect(url_for("pages.schedules", error=exc.message), code=303)
    return _back(job_id)


@bp.post("/schedules/<job_id>/enable")
def schedule_enable(job_id: str):
    return _act(job_id, lambda: kernel().cron.update(job_id, {"enabled": True}))


@bp.post("/schedules/<job_id>/disable")
def schedule_disable(job_id: str):
    return _act(job_id, lambda: kernel().cron.update(job_id, {"enabled": False}))


@bp.post("/schedules/<job_id>/run")
def schedule_run(job_id: str):
    k = kernel()
    return _act(job_id, lambda: k.scheduler.run_now(k.cron.get_raw(job_id)))


@bp.post("/schedules/<job_id>/delete")
def schedule_delete(job_id: str):
    kernel().cron.delete(job_id)
    return see_other("pages.schedules")
