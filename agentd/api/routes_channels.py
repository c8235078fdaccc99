"""Channels (spec "Channels" table) and the audit trail (the /channels page is in api/pages/)."""

from __future__ import annotations

import re
from datetime import datetime

from flask import Blueprint, jsonify, request
from marshmallow import ValidationError

from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api.schemas import AuditQuery, ChannelTestBodySchema, QrStatusQuery
from agentd.api import body
from agentd.api.channel_reach import hide_unreached_item, reach_channel
from agentd.api.principal import principal
from agentd.api.routes_system import kernel
from agentd.errors import BadRequest

RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,6})?([Zz]|[+-]\d{2}:\d{2})\Z")

bp = Blueprint("channels", __name__)


@bp.get("/api/channels")
@doc("The channel adapters and their state", tags="channels", response={"type": "array", "items": out.ChannelSchema})
def list_channels():
    items = kernel().channels.list()
    for item in items:
        hide_unreached_item(item)
    return jsonify(items)



@bp.post("/api/channels/reload")
@doc("Re-read [channels] from config.toml and restart adapters", tags="channels",
     response=out.ChannelsReloadedSchema, errors={400: "config.toml cannot be read or [channels] is not a table"})
def reload_channels():
    return jsonify(kernel().channels.reload())


@bp.post("/api/channels/<name>/configure")
@doc("Configure an adapter (written to config.toml, started at once)", tags="channels",
     body={"type": "object", "additionalProperties": True,
           "description": "The adapter's keys (see its `fields`): `default_agent`, `allowed_users`, "
                          "`allowed_channels` and adapter-specific ones; `*_env` keys name environment "
                          "variables, never secrets (for a scoped key, only the key's default or one starting "
                          "with the adapter's name in capitals). Optional `secrets`: an object of `{\"<key>_env\": "
                          "\"<secret value>\"}` written to secrets.env (mode 0600) and the daemon's "
                          "environment under the key's variable (its default, or one starting with the "
                          "adapter's name in capitals), never to config.toml and never echoed"},
     response=out.ChannelConfiguredSchema, errors={400: "Unknown key, a key or override agentd does not implement, wrong type, a secret given as a "
                                                     "`*_env` value, a scoped key's `*_env` naming a variable outside the adapter's own (its default or "
                                                     "`<ADAPTER>_...`), a `secrets` entry that is not a secret key, or "
                                                     "no `default_agent` from a key limited to some agents",
                                                404: "Unknown channel, or (a key limited to some agents) one that "
                                                     "names or answers as an agent outside the key's list"})
def configure(name: str):
    data = body.json_body()
    reach_channel(name, data)
    return jsonify(kernel().channels.configure(name, data, key_id=principal().key_id))


@bp.delete("/api/channels/<name>/configure")
@doc("Remove an adapter's configuration and stop it", tags="channels", response=out.ChannelRemovedSchema,
     errors={404: "Unknown channel, or (a key limited to some agents) one that answers as an agent outside "
                  "the key's list"})
def remove(name: str):
    reach_channel(name)
    return jsonify(kernel().channels.remove(name))


@bp.post("/api/channels/<name>/test")
@doc("Send a test message through a configured adapter", tags="channels", body_required=False,
     body=ChannelTestBodySchema,
     response=out.ChannelTestSchema,
     errors={400: "The channel is not configured",
             404: "Unknown channel, or (a key limited to some agents) one that answers as an agent outside "
                  "the key's list",
             502: "The platform did not take the message"})
def test(name: str):
    reach_channel(name)
    data = body.load(ChannelTestBodySchema(), allow_empty=True)
    message = data["message"]
    target = data.get("chat_id") or data.get("channel_id") or data.get("target") or ""
    return jsonify(kernel().channels.test(name, message, target))




@bp.post("/api/channels/<name>/qr/start")
@doc("Start a QR login (WhatsApp Web gateway)", tags="channels", response=out.QrStartSchema,
     errors={400: "This channel has no QR login", 502: "The gateway failed",
             503: "No gateway configured"})
def qr_start(name: str):
    k = kernel()
    k.qr_logins.check_channel(name, name in k.channels.catalog.names())
    return jsonify(k.qr_logins.start())


@bp.get("/api/channels/<name>/qr/status")
@doc("State of a QR login", tags="channels", query=QrStatusQuery, response=out.QrStatusSchema,
     errors={400: "No session_id, or this channel has no QR login", 404: "Unknown channel or session",
             502: "The gateway failed", 503: "No gateway configured"})
def qr_status(name: str):
    k = kernel()
    k.qr_logins.check_channel(name, name in k.channels.catalog.names())
    try:
        args = QrStatusQuery().load(request.args)
    except ValidationError as exc:
        raise BadRequest(f"invalid query: {body.format_validation(exc.messages)}") from None
    return jsonify(k.qr_logins.status(args["session_id"]))


@bp.get("/api/audit/recent")
@doc("Recent audit events, newest first", tags="system", query=AuditQuery,
     response={"type": "array", "items": out.AuditEventSchema},
     errors={400: "A limit below 1 or not a number, or a time that is not ISO 8601"})
def audit_recent():
    raw = request.args.get("limit", "50")
    try:
        limit = int(raw)
    except ValueError:
        raise BadRequest(f"limit: must be an integer, got {raw!r}") from None
    if limit < 1:
        raise BadRequest("limit: must be at least 1")
    return jsonify(kernel().audit.recent(limit, request.args.get("event", ""), request.args.get("subject", ""),
                                         audit_time("since"), audit_time("until")))


def audit_time(name: str) -> datetime | None:
    """The query's `since`/`until` as a datetime (None when absent); 400 unless it is an RFC 3339
    date-time, as the OpenAPI document says (an offset is required: `Z` for UTC)."""
    raw = request.args.get(name)
    if raw is None:
        return None
    try:
        if not RFC3339.match(raw):
            raise ValueError(raw)
        return datetime.fromisoformat(raw.upper())
    except ValueError:
        raise BadRequest(f"{name}: must be an RFC 3339 time such as 2026-01-31T09:00:00Z, got {raw!r}") from None
