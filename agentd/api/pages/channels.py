"""`/channels`: the channel catalogue with configured/active state.

The channels runtime (kernel.channels) may be absent; the page then shows the
catalogue data file alone, every adapter unconfigured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flask import render_template, request

from agentd.api.pages import bp, kernel
from agentd.api.pages.channel_config import PROBLEMS
from agentd.api.principal import principal
from agentd.api.channel_reach import reaches_channel
from agentd.kernel import Kernel

CATALOGUE = Path(__file__).resolve().parents[2] / "data" / "channels.json"
_cache: dict[str, list[dict[str, Any]]] = {}
EVENTS_SHOWN = 50


def _catalogue() -> list[dict[str, Any]]:
    if "items" not in _cache:
        try:
            items = json.loads(CATALOGUE.read_bytes())   # JSON is UTF-8: json reads the bytes itself
        except (OSError, ValueError):
            items = []
        _cache["items"] = [dict(item, configured=False, active=False) for item in items
                           if isinstance(item, dict) and "name" in item]
    return _cache["items"]


def channel_rows(k: Kernel) -> tuple[list[dict[str, Any]], bool]:
    """Channel list items (the GET /api/channels shape) and whether the runtime supplied them."""
    runtime = getattr(k, "channels", None)
    for name in ("listing", "list_channels", "list"):
        method = getattr(runtime, name, None)
        if callable(method):
            try:
                return list(method()), True
            except TypeError:
                continue
    return _catalogue(), False


def _channel_events(k: Kernel) -> list[dict[str, Any]] | None:
    """Recent `channel.*` audit events (GET /api/audit/recent?event=channel.), when audited."""
    audit = getattr(k, "audit", None)
    return audit.recent(EVENTS_SHOWN, "channel.") if audit is not None else None


@bp.get("/channels")
def channels():
    k = kernel()
    rows, live = channel_rows(k)
    category = request.args.get("category") or ""
    categories = sorted({r.get("category", "") for r in rows if r.get("category")})
    shown = [r for r in rows if not category or r.get("category") == category]
    events = _channel_events(k)
    last_errors: dict[str, dict[str, Any]] = {}
    for event in events or []:  # newest first: the first problem seen per channel is its last
        if event["event"] in PROBLEMS and (not principal().agents or reaches_channel(event["subject"])):
            last_errors.setdefault(event["subject"], event)
    if events is not None and not principal().is_admin:
        events = None  # the audit trail is the admin's (GET /api/audit/recent, /audit)
    return render_template("channels.html", channels=shown, live=live, categories=categories,
                           category=category, configured=sum(1 for r in rows if r.get("configured")),
                           total=len(rows), events=events, last_errors=last_errors)
