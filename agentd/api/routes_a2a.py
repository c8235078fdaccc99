"""A2A: the agent cards and the JSON-RPC endpoints (agentd/a2a/, docs/a2a.md).

`POST /a2a` serves every agent (the message's `metadata.agent` names one); `POST
/a2a/agents/<name>` serves one. Both answer JSON-RPC 2.0: HTTP 200 with a `result` or an
`error`, or, for `message/stream`, an SSE stream of JSON-RPC responses.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from agentd import jsonsafe
from agentd.a2a import card as cards
from agentd.a2a.wire import INVALID_REQUEST, PARSE_ERROR, RpcError, error_response
from agentd.api import body
from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api.principal import ADMIN, Principal, current, principal
from agentd.api.runs import acquire_stream_slot, client_disconnected, stream_slots
from agentd.api.sse import comment, format_event, sse_response
from agentd.api.routes_system import kernel
from agentd.errors import AgentdError, NotFound, PayloadTooLarge

bp = Blueprint("a2a", __name__)

# A JSON-RPC message is small; its text is held to 64 KB like every message.
RPC_BODY_LIMIT = 256 * 1024


def _base() -> str:
    return request.host_url.rstrip("/")


def _keyed() -> bool:
    return bool(kernel().config.api_key)


def _card_response(card: dict[str, Any]) -> Response:
    response = jsonify(card)
    response.headers["Cache-Control"] = "no-cache"
    return response


def _reader() -> Principal:
    """Who reads a card: the cards are public, but a request that brings a key limited to
    some agents is shown only those, as in every other list."""
    try:
        return current(kernel().config) or ADMIN
    except AgentdError:
        return ADMIN  # a wrong key reads what a request without one reads


CARD_TEXT = ("Public, so a client learns from it how to authenticate; a request bringing a key limited "
             "to some agents is shown only those")


@bp.get(cards.CARD_PATH)
@doc("The daemon's A2A agent card: every agent as a skill, the endpoint /a2a", tags="a2a",
     description=CARD_TEXT, response=out.AgentCardSchema, public=True)
def daemon_card():
    handles = _reader().visible(kernel().agents.handles())
    return _card_response(cards.daemon_card(_base(), handles, _keyed()))


@bp.get(cards.LEGACY_CARD_PATH)
@doc("The daemon's A2A agent card at the path older clients read (the same card)", tags="a2a",
     description=CARD_TEXT, response=out.AgentCardSchema, public=True)
def daemon_card_legacy():
    return daemon_card()


def _handle(name: str, who: Principal | None = None) -> Any:
    handle = kernel().agents.by_name(name)
    if handle is None or not (who or principal()).sees(handle):
        raise NotFound(f"no agent named '{name}'")
    return handle


@bp.get("/a2a/agents")
@doc("Every agent's own A2A agent card", tags="a2a",
     response={"type": "array", "items": out.AgentCardSchema})
def agent_cards():
    """Every agent's own card (the daemon's card lists them as skills)."""
    base, keyed = _base(), _keyed()
    return jsonify([cards.agent_card(base, h, keyed) for h in principal().visible(kernel().agents.handles())])


AGENT_PARAM = {"name": {"description": "Agent name"}}


@bp.get("/a2a/agents/<name>" + cards.CARD_PATH)
@doc("One agent's A2A agent card; its endpoint is /a2a/agents/{name}", tags="a2a",
     description=CARD_TEXT, response=out.AgentCardSchema, public=True, path_params=AGENT_PARAM,
     errors={404: "No agent by that name"})
def agent_card(name: str):
    return _card_response(cards.agent_card(_base(), _handle(name, _reader()), _keyed()))


@bp.get("/a2a/agents/<name>" + cards.LEGACY_CARD_PATH)
@doc("One agent's A2A agent card at the path older clients read (the same card)", tags="a2a",
     description=CARD_TEXT, response=out.AgentCardSchema, public=True, path_params=AGENT_PARAM,
     errors={404: "No agent by that name"})
def agent_card_legacy(name: str):
    return agent_card(name)


RPC_TEXT = ("A2A over JSON-RPC 2.0: `message/send` (`SendMessage`), `message/stream` "
            "(`SendStreamingMessage`), `tasks/get` (`GetTask`), `tasks/cancel` (`CancelTask`). "
            "Every answer is HTTP 200 with a `result` or an `error` (-32700 not JSON, -32600 not a "
            "request or a body over 256 KB, -32601 unknown method, -32602 bad params, -32001 task not "
            "found, -32002 not cancelable, -32003 push notifications, -32004 not offered, -32005 file "
            "parts, -32009 an `A2A-Version` other than 0.3 and 1.0, -32603 the run could not start), except `message/stream`, answered as Server-Sent Events whose "
            "`data` are JSON-RPC responses. The body is read as JSON whatever its Content-Type.")
RPC_DOC = dict(tags="a2a", description=RPC_TEXT, body=out.JSONRPC_REQUEST, checks_media=False,
               response=out.JSONRPC_RESPONSE, sse_alt=out.JSONRPC_EVENT,
               errors={503: "Too many requests are waiting for agents; retry shortly"})


@bp.post("/a2a")
@doc("A2A JSON-RPC endpoint of every agent (`metadata.agent` names one)", **RPC_DOC)
def rpc():
    return _rpc(None)


@bp.post("/a2a/agents/<name>")
@doc("A2A JSON-RPC endpoint of one agent", path_params=AGENT_PARAM,
     **{**RPC_DOC, "errors": {**RPC_DOC["errors"], 404: "No agent by that name"}})
def agent_rpc(name: str):
    _handle(name)
    return _rpc(name)


def _rpc(agent: str | None) -> Response:
    k = kernel()
    service = k.a2a
    try:
        data = body.raw_body(RPC_BODY_LIMIT)
    except PayloadTooLarge:
        # A JSON-RPC error like every other refusal here (A2A's reference server answers so too).
        return jsonify(error_response(None, INVALID_REQUEST,
                                      f"Invalid Request: body too large (max {RPC_BODY_LIMIT // 1024} KB)"))
    try:
        payload = jsonsafe.loads(data)  # (nesting past its depth limit is a parse error too)
    except (ValueError, UnicodeDecodeError):
        return jsonify(error_response(None, PARSE_ERROR, "Parse error: the body is not JSON"))
    rpc_id = payload.get("id") if isinstance(payload, dict) else None
    try:
        rpc_id, method, params = service.check_request(payload)
        service.check_version(request.headers.get("A2A-Version"))
        if service.is_stream(method):
            return _stream(rpc_id, method, params, agent)
        if not service.runs_a_message(method):
            result = service.call(method, params, agent, caller=principal())
        else:
            # Waiting for the run holds a server thread, like a plain message request.
            acquire_stream_slot("server busy: too many requests are waiting for agents; try again shortly")
            try:
                disconnected = client_disconnected()
                result = service.call(method, params, agent, wait=lambda ticket: ticket.result(disconnected),
                                      caller=principal(), submit=kernel().executor.submit)
            finally:
                stream_slots().release()
    except RpcError as exc:
        # An id that is not a string or an integer (JSON's true and false included) is not
        # echoed: JSON-RPC answers null where the request's id could not be read.
        valid = isinstance(rpc_id, (str, int)) and not isinstance(rpc_id, bool)
        return jsonify(error_response(rpc_id if valid else None, exc.code, exc.message, exc.data))
    return jsonify({"jsonrpc": "2.0", "id": rpc_id, "result": result})


def _stream(rpc_id: Any, method: str, params: dict[str, Any], agent: str | None) -> Response:
    k = kernel()
    acquire_stream_slot()
    try:
        disconnected = client_disconnected()
        events = k.a2a.stream(rpc_id, method, params, agent, k.executor.submit,
                              alive=lambda: not (disconnected and disconnected()), caller=principal())
    except BaseException:
        stream_slots().release()
        raise

    def chunks():
        for item in events:
            yield format_event(None, item) if item else comment("keep-alive")

    return sse_response(chunks(), on_close=stream_slots().release)
