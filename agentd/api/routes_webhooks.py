"""Chat platforms' webhooks on the daemon's own port: `/channels/<name>/webhook`.

Every running webhook adapter (agentd/channels/bases/webhook.py) is served here, so one
proxy location reaches them all. These routes sit outside the API key and the dashboard's
CSRF token: a platform can present neither, and its signature (checked by the adapter
before the body is parsed) is what authenticates it. They stay under the rate limiter,
the Host check and the cross-site refusal (agentd/api/middleware.py, agentd/api/guard.py).

Who may reach them: a request carrying `Origin` or `Sec-Fetch-Site` is a browser's (a page
the user visits) and is refused before its body is read, whatever the signature. An adapter
that authenticates every request (`signed()`) is served to any client, the real one behind
`[api] trusted_proxies` included; one running without a secret (the generic webhook with no
`secret_env`) only to loopback clients, which is what a keyless daemon serves anyway. Not
part of the OpenAPI document: each platform defines its own protocol (docs/channels/).

In a cluster, a daemon that does not hold the channel relays the request to the one that
does and answers its answer (agentd/cluster/relay.py); 503 with Retry-After when no daemon
holding it answers.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from agentd.api.middleware import is_loopback
from agentd.api.routes_system import kernel
from agentd.cluster.relay import Inbound

bp = Blueprint("webhooks", __name__)
METHODS = ["GET", "POST", "PUT"]  # GET: verification handshakes (Meta's hub.challenge)


def _answer(status: int, body: Any, retry_after: int = 0) -> Response:
    if isinstance(body, bytes):  # a verification challenge, echoed verbatim
        response = Response(body, status=status, mimetype="text/plain")
    else:
        response = jsonify(body)
        response.status_code = status
    if retry_after:
        response.headers["Retry-After"] = str(retry_after)
    return response


def _read_body() -> bytes | Response:
    from agentd.channels.bases.webhook import MAX_BODY

    if (request.content_length or 0) > MAX_BODY:
        return _answer(413, {"error": "body too large"})
    body = request.stream.read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        return _answer(413, {"error": "body too large"})
    return body


def _inbound(body: bytes, client: str) -> Inbound:
    return Inbound(request.method, request.path, request.query_string, list(request.args.items(multi=True)),
                   request.headers, body, client)


def _not_running(name: str) -> Response:
    # Configured but not running here (a failed start, or another daemon holds it and did
    # not answer): platforms retry a 503, so no event is lost while it comes back.
    return _answer(503, {"error": f"channel {name} is not running on this daemon"}, retry_after=5)


@bp.route("/channels/<name>/webhook", methods=METHODS, defaults={"rest": ""})
@bp.route("/channels/<name>/webhook/<path:rest>", methods=METHODS)
def webhook(name: str, rest: str):
    from agentd.channels.bases.webhook import Request

    daemon = kernel()
    adapter = daemon.channels.webhook(name)
    if adapter is None and name not in daemon.channels.sections:
        return _answer(404, {"error": f"no webhook channel {name!r} is configured"})
    if request.method != "GET" and (request.headers.get("Origin") is not None
                                    or request.headers.get("Sec-Fetch-Site") is not None):
        return _answer(403, {"error": "cross-site request refused"})
    client = request.remote_addr or ""
    relayed = daemon.webhook_relay.relayed(request.headers)
    if relayed or adapter is None:
        body = _read_body()
        if isinstance(body, Response):
            return body
        if relayed:
            # From another daemon of the cluster: judged as from the client it saw, and never
            # relayed again.
            client = daemon.webhook_relay.accept(_inbound(body, client)) or ""
            if not client:
                return _answer(403, {"error": "relayed webhook refused: not signed by a daemon of this cluster"})
            if adapter is None:
                return _not_running(name)
        else:
            answer = daemon.webhook_relay.forward(name, _inbound(body, client))
            if answer is None:
                return _not_running(name)
            return Response(answer.body, status=answer.status, headers=answer.headers)
    if not adapter.signed() and not is_loopback(client):
        return _answer(401, {"error": f"channel {name} has no signing secret: its webhook serves "
                                      "loopback clients only (set its secret to accept others)"})
    if not relayed:
        body = _read_body()
        if isinstance(body, Response):
            return body
    platform_request = Request(request.method, "/" + rest, request.args.to_dict(flat=False),
                               {k.lower(): v for k, v in request.headers.items()}, body)
    return _answer(*adapter.serve(platform_request, client, root=True))
