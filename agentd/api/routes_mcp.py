"""MCP: the servers agents use (/api/mcp/*) and agentd's own MCP endpoint (/mcp)."""

from __future__ import annotations

from flask import Blueprint, jsonify, request

from agentd.api import schemas_out as out
from agentd.api.body import UnsupportedMediaType
from agentd.api.apidoc import doc
from agentd.api.principal import principal
from agentd.api.routes_system import kernel
from agentd.errors import BadRequest, ConfigError, PayloadTooLarge
from agentd.mcp.endpoint import KEY_HEADER, MAX_BODY_BYTES

bp = Blueprint("mcp", __name__)


@bp.get("/api/mcp/servers")
@doc("The configured MCP servers: state, protocol version, last error and tools", tags="mcp",
     response={"type": "array", "items": out.McpServerSchema})
def list_servers():
    return jsonify(kernel().mcp.servers())


@bp.post("/api/mcp/reload")
@doc("Re-read [[mcp_servers]] from config.toml: start new servers, stop removed ones, restart changed ones",
     tags="mcp", body_required=False, response=out.McpReloadedSchema,
     errors={400: "config.toml cannot be read or [[mcp_servers]] is invalid"})
def reload_servers():
    try:
        changes = kernel().mcp_watch.reload_now()
    except ConfigError as exc:
        raise BadRequest(exc.message) from None
    return jsonify({"status": "reloaded", **changes})


MCP_TEXT = ("MCP's Streamable HTTP transport, stateless: each JSON-RPC message is POSTed on its own "
            "(`initialize`, `tools/list`, `tools/call` of `list_agents`, `message_agent`, "
            "`recall_memory`, ...). A request is answered as Server-Sent Events whose `data` are JSON-RPC "
            "messages (progress notifications, then the response), or as one JSON-RPC response; a "
            "notification or a response is accepted with 202. The client must accept both "
            "`application/json` and `text/event-stream`. With `MCP-Protocol-Version` naming a revision "
            "after 2025-11-25, protocol errors come with the HTTP status of their code (400, or 404 for "
            "an unknown method).")
RPC_REFUSED = "The message is not a JSON-RPC message the transport takes (a JSON-RPC error)"


# No GET or DELETE: the transport is stateless, so a server-initiated stream would never
# carry a message and would hold a server thread for as long as the client keeps it open,
# and there is no session to end; the protocol lets a server answer 405 to both.
@bp.post("/mcp")
@doc("agentd's agents as MCP tools (Model Context Protocol, Streamable HTTP)", tags="mcp",
     description=MCP_TEXT, body=out.JSONRPC_REQUEST, response=out.JSONRPC_RESPONSE, sse_alt=out.JSONRPC_EVENT,
     replies={202: ("A notification or response was accepted (no body)", None),
              400: (RPC_REFUSED, out.JSONRPC_ERROR),
              404: ("Unknown method (a JSON-RPC error, with a revision after 2025-11-25)", out.JSONRPC_ERROR),
              406: ("The client does not accept both application/json and text/event-stream (a JSON-RPC "
                    "error; empty with a revision after 2025-11-25)", out.JSONRPC_ERROR)},
     errors={501: "The `mcp` extra is not installed"})
def mcp_endpoint():
    if request.mimetype != "application/json":
        raise UnsupportedMediaType(f"Content-Type must be application/json (got {request.content_type or 'none'})")
    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"request body too large: {request.content_length} bytes (limit {MAX_BODY_BYTES})")
    # The guard (Host, Origin) and the API key check have run; the SDK's transport answers
    # (Flask runs a returned WSGI app and streams what it writes). Its tools act as this
    # request's key, named in a header set here, over whatever the client sent.
    request.environ[KEY_HEADER] = principal().key_id
    return kernel().mcp_endpoint
