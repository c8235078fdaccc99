"""The daemon's WSGI entry while it starts: listen first, build the app meanwhile.

Importing Flask, Pony, marshmallow and requests and opening the kernel take most of a
start. The daemon binds its port first and serves through a `StartGate`: the liveness
probe (`GET /api/health`) is answered at once, exactly as the app answers it (same body,
same headers, counted by the same rate limiter), and every other request waits until the
app is ready and is then handled by it, so a client never sees a half-built daemon. A
start that fails (a locked database) answers the waiting requests 503 and the daemon
exits with the error.

Only the plain probe is answered early: a request with an `Origin`, a forwarding header
or a Host that is not loopback or the listen address waits for the app's own guard. This
module stays light (no Flask) on purpose: it is imported before the port is bound.
"""

from __future__ import annotations

import json
import math
import threading
import uuid
from typing import Any, Callable, Iterable

from agentd.api.ratelimit import GcraLimiter
from agentd.api.response_headers import API_CSP, SECURITY_DEFAULTS
from agentd.config import Config

WAIT_SECS = 300.0  # how long a request may wait for the app (a start on a very slow disk)
HEALTH_BODY = b'{"status":"ok"}\n'
# What the app's response-header layer adds to every /api/ answer.
STATIC_HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(HEALTH_BODY))),
                  *SECURITY_DEFAULTS, ("Cache-Control", "no-store"), ("Content-Security-Policy", API_CSP)]
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# Headers that make the app's guard or proxy layer judge the request: left to the app.
_DEFER_KEYS = ("HTTP_ORIGIN", "HTTP_SEC_FETCH_SITE", "HTTP_FORWARDED", "HTTP_X_FORWARDED_FOR",
               "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_HOST", "HTTP_X_FORWARDED_PORT",
               "HTTP_X_FORWARDED_PREFIX", "HTTP_UPGRADE")

StartResponse = Callable[..., Any]


def _host_name(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else host
    return host.split(":", 1)[0] if host.count(":") == 1 else host


class StartGate:
    """WSGI callable: the probe now, everything else once `open(app)` was called."""

    def __init__(self, config: Config) -> None:
        self.limiter = GcraLimiter(config.api.rate_limit_per_second, config.api.rate_limit_burst)
        self._burst = str(config.api.rate_limit_burst)
        self._listen_host = _host_name(config.host)
        self._app: Callable[..., Iterable[bytes]] | None = None
        self._failure = ""
        self._ready = threading.Event()
        # Headers the app adds to every answer beyond the middleware's (the daemon sets them:
        # `X-Agentd-Daemon`, as agentd/api/__init__.py has the app's response headers add it).
        self.extra_headers: list[tuple[str, str]] = []

    @property
    def app(self) -> Callable[..., Iterable[bytes]] | None:
        return self._app

    def open(self, app: Callable[..., Iterable[bytes]]) -> None:
        """The app is built: serve every request with it from now on."""
        self._app = app
        self._ready.set()

    def fail(self, message: str) -> None:
        """The start failed: waiting requests get 503 with `message`."""
        self._failure = message
        self._ready.set()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        app = self._app
        if app is None and self._plain_probe(environ):
            answered = self._probe(environ, start_response)
            if answered is not None:
                return answered
        if app is None:
            self._ready.wait(WAIT_SECS)
            app = self._app
        if app is None:
            body = json.dumps({"error": f"agentd failed to start: {self._failure}" if self._failure
                               else "agentd is still starting; try again shortly"}).encode()
            start_response("503 Service Unavailable", [("Content-Type", "application/json"),
                                                       ("Content-Length", str(len(body))), ("Retry-After", "1")])
            return [body]
        return app(environ, start_response)

    def _plain_probe(self, environ: dict[str, Any]) -> bool:
        if environ.get("REQUEST_METHOD") != "GET" or environ.get("PATH_INFO") != "/api/health":
            return False
        if any(key in environ for key in _DEFER_KEYS):
            return False
        host = environ.get("HTTP_HOST")
        if host is None:
            return True
        name = _host_name(host)
        return name in LOOPBACK_HOSTS or (bool(name) and name == self._listen_host)

    def _probe(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes] | None:
        decision = self.limiter.hit(environ.get("REMOTE_ADDR") or "unknown")
        if not decision.allowed:
            return None  # refused hits change nothing: the app answers its own 429
        start_response("200 OK", STATIC_HEADERS + [
            ("X-RateLimit-Limit", self._burst), ("X-RateLimit-Remaining", str(decision.remaining)),
            ("X-RateLimit-Reset", str(math.ceil(decision.reset_after))), ("X-Request-Id", uuid.uuid4().hex)]
            + self.extra_headers)
        return [HEALTH_BODY]
