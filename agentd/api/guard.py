"""The request guard: runs before CORS, rate limiting, auth and every handler.

It keeps a daemon that serves loopback clients without a key from being driven by
web pages the user happens to visit:

* Host allow-list (DNS rebinding): a page on `attacker.example` that resolves to
  127.0.0.1 still sends `Host: attacker.example`; only loopback names, the listen
  address and `[api] allowed_hosts` are served.
* Cross-site refusal: a browser marks requests from other sites with `Origin` and
  `Sec-Fetch-Site`. A state-changing request from another origin (a form post, a
  `fetch` with `mode: no-cors`) is refused before any handler runs. Requests with
  neither header (curl, SDKs, scripts) are not browsers' and pass.

The policies themselves are in agentd/server/webguard.py. A request whose body is still on
its way is judged earlier, by agentd/server/early_refusal.py, before waitress reads it.
"""

from __future__ import annotations

from flask import Flask, Response, jsonify, request

from agentd.api.errors import error_response, is_api_path
from agentd.config import Config
from agentd.server.proxy import ARRIVED_HOST_KEY
from agentd.server.webguard import (CROSS_SITE_MESSAGE, CROSS_SITE_VALUES, HOST_CHARS, HOST_MESSAGE,  # noqa: F401
                                    LOOPBACK_NAMES, STATE_CHANGING, HostPolicy, OriginPolicy, allowed_origins,
                                    host_name)


def _refusal(status: int, message: str) -> Response:
    """The guard's refusal: `{"error": message}` on every route family, `/v1/` included, so a
    client sees the same answer whichever route the page aimed at."""
    response = jsonify({"error": message})
    response.status_code = status
    return response


def _own_origin() -> str:
    return f"{request.scheme}://{request.host}"


def install_guard(app: Flask, config: Config) -> None:
    """Register the guard as the app's first before-request hook."""
    hosts = HostPolicy(config.host, config.api.allowed_hosts)
    origins = OriginPolicy(config.port, allowed_origins(config))

    def _guard() -> Response | None:
        req = request._get_current_object()  # (each use of the proxy looks the request up again)
        environ = req.environ
        if not hosts.allows(environ.get("HTTP_HOST")) or not hosts.allows(environ.get(ARRIVED_HOST_KEY)):
            if is_api_path(req.path):
                return _refusal(400, HOST_MESSAGE)
            return error_response(400, HOST_MESSAGE)  # a dashboard page gets a short HTML page
        origin = environ.get("HTTP_ORIGIN")
        # The daemon's own origin only matters against an Origin header (worked out per
        # request, so not for the many requests without one).
        if origins.refuses(req.method, origin, environ.get("HTTP_SEC_FETCH_SITE"),
                           _own_origin() if origin is not None else "", environ.get("HTTP_UPGRADE")):
            return _refusal(403, CROSS_SITE_MESSAGE)
        return None

    # First in line: nothing (rate limiter, auth, body parsing) runs for a refused request.
    app.before_request_funcs.setdefault(None, []).insert(0, _guard)
