"""Responses of the A2A routes (agent cards) and the JSON-RPC 2.0 envelopes that /a2a
and /mcp exchange. A JSON-RPC body is documented as its envelope: what the methods take and
answer is the protocol's (docs/a2a.md, docs/mcp.md)."""

from __future__ import annotations

from typing import Any

from marshmallow import fields as ma

from agentd.api.schemas_out.base import Bool, Out, Str, req

__all__ = ["AgentCardSchema", "JSONRPC_REQUEST", "JSONRPC_RESPONSE", "JSONRPC_ERROR", "JSONRPC_EVENT",
           "JSONRPC_COMPONENTS"]

_ID: dict[str, Any] = {"type": ["string", "integer", "null"],
                       "description": "The request's id (null where it could not be read)"}

_REQUEST: dict[str, Any] = {
    "type": "object", "description": "A JSON-RPC 2.0 request (a notification has no `id`)",
    "properties": {"jsonrpc": {"type": "string", "enum": ["2.0"]},
                   "id": {"description": "A string or an integer. (MCP takes a message whose id is "
                                         "anything else as a notification: 202, no answer.)"},
                   "method": {"type": "string"},
                   "params": {"type": ["object", "null"], "description": "null is read as no params"}},
    "required": ["jsonrpc", "method"]}

_ERROR_OBJECT: dict[str, Any] = {
    "type": "object", "properties": {"code": {"type": "integer"}, "message": {"type": "string"}, "data": {}},
    "required": ["code", "message"]}

_RESPONSE: dict[str, Any] = {
    "type": "object", "description": "A JSON-RPC 2.0 response: a `result`, or an `error` with its code",
    "properties": {"jsonrpc": {"type": "string", "enum": ["2.0"]}, "id": _ID, "result": {}, "error": _ERROR_OBJECT},
    "required": ["jsonrpc", "id"]}

_ERROR: dict[str, Any] = {
    "type": "object", "description": "A JSON-RPC 2.0 error response",
    "properties": {"jsonrpc": {"type": "string", "enum": ["2.0"]}, "id": _ID, "error": _ERROR_OBJECT},
    "required": ["jsonrpc", "id", "error"]}

_EVENT: dict[str, Any] = {
    "type": "object", "description": "One Server-Sent Event whose `data` is a JSON-RPC message",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}, "id": {"type": "string"},
                   "retry": {"type": "integer"}},
    "required": ["data"]}

# Named in the document's components: tools that infer links between operations (schemathesis)
# name a resource after an inline schema's path, and would read the `id` of an answer of
# POST /a2a/agents/{name} as an agent's id.
JSONRPC_COMPONENTS: dict[str, dict[str, Any]] = {
    "JsonRpcRequest": _REQUEST, "JsonRpcResponse": _RESPONSE, "JsonRpcError": _ERROR, "JsonRpcEvent": _EVENT}
JSONRPC_REQUEST = {"$ref": "#/components/schemas/JsonRpcRequest"}
JSONRPC_RESPONSE = {"$ref": "#/components/schemas/JsonRpcResponse"}
JSONRPC_ERROR = {"$ref": "#/components/schemas/JsonRpcError"}
JSONRPC_EVENT = {"$ref": "#/components/schemas/JsonRpcEvent"}


def _strings() -> ma.Field:
    return req(ma.List(ma.String()))


class AgentSkillSchema(Out):
    id = Str()
    name = Str()
    description = Str()
    tags = _strings()
    inputModes = _strings()  # noqa: N815 - the A2A field names
    outputModes = _strings()  # noqa: N815


class AgentInterfaceSchema(Out):
    url = Str()
    protocolBinding = Str()  # noqa: N815
    protocolVersion = Str()  # noqa: N815


class AgentCapabilitiesSchema(Out):
    streaming = Bool()
    pushNotifications = Bool()  # noqa: N815


class AgentProviderSchema(Out):
    organization = Str()
    url = Str()


class AgentCardSchema(Out):
    name = Str()
    description = Str()
    url = Str(metadata={"description": "The JSON-RPC endpoint"})
    version = Str()
    protocolVersion = Str()  # noqa: N815
    preferredTransport = Str()  # noqa: N815
    supportedInterfaces = req(ma.List(ma.Nested(AgentInterfaceSchema)))  # noqa: N815
    provider = req(ma.Nested(AgentProviderSchema))
    capabilities = req(ma.Nested(AgentCapabilitiesSchema))
    defaultInputModes = _strings()  # noqa: N815
    defaultOutputModes = _strings()  # noqa: N815
    skills = req(ma.List(ma.Nested(AgentSkillSchema)))
    securitySchemes = ma.Dict(metadata={"description": "With an API key: how to present it (A2A 0.3 and 1.0 "  # noqa: N815
                                                       "fields in one scheme)"})
    security = ma.List(ma.Dict(), metadata={"description": "A2A 0.3's requirement"})
    securityRequirements = ma.List(ma.Dict(), metadata={"description": "A2A 1.0's requirement"})  # noqa: N815
