"""The `/mcp` endpoint: the SDK's Streamable HTTP transport (an ASGI app) served through
the daemon's WSGI server by a2wsgi's bridge, on the daemon's MCP loop. Built on the first
request, so the SDK is not imported before an MCP client calls (agentd/mcp/server.py)."""

from __future__ import annotations

import io
import json
import logging
import threading
from typing import Any
from wsgiref.util import is_hop_by_hop

log = logging.getLogger("agentd.mcp")

# One JSON-RPC message; the route refuses a larger declared body with the API's JSON error.
MAX_BODY_BYTES = 4 * 1024 * 1024
# A body larger than this is no cancellation notification (it is read only to look for one).
MAX_NOTIFICATION_BYTES = 64 * 1024
KEY_HEADER = "HTTP_X_AGENTD_KEY_ID"  # set by the route (agentd/api/routes_mcp.py), read as `x-agentd-key-id`


class Running:
    """The `message_agent` runs under way, by `caller`. The transport is stateless, so a
    client's `notifications/cancelled` arrives in a POST of its own: it stops the runs of
    the request it names that the same key asked for from the same address."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str, str], set[threading.Event]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(environ: dict[str, Any], request_id: Any) -> tuple[str, str, str]:
        return environ.get(KEY_HEADER, ""), environ.get("REMOTE_ADDR", ""), str(request_id)

    def add(self, environ: dict[str, Any], request_id: Any, cancel: threading.Event) -> None:
        with self._lock:
            self._runs.setdefault(self._key(environ, request_id), set()).add(cancel)

    def remove(self, environ: dict[str, Any], request_id: Any, cancel: threading.Event) -> None:
        key = self._key(environ, request_id)
        with self._lock:
            events = self._runs.get(key, set())
            events.discard(cancel)
            if not events:
                self._runs.pop(key, None)

    def notified(self, environ: dict[str, Any]) -> None:
        """Act on a `notifications/cancelled` in the request's body (which is kept for the SDK)."""
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if not 0 < length <= MAX_NOTIFICATION_BYTES:
            return
        body = environ["wsgi.input"].read(length)
        environ["wsgi.input"] = io.BytesIO(body)
        if b"notifications/cancelled" not in body:
            return
        try:
            message = json.loads(body)
        except ValueError:
            return
        if isinstance(message, dict) and message.get("method") == "notifications/cancelled" \
                and isinstance(message.get("params"), dict) and "requestId" in message["params"]:
            with self._lock:
                events = list(self._runs.get(self._key(environ, message["params"]["requestId"]), ()))
            for event in events:
                event.set()


class McpEndpoint:
    """The `/mcp` WSGI app, built on its first request (the SDK loads then, not at start)."""

    def __init__(self, loop: Any, agents: Any, runs: Any, memory: Any, keys: Any) -> None:
        self._loop = loop
        self.running = Running()
        self._parts = (agents, runs, memory, keys, self.running)
        self._wsgi: Any = None
        self._stop: Any = None  # set: the transport's session manager ends
        self._serving: Any = None  # the session manager's task on the loop
        self._lock = threading.Lock()

    def _build(self) -> Any:
        import asyncio

        from a2wsgi import ASGIMiddleware

        from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings

        from agentd.mcp.server import build_server

        server = build_server(*self._parts)
        # Host and Origin are checked by the daemon's guard before a request gets here.
        manager = StreamableHTTPSessionManager(
            app=server._lowlevel_server, stateless=True, max_request_body_size=MAX_BODY_BYTES,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        ready = threading.Event()

        async def serve() -> None:
            self._stop = asyncio.Event()
            async with manager.run():
                ready.set()
                await self._stop.wait()

        self._serving = self._loop.submit(serve())
        ready.wait(10)
        return ASGIMiddleware(StreamableHTTPASGIApp(manager), loop=self._loop.loop)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        with self._lock:
            if self._wsgi is None:
                try:
                    self._wsgi = self._build()
                except ImportError as exc:
                    # Named in the log: a broken install is not always a missing one.
                    log.warning("/mcp cannot load the MCP SDK: %s", exc)
                    return _missing_extra(start_response)

        self.running.notified(environ)

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            # The SSE response names `Connection`, which a WSGI app may not (PEP 3333):
            # connection handling is the server's.
            return start_response(status, [(k, v) for k, v in headers if not is_hop_by_hop(k)], exc_info)

        return self._wsgi(environ, start)

    def close(self) -> None:
        stop = self._stop
        if stop is not None and self._loop.running:
            self._loop.loop.call_soon_threadsafe(stop.set)


def _missing_extra(start_response: Any) -> list[bytes]:
    from agentd.mcp.hub import MISSING_EXTRA

    body = json.dumps({"error": MISSING_EXTRA}).encode()
    start_response("501 Not Implemented", [("Content-Type", "application/json"),
                                          ("Content-Length", str(len(body)))])
    return [body]
