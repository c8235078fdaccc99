"""`/`: the overview, and the favicon."""

from __future__ import annotations

from collections import Counter

from flask import current_app, render_template

from agentd.api.pages import bp, kernel
from agentd.api.pages.channels import channel_rows


@bp.get("/")
def index():
    k = kernel()
    status = k.status()
    pool = current_app.extensions.get("agentd.pool_stats", lambda: {})()
    states = Counter(a["state"] for a in status["agents"])
    channels, _live = channel_rows(k)
    return render_template("overview.html", status=status, health=k.health_detail(pool),
                           states=sorted(states.items()), budget=k.metering.budget(),
                           approvals=k.approvals.pending(), runs=k.workflows.recent_runs(10),
                           channels=[c for c in channels if c.get("configured")],
                           channel_total=len(channels))


@bp.get("/favicon.ico")
def favicon():
    return current_app.send_static_file("favicon.svg")
