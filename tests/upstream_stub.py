"""A one-route HTTP upstream on 127.0.0.1 for driver tests that need a reply the fake LLM
server does not give (no Content-Type, a body cut short, a stall, a gzip stream...)."""

from __future__ import annotations

import contextlib
import http.server
import threading
from typing import Callable, Iterator

Respond = Callable[[http.server.BaseHTTPRequestHandler], None]


@contextlib.contextmanager
def upstream(respond: Respond) -> Iterator[str]:
    """Serve every POST with `respond(handler)` (the request body already read); yields the
    server's base URL ending in /v1."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            respond(self)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True  # a handler that stalls on purpose must not hold shutdown up
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()


def answer(body: bytes, content_type: str | None = "application/json", **headers: str) -> Respond:
    """A complete 200 answer with a Content-Length (no Content-Type when `content_type` is None)."""

    def respond(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        if content_type is not None:
            handler.send_header("Content-Type", content_type)
        for name, value in headers.items():
            handler.send_header(name.replace("_", "-"), value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return respond


def stalled(first: bytes, content_type: str, seconds: float = 3.0) -> Respond:
    """Headers without a length (HTTP/1.0: the body ends with the socket), `first`, then silence."""

    def respond(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.end_headers()
        handler.wfile.write(first)
        handler.wfile.flush()
        threading.Event().wait(seconds)

    return respond
