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

Which of this daemon's adapter, the cluster daemon holding the channel or nobody answers
is decided below the routes (agentd/cluster/webhook_intake.py): this route only turns the
request into that call and its reply into a response.
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from agentd.api.middleware import is_loopback
from agentd.api.routes_system import kernel
from agentd.cluster.webhook_intake import Delivery, Reply

bp = Blueprint("webhooks", __name__)
METHODS = ["GET", "POST", "PUT"]  # GET: verification handshakes (Meta's hub.challenge)


def _read_body() -> bytes | None:
    """The body, or None when it is over the adapters' limit (read no further than that)."""
    from agentd.channels.bases.webhook import MAX_BODY

    if (request.content_length or 0) > MAX_BODY:
        return None
    body = request.stream.read(MAX_BODY + 1)
    return None if len(body) > MAX_BODY else body


def _response(reply: Reply) -> Response:
    if isinstance(reply.body, bytes):  # a verification challenge, or another daemon's answer
        response = Response(reply.body, status=reply.status, headers=reply.headers)
    else:
        response = jsonify(reply.body)
        response.status_code = reply.status
        response.headers.update(reply.headers)
    return response


@bp.route("/channels/<name>/webhook", methods=METHODS, defaults={"rest": ""})
@bp.route("/channels/<name>/webhook/<path:rest>", methods=METHODS)
def webhook(name: str, rest: str):
    delivery = Delivery(request.method, request.path, "/" + rest, request.query_string,
                        list(request.args.items(multi=True)), request.headers, request.remote_addr or "",
                        _read_body, is_loopback)
    return _response(kernel().webhook_intake.deliver(name, delivery))
