"""Responses of the MCP routes."""

from __future__ import annotations

from marshmallow import fields as ma

from agentd.api.schemas_out.base import Int, Out, Str, reply, req, status


class McpToolSchema(Out):
    name = Str()
    description = Str()
    input_schema = req(ma.Dict())
    agent_tool = Str()


class McpServerInfoSchema(Out):
    name = Str()
    version = Str()


class McpServerSchema(Out):
    name = Str()
    transport = status("stdio", "streamable_http")
    state = status("starting", "ready", "failed", "stopped")
    protocol_version = req(ma.String(allow_none=True))
    server_info = req(ma.Nested(McpServerInfoSchema, allow_none=True))
    last_error = req(ma.String(allow_none=True))
    restarts = Int()
    tools = req(ma.List(ma.Nested(McpToolSchema)))


McpReloadedSchema = reply("McpReloadedSchema", "reloaded", added=req(ma.List(ma.String())),
                          removed=req(ma.List(ma.String())), restarted=req(ma.List(ma.String())))
