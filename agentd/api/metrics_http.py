"""HTTP metrics, taken as each answer leaves the app (WSGI middleware).

The route label is the matched Flask rule (`/api/agents/<agent_id>/message`), never the
raw path, so a client cannot add series by inventing paths. Latency runs from the
request's arrival to its response headers: a whole answer for plain requests, the opening
for streams. Event streams count as open until the server closes their body; a WebSocket
while its handler holds the connection.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Iterable

from werkzeug.wsgi import ClosingIterator

from agentd.api.response_headers import RATE
from agentd.metrics import UNMATCHED, Metrics

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_STREAMING = "agentd.metrics.sse"
# A rule's converter is left out of its label: `<path:key>` reads `<key>`, like every other variable.
_CONVERTER = re.compile(r"<[^<>:]+:([^<>]+)>")


class RequestMetrics:
    """WSGI middleware counting every answer of `app` in `metrics`."""

    def __init__(self, app: Callable[..., Iterable[bytes]], metrics: Metrics,
                 agent_named: Callable[[str], Any] = lambda agent_id: None) -> None:
        self.app = app
        self.metrics = metrics
        self.agent_named = agent_named  # the loaded agent of an id (its handle), or None
        self._routes: dict[str, str] = {}  # rule -> its label

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        started = time.perf_counter()
        metrics = self.metrics
        socket = environ.get("HTTP_UPGRADE", "").lower() == "websocket"

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            self._observe(environ, status, headers, started)
            return start_response(status, headers, exc_info)

        if socket:
            metrics.open_websockets.inc()
        try:
            body = self.app(environ, start)
        finally:
            if socket:
                metrics.open_websockets.dec()
        if environ.pop(_STREAMING, False):
            return ClosingIterator(body, metrics.open_streams.dec)
        return body

    def _observe(self, environ: dict[str, Any], status: str, headers: list[tuple[str, str]],
                 started: float) -> None:
        code = status[:3]
        request = environ.get("werkzeug.request")
        rule = getattr(request, "url_rule", None)
        method = environ.get("REQUEST_METHOD", "")
        self.metrics.http_request(method if method in METHODS else "other",
                                  self._route(rule.rule) if rule is not None else UNMATCHED, code,
                                  time.perf_counter() - started)
        if code == "429":
            decision = environ.get(RATE)
            if decision is not None and not decision.allowed:
                self.metrics.refusal("rate_limit")
        elif code == "413":
            self.metrics.refusal("size", self._agent(request) if self.metrics.agent_labels else "")
        elif code == "200" and _is_event_stream(headers) and not environ.get(_STREAMING):
            environ[_STREAMING] = True
            self.metrics.open_streams.inc()

    def _agent(self, request: Any) -> str:
        """The name of the agent the request's path names, or "" (no agent, or none known here)."""
        agent_id = (getattr(request, "view_args", None) or {}).get("agent_id")
        handle = self.agent_named(agent_id) if isinstance(agent_id, str) else None
        return handle.name if handle is not None else ""

    def _route(self, rule: str) -> str:
        label = self._routes.get(rule)
        if label is None:
            label = self._routes[rule] = _CONVERTER.sub(r"<\1>", rule)
        return label


def _is_event_stream(headers: list[tuple[str, str]]) -> bool:
    for name, value in headers:
        if name.lower() == "content-type":
            return value.startswith("text/event-stream")
    return False
