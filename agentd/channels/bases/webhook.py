"""Webhook base: platform requests with signature checks that run before any parsing.

Served on the daemon's own port at `/channels/<name>/webhook` (agentd/api/routes_webhooks.py);
an adapter whose section sets its port key (`port_key`) also gets its own HTTP listener,
bound to `[channels] listen_host` (127.0.0.1 by default). Both call `serve()`."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from agentd.channels.adapter import Adapter
from agentd import jsonsafe

MAX_BODY = 1024 * 1024


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return jsonsafe.loads(self.body.decode("utf-8"))


# A handler answers (status, JSON-able body).
Handler = Callable[[Request], tuple[int, Any]]


def within_window(timestamp: str | None, window: float = 300.0) -> bool:
    """Replay protection: the platform's timestamp is within `window` seconds of now."""
    try:
        return abs(time.time() - float(timestamp or "")) <= window
    except ValueError:
        return False


class WebhookAdapter(Adapter):
    """Subclasses implement `listen_port()`, `routes()` and `verify(request)`."""

    #: The settings key of the own listener's port: set in the section, it opens one.
    port_key = "webhook_port"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.server: ThreadingHTTPServer | None = None
        self.started = False

    def own_listener(self) -> bool:
        """Whether this adapter opens its own port besides the daemon's route: when its
        section sets `port_key`, or when it runs outside the channel runtime."""
        keys = self.ctx.configured
        return keys is None or self.port_key in keys

    def signed(self) -> bool:
        """Whether `verify` authenticates every request (a signature or token the platform
        holds). An adapter that can run unsigned says so: its daemon route then serves
        loopback clients only."""
        return True

    def listen_port(self) -> int:
        raise NotImplementedError

    def routes(self) -> dict[tuple[str, str], Handler]:
        """{(method, path): handler} served on the adapter's own port ("*": any path).
        Most platforms POST every event to one URL: `_inbound` takes them all."""
        return {("POST", "*"): self._inbound}

    def _inbound(self, request: Request) -> tuple[int, Any]:
        """The handler of the default route: one platform event, answered (status, body)."""
        raise NotImplementedError

    def verify(self, request: Request) -> bool:
        """The platform's signature/token check; runs before the body is parsed."""
        return True

    def handler_for(self, method: str, path: str, root: bool = False) -> Handler | None:
        """The route for (method, path); with `root`, the daemon's `/channels/<name>/webhook`
        itself (path "/") also takes an adapter's one route of that method (Feishu's
        `webhook_path` is its own listener's path)."""
        routes = self.routes()
        handler = routes.get((method, path)) or routes.get((method, "*"))
        if handler is None and root and path == "/":
            mine = [h for (m, _), h in routes.items() if m == method]
            handler = mine[0] if len(mine) == 1 else None
        return handler

    def serve(self, request: Request, remote: str, root: bool = False) -> tuple[int, Any]:
        """One platform request, its body read but not parsed: the signature check, then the
        route's handler. (status, JSON-able body, or bytes sent verbatim as text)."""
        handler = self.handler_for(request.method, request.path, root)
        if handler is None:
            return 404, {"error": "not found"}
        if not self.verify(request):
            self.ctx.audit("refused", reason="bad signature", remote=remote)
            return 401, {"error": "invalid signature"}
        try:
            return handler(request)
        except ValueError as exc:
            return 400, {"error": f"bad request: {exc}"}
        except Exception:  # noqa: BLE001 - never a traceback to the platform
            self.ctx.log.exception("webhook handler failed")
            return 500, {"error": "internal error"}

    def start(self) -> None:
        self.prepare()
        if self.own_listener():
            self.server = _Server((self.ctx.listen_host, self.listen_port()), self)
            self.spawn(self.server.serve_forever, "listener")
        self.started = True

    def prepare(self) -> None:
        """Checks before the listener opens; raise ChannelError."""

    def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.shutdown()  # ends serve_forever (called from the stopping thread)
            server.server_close()

    def health(self) -> bool:
        if self.stopping.is_set() or not self.started:
            return False
        return self.server is not None or not self.own_listener()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], adapter: WebhookAdapter) -> None:
        self.adapter = adapter
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr for any error in a handler thread;
        # a client that vanished (reset, broken pipe, timeout) is a log line instead.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
            self.adapter.ctx.log.info("webhook client %s: %s", client_address[0], exc)
            return
        self.adapter.ctx.log.exception("webhook request from %s failed", client_address[0])


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 15  # seconds a client may stall mid-request before its socket is dropped

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        self.server.adapter.ctx.log.debug("webhook %s", format % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # http.server's own errors (malformed request lines...) in JSON, never an HTML page.
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # unparsable request line: still send a status line
            self.request_version = "HTTP/1.0"
        self._answer(code, {"error": message or "bad request"})

    def _answer(self, status: int, body: Any) -> None:
        # bytes go out as text/plain: verification challenges are echoed verbatim.
        text = isinstance(body, bytes)
        data = body if text else json.dumps(body).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The sender hung up before reading the answer (a hostile or impatient
            # client); nothing to deliver, and nothing to log as a crash.
            self.close_connection = True

    def _handle(self) -> None:
        adapter = self.server.adapter
        if self.command != "GET" and (self.headers.get("Origin") is not None
                                      or self.headers.get("Sec-Fetch-Site") is not None):
            # Platforms post from their servers and send neither header; a browser always
            # sends one. A page the user visits (cross-site, or on a rebinding name that
            # makes it "same-origin") must not make the agent act: refused before the body.
            self.close_connection = True
            self._answer(403, {"error": "cross-site request refused"})
            return
        parts = urlsplit(self.path)
        if adapter.handler_for(self.command, parts.path) is None:
            self._answer(404, {"error": "not found"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._answer(400, {"error": "bad Content-Length"})
            return
        if length > MAX_BODY:
            self.close_connection = True
            self._answer(413, {"error": "body too large"})
            return
        body = self.rfile.read(length) if length else b""
        if len(body) < length:  # the client left mid-body: nobody to answer
            self.close_connection = True
            return
        request = Request(self.command, parts.path, parse_qs(parts.query),
                          {k.lower(): v for k, v in self.headers.items()}, body)
        remote = adapter.ctx.client_of(self.client_address[0], self.headers.get)
        self._answer(*adapter.serve(request, remote))

    do_GET = do_POST = do_PUT = _handle
