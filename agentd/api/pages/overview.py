"""`/`: the overview, and the favicon."""

from __future__ import annotations

from collections import Counter

from flask import current_app, render_template

from agentd.api.pages import bp, kernel, see_other
from agentd.api.principal import principal, reachable, reachable_workflows
from agentd.api.pages.channels import channel_rows


@bp.get("/")
def index():
    k = kernel()
    if k.first_run.needed() and principal().is_admin:  # setting a provider up is the admin's
        return see_other("pages.setup")
    pool = current_app.extensions.get("agentd.pool_stats", lambda: {})()
    # GET /api/health/detail's figures; agent states counted from the handles (the full
    # /api/status body would build a summary of every agent only to count them).
    who = principal()
    health = k.health_detail(pool, who.visible)
    states = Counter(h.state for h in who.visible(k.agents.handles()))
    channels, _live = channel_rows(k)
    return render_template("overview.html", config=k.config, health=health,
                           states=sorted(states.items()), budget=k.metering.budget(),
                           approvals=reachable(k.approvals.pending()),
                           runs=reachable_workflows(k.workflows.recent_runs(10), "workflow_id"),
                           channels=[c for c in channels if c.get("configured")],
                           channel_total=len(channels))


@bp.get("/favicon.ico")
def favicon():
    return current_app.send_static_file("favicon.svg")
