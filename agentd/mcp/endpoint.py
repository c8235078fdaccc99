"""The `/mcp` endpoint: the SDK's Streamable HTTP transport (an ASGI app) served through
the daemon's WSGI server by a2wsgi's bridge, on the daemon's MCP loop. Built on the first
request, so the SDK is not imported before an MCP client calls (agentd/mcp/server.py)."""

from __future__ import annotations

import json
import threading
from typing import Any
from wsgiref.util import is_hop_by_hop

# One JSON-RPC message; the route refuses a larger declared body with the API's JSON error.
MAX_BODY_BYTES = 4 * 1024 * 1024


class McpEndpoint:
    """The `/mcp` WSGI app, built on its first request (the SDK loads then, not at start)."""

    def __init__(self, loop: Any, agents: Any, runs: Any, memory: Any, keys: Any) -> None:
        self._loop = loop
        self._parts = (agents, runs, memory, keys)
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
                except ImportError:
                    return _missing_extra(start_response)

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
