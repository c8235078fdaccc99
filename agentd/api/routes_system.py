"""Health, version, status and shutdown."""

from __future__ import annotations

import time

from flask import Blueprint, current_app, jsonify, request

from agentd.api.sse import format_event, sse_response
from agentd.errors import BadRequest
from agentd.kernel import Kernel

bp = Blueprint("system", __name__)


def kernel() -> Kernel:
    """The kernel this app serves."""
    return current_app.extensions["agentd.kernel"]


@bp.get("/api/health")
def health():
    return jsonify({"status": "ok"})


@bp.get("/api/health/detail")
def health_detail():
    k = kernel()
    pool = current_app.extensions.get("agentd.pool_stats", lambda: {})()
    return jsonify(k.health_detail(pool))


@bp.get("/api/version")
def version():
    return jsonify(Kernel.version())


@bp.get("/api/status")
def status():
    return jsonify(kernel().status())


@bp.post("/api/shutdown")
def shutdown():
    kernel().request_shutdown()
    return jsonify({"status": "shutting_down"})


@bp.get("/api/_sse/ticks")
def sse_ticks():
    """Diagnostic stream: `n` tick events `interval` seconds apart (checks that
    events are delivered one by one through every proxy in between)."""
    try:
        count = min(int(request.args.get("n", 3)), 100)
        interval = min(float(request.args.get("interval", 0.5)), 10.0)
    except ValueError:
        raise BadRequest("n must be an integer and interval a number") from None

    def ticks():
        for i in range(count):
            if i:
                time.sleep(interval)
            yield format_event("tick", {"n": i, "sent_at": time.time()})
        yield format_event("done", {"done": True})

    return sse_response(ticks())
