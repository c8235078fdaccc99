"""Several daemons on one database: GET /api/cluster, GET /api/cluster/runs, stream routing.

Every response names the daemon that answered (`X-Agentd-Daemon`, added with the common
headers as the answer leaves: agentd/api/response_headers.py), so a proxy's routing can be
checked. A stream request (SSE message stream, agent WebSocket) for an agent
whose run is in flight on another daemon is answered 409 before anything starts: the
events of a run exist only on the daemon running it, so stream paths must be routed
by agent id (docs/nginx-cluster.conf).
"""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, request
from marshmallow import Schema, fields, validate

from agentd.api import body
from agentd.api.apidoc import doc
from agentd.api.principal import reachable
from agentd.api.routes_system import kernel
from agentd.errors import BadRequest
from agentd.store.leases import RUN_STATUSES

bp = Blueprint("cluster", __name__)

STREAM_ENDPOINTS = ("stream.message_stream", "sockets.agent_socket")

_DAEMON = {"type": "object", "properties": {
    "id": {"type": "string"}, "listen": {"type": "string"}, "url": {"type": "string"}, "pid": {"type": "integer"},
    "started_at": {"type": "string"}, "heartbeat_at": {"type": "string"}, "self": {"type": "boolean"}}}
CLUSTER_SCHEMA = {"type": "object", "required": ["daemon_id", "shared_database", "lease_secs", "daemons"],
                  "properties": {"daemon_id": {"type": "string"}, "shared_database": {"type": "boolean"},
                                 "lease_secs": {"type": "number"}, "runs_here": {"type": "integer"},
                                 "leases_held": {"type": "array", "items": {"type": "string"}},
                                 "daemons": {"type": "array", "items": _DAEMON},
                                 "channel_leaders": {"type": "object",
                                                     "additionalProperties": {"type": ["string", "null"]}}}}
_RUN = {"type": "object", "required": ["id", "agent_id", "daemon_id", "status", "started_at"], "properties": {
    "id": {"type": "string"}, "agent_id": {"type": "string"}, "session_id": {"type": "string"},
    "daemon_id": {"type": "string"}, "status": {"type": "string", "enum": list(RUN_STATUSES)},
    "started_at": {"type": "string"}, "ended_at": {"type": ["string", "null"]},
    "error": {"type": ["string", "null"]}, "cost_usd": {"type": ["number", "null"]}}}


class RunsQuery(Schema):
    agent_id = fields.String(load_default=None, validate=validate.Length(max=100))
    status = fields.String(load_default=None, validate=validate.OneOf(RUN_STATUSES))
    limit = fields.Integer(load_default=100, validate=validate.Range(1, 1000))


@bp.get("/api/cluster")
@doc("This daemon and the other live daemons on the same database", tags="system", response=CLUSTER_SCHEMA)
def cluster():
    k = kernel()
    data = k.cluster.status()
    data["channel_leaders"] = k.channel_leaders.view()
    return jsonify(data)


@bp.get("/api/cluster/runs")
@doc("Agent runs of every daemon, newest first (`running`, `completed`, `failed`, `cancelled`)",
     tags="system", query=RunsQuery, response={"type": "array", "items": _RUN})
def cluster_runs():
    args = body.validate(RunsQuery(), request.args.to_dict())
    return jsonify(reachable(kernel().cluster.list_runs(args["agent_id"], args["status"], args["limit"])))


@bp.before_app_request
def _route_streams() -> None:
    """A stream for an agent running on another daemon: 409 naming that daemon."""
    req = request._get_current_object()  # (every request asks)
    if req.endpoint not in STREAM_ENDPOINTS or not req.view_args:
        return
    k = current_app.extensions["agentd.kernel"]
    try:
        handle = k.agents.get(req.view_args["agent_id"])
    except BadRequest:
        return  # not an id: the route's own lookup answers (with a hint when it is a name)
    k.cluster.check_stream(handle)
