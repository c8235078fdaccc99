"""Health, version, status and shutdown."""

from __future__ import annotations

import os
import time

from flask import Blueprint, current_app, jsonify, request
from marshmallow import ValidationError

from agentd.api import schemas_out as out
from agentd.api.body import format_validation
from agentd.api.apidoc import doc
from agentd.api.principal import principal
from agentd.api import body
from agentd.api.schemas import ShutdownQuery, TicksQuery
from agentd.api.sse import format_event, sse_response
from agentd import buildinfo
from agentd.errors import BadRequest, Conflict
from agentd.kernel import Kernel

bp = Blueprint("system", __name__)


def kernel() -> Kernel:
    """The kernel this app serves."""
    # (Asked several times a request: each attribute read through the proxy looks the app up.)
    return current_app._get_current_object().extensions["agentd.kernel"]


@bp.get("/api/health")
@doc("Liveness probe", public=True, response=out.HealthSchema, tags="system",
     description="`ok`, or `degraded` while the database cannot be reached (still 200: the "
                 "daemon itself is alive and recovers on its own).")
def health():
    return jsonify({"status": "ok" if kernel().store.available() else "degraded"})


@bp.get("/api/health/detail")
@doc("Health with database state and thread-pool use", response=out.HealthDetailSchema, tags="system")
def health_detail():
    k = kernel()
    pool = current_app.extensions.get("agentd.pool_stats", lambda: {})()
    return jsonify(k.health_detail(pool, principal().visible))


@bp.get("/api/version")
@doc("Name, version and build of the daemon", public=True, response=out.VersionSchema, tags="system")
def version():
    return jsonify(buildinfo.version())


@bp.get("/api/status")
@doc("Daemon status and its agents", response=out.StatusSchema, tags="system")
def status():
    return jsonify(kernel().status(principal().visible))


@bp.post("/api/shutdown")
@doc("Stop the daemon gracefully", response=out.StatusOnlySchema, tags="system", query=ShutdownQuery,
     errors={409: "`home` names another home than the one this daemon serves"},
     description="Answers `{status: shutting_down}`, then stops accepting connections, stops the runs "
                 "under way at once (recorded as stopped), gives in-flight requests `shutdown_grace_secs` "
                 "to answer that and exits.")
def shutdown():
    k = kernel()
    home = body.validate(ShutdownQuery(), request.args.to_dict()).get("home")
    if home is not None and os.path.realpath(home) != os.path.realpath(k.config.home):
        raise Conflict(f"this daemon serves another home: {k.config.home}")
    k.request_shutdown()
    return jsonify({"status": "shutting_down"})


@bp.get("/api/_sse/ticks")
@doc("Diagnostic SSE stream of tick events", query=TicksQuery, response=out.SSE,
     response_media="text/event-stream", tags="system",
     description="`n` events `tick` `{n, sent_at}` `interval` seconds apart, then `done` `{done: true}`. "
                 "Checks that a reverse proxy passes events through unbuffered.")
def sse_ticks():
    """Diagnostic stream: `n` tick events `interval` seconds apart (checks that
    events are delivered one by one through every proxy in between)."""
    try:
        args = TicksQuery().load(request.args)
    except ValidationError as exc:
        raise BadRequest(f"invalid query: {format_validation(exc.messages)}") from None
    count, interval = min(args["n"], 100), min(args["interval"], 10.0)

    def ticks():
        for i in range(count):
            if i:
                time.sleep(interval)
            yield format_event("tick", {"n": i, "sent_at": time.time()})
        yield format_event("done", {"done": True})

    return sse_response(ticks())
