"""Responses of the channel and audit routes."""

from __future__ import annotations

from marshmallow import fields as ma

from agentd.api.schemas_out.base import Bool, Int, Out, Str, reply, req, status


class ChannelFieldSchema(Out):
    key = Str()
    label = Str()
    type = status("secret", "text", "number", "list")
    env_var = Str()
    required = Bool()
    has_value = Bool()
    placeholder = Str()
    advanced = Bool()


class ChannelSchema(Out):
    name = Str()
    display_name = Str()
    icon = Str()
    description = Str()
    category = status("messaging", "social", "enterprise", "developer", "notifications")
    difficulty = Str()
    setup_time = Str()
    quick_setup = Str()
    setup_type = Str()
    configured = Bool()
    active = Bool()
    implemented = Bool()
    reason = ma.String()  # only when implemented is false: why the adapter cannot connect
    fields = req(ma.List(ma.Nested(ChannelFieldSchema)))
    setup_steps = req(ma.List(ma.String()))
    config_template = Str()
    error = ma.String()  # only while a configured adapter could not start: why
    key_id = ma.String(allow_none=True)  # the scoped API key its runs act as (null: the admin's)


ChannelConfiguredSchema = reply("ChannelConfiguredSchema", "configured", channel=Str(), activated=Bool(),
                                note=ma.String())
ChannelRemovedSchema = reply("ChannelRemovedSchema", "removed", channel=Str())
ChannelsReloadedSchema = reply("ChannelsReloadedSchema", "reloaded", channels_active=Int())
ChannelTestSchema = reply("ChannelTestSchema", "success", message=Str())


class QrStartSchema(Out):
    session_id = Str()
    status = status("waiting_for_scan", "connected")


class QrStatusSchema(Out):
    status = status("waiting_for_scan", "connected", "expired")
    qr_code = ma.String(metadata={"description": "data:image/png;base64,... while waiting"})
    expires_at = ma.String()
    phone_number = ma.String(metadata={"description": "once connected"})
    message = ma.String()


class AuditEventSchema(Out):
    id = req(ma.Raw())
    timestamp = Str()
    event = Str()
    subject = Str()
    detail = req(ma.Dict())
