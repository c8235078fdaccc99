"""The headers every answer carries, added as it leaves the app (WSGI middleware).

Request id, rate-limit state, CORS for allowed origins and the security headers are
added here, to the plain header list the app hands to `start_response`, rather than in a
Flask after-request hook: werkzeug checks every value it is given and copies the whole set
once more on the way out, about 15 µs a request for these ten headers; appending to the
list costs a few. Every answer passes here, error pages and streams included. (No Flask
import: the start gate shares the constants below before the app is loaded.)

What the app's hooks leave for this layer, in the WSGI environ:
`REQUEST_ID` (set here, before the app runs; errors and logs name it) and `RATE`
(the rate limiter's decision, when the request was counted).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Iterable

from agentd import logs
from agentd.server.proxy import PEER_KEY
from agentd.ids import random_uuid_hex

log = logging.getLogger("agentd.http")

REQUEST_ID = "agentd.request_id"
RATE = "agentd.rate"

# Kept when the app set its own (a dashboard page's frame policy, say).
SECURITY_DEFAULTS = (("X-Content-Type-Options", "nosniff"), ("X-Frame-Options", "DENY"),
                     ("Referrer-Policy", "strict-origin-when-cross-origin"))
_SECURITY = tuple((name.lower(), (name, value)) for name, value in SECURITY_DEFAULTS)
API_CSP = "default-src 'none'; frame-ancestors 'none'"

StartResponse = Callable[..., Any]


def is_api(path: str) -> bool:
    """JSON routes get `no-store` and the API's content policy."""
    return path.startswith(("/api/", "/v1/")) or path == "/metrics"


class ResponseHeaders:
    """WSGI middleware adding the common headers to every answer of `app`."""

    def __init__(self, app: Callable[..., Iterable[bytes]], origins: set[str], burst: int,
                 fixed: Iterable[tuple[str, str]] = ()) -> None:
        self.app = app
        self.origins = origins
        self.burst = str(burst)
        self.fixed = list(fixed)  # the same on every answer (`X-Agentd-Daemon`); they replace the app's
        # Every name `add` may replace in the app's headers.
        self._replaceable = frozenset({"x-request-id", "x-ratelimit-limit", "x-ratelimit-remaining",
                                       "x-ratelimit-reset", "access-control-allow-origin", "cache-control",
                                       *(name.lower() for name, _ in self.fixed)})

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        environ[REQUEST_ID] = rid = random_uuid_hex()
        started = time.perf_counter()

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            self.add(environ, headers)
            if log.isEnabledFor(logging.DEBUG):
                _log_request(environ, status, started)
            return start_response(status, headers, exc_info)

        # The lines this request writes name it (runs carry it on: RunRequest.request_id).
        token = logs.bind(request_id=rid)
        try:
            return self.app(environ, start)
        finally:
            logs.unbind(token)

    def add(self, environ: dict[str, Any], headers: list[tuple[str, str]]) -> None:
        """Add (or replace) the common headers in `headers`, the answer's list."""
        # The app's headers by lower-case name (the first of a repeated one).
        present = {name.lower(): value for name, value in reversed(headers)}
        replaced: list[tuple[str, str]] = [("X-Request-Id", environ[REQUEST_ID]), *self.fixed]
        decision = environ.get(RATE)
        if decision is not None:
            replaced += [("X-RateLimit-Limit", self.burst), ("X-RateLimit-Remaining", str(decision.remaining)),
                         ("X-RateLimit-Reset", str(math.ceil(decision.reset_after)))]
        origin = environ.get("HTTP_ORIGIN")
        cors = bool(origin) and origin.rstrip("/") in self.origins
        if cors:
            replaced.append(("Access-Control-Allow-Origin", origin))
        api = is_api(environ.get("PATH_INFO", ""))
        if api and not present.get("content-type", "").lower().startswith("text/event-stream"):
            # Event streams keep their `no-cache` (agentd.api.sse), which proxies know.
            replaced.append(("Cache-Control", "no-store"))
        if not self._replaceable.isdisjoint(present):  # (rarely: most answers set none of them)
            names = {name.lower() for name, _ in replaced}
            if not names.isdisjoint(present):
                headers[:] = [h for h in headers if h[0].lower() not in names]
        headers += replaced
        if cors:
            headers.append(("Vary", "Origin"))
        headers += [h for name, h in _SECURITY if name not in present]
        if api and "content-security-policy" not in present:
            headers.append(("Content-Security-Policy", API_CSP))


def _log_request(environ: dict[str, Any], status: str, started: float) -> None:
    took = (time.perf_counter() - started) * 1000
    client = environ.get("REMOTE_ADDR")
    # REMOTE_ADDR is the real client; behind a trusted proxy the peer is noted too.
    peer = environ.get(PEER_KEY, client)
    via = f" via {peer}" if peer != client else ""
    log.debug("%s %s -> %s (%.1f ms, request %s, client %s%s)", environ.get("REQUEST_METHOD"),
              environ.get("PATH_INFO"), status.split(" ", 1)[0], took, environ[REQUEST_ID], client, via)
