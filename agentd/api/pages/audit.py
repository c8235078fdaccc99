"""`/audit`: the audit trail with filters, over the call GET /api/audit/recent makes."""

from __future__ import annotations

from datetime import datetime, timezone

from flask import render_template, request

from agentd.api.pages import bp, kernel

SHOWN = 100  # events a page shows (the 60 KB page budget; the filters narrow it)
SUGGESTED = 100  # agent names offered in the filter's list


def _time(name: str) -> tuple[datetime | None, str]:
    """The filter's time (a `datetime-local` field, UTC), or None with what was wrong."""
    raw = (request.args.get(name) or "").strip()
    if not raw:
        return None, ""
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None, f"{name}: {raw!r} is not a time (YYYY-MM-DDTHH:MM)"
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)), ""


def _rfc3339(when: datetime | None) -> str | None:
    """`when` as GET /api/audit/recent takes it (None: no filter)."""
    return when.astimezone(timezone.utc).isoformat().replace("+00:00", "Z") if when else None


@bp.get("/audit")
def audit():
    k = kernel()
    agent = (request.args.get("agent") or "").strip()
    action = (request.args.get("action") or "").strip()
    since, since_error = _time("since")
    until, until_error = _time("until")
    events = k.audit.recent(SHOWN, action, agent, since, until)
    known = k.audit.recent(500)
    actions = sorted({e["event"].split(".", 1)[0] + "." for e in known})
    # The agents the trail names lately, not every agent: the page keeps to its weight.
    names = {h.name for h in k.agents.handles()}
    agents = sorted({e["subject"] for e in known if e["subject"] in names})[:SUGGESTED]
    return render_template("audit.html", events=events, agent=agent, action=action,
                           since=request.args.get("since", ""), until=request.args.get("until", ""),
                           since_utc=_rfc3339(since), until_utc=_rfc3339(until),
                           errors=[e for e in (since_error, until_error) if e], limit=SHOWN,
                           agents=agents, actions=actions)
