"""Channels (spec "Channels" table) and the audit trail."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, render_template, request

from agentd.api import body
from agentd.api.routes_system import kernel
from agentd.errors import BadRequest

bp = Blueprint("channels", __name__)


@bp.get("/api/channels")
def list_channels():
    return jsonify(kernel().channels.list())


@bp.post("/api/channels/reload")
def reload_channels():
    return jsonify(kernel().channels.reload())


@bp.post("/api/channels/<name>/configure")
def configure(name: str):
    return jsonify(kernel().channels.configure(name, body.json_body()))


@bp.delete("/api/channels/<name>/configure")
def remove(name: str):
    return jsonify(kernel().channels.remove(name))


@bp.post("/api/channels/<name>/test")
def test(name: str):
    data = body.json_body(allow_empty=True) or {}
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    message = data.get("message", "Test message from agentd")
    target = data.get("chat_id") or data.get("channel_id") or data.get("target") or ""
    if not isinstance(message, str) or not message.strip():
        raise BadRequest("message: must be a non-empty string")
    if not isinstance(target, str):
        raise BadRequest("chat_id: must be a string")
    return jsonify(kernel().channels.test(name, message, target))


@bp.post("/api/channels/<name>/qr/start")
def qr_start(name: str):
    k = kernel()
    k.qr_logins.check_channel(name, name in k.channels.catalog.names())
    return jsonify(k.qr_logins.start())


@bp.get("/api/channels/<name>/qr/status")
def qr_status(name: str):
    k = kernel()
    k.qr_logins.check_channel(name, name in k.channels.catalog.names())
    return jsonify(k.qr_logins.status(request.args.get("session_id", "")))


@bp.get("/api/audit/recent")
def audit_recent():
    raw = request.args.get("limit", "50")
    try:
        limit = int(raw)
    except ValueError:
        raise BadRequest(f"limit: must be an integer, got {raw!r}") from None
    if limit < 1:
        raise BadRequest("limit: must be at least 1")
    return jsonify(kernel().audit.recent(limit, request.args.get("event", "")))


@bp.get("/channels")
def channels_page():
    """Dashboard page: every adapter's state and the recent channel audit events."""
    k = kernel()
    response = current_app.make_response(render_template(
        "channels.html", channels=k.channels.list(), events=k.audit.recent(50, "channel.")))
    response.headers["Content-Security-Policy"] = "default-src 'self'; frame-ancestors 'none'"
    return response
