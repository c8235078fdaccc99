"""WebSockets on the waitress port: hand flask-sock a socket that waitress lets go of.

waitress never gives a WSGI application its connection, and simple-websocket
(under flask-sock) needs one: it looks for ``environ["werkzeug.socket"]`` and
otherwise fails the handshake with 500 "Cannot obtain socket from WSGI
environment". This module closes the gap without patching waitress globally:
``install(server)`` gives one server a channel class (and through it a task
class, built on the task every answer is written by: task.py) that, for a request
carrying ``Upgrade: websocket``, puts a *lazy* socket into the environ.

* Nothing happens until simple-websocket first uses that object (any attribute
  access, i.e. the moment it sends the 101 response). A request the app
  answers on its own -- 401, 404, a rejected handshake -- never touches it and
  is served as ordinary HTTP on a connection that stays usable.
* On first use the channel is *hijacked*: waitress's asyncore loop stops
  polling it (readable()/writable() are False) and it takes no more requests.
  simple-websocket gets an ``os.dup()`` of the descriptor, never waitress's own
  socket object: its reader thread closes the socket it is given, and closing
  a descriptor that waitress still polls kills waitress's main loop.
* The dup (``ws_socket.WebSocketStream``) keeps a timeout, serialises writes
  and turns a vanished peer into a quiet close; its docstring says how.
* When the handler returns, whatever the WSGI app returns is discarded (no
  HTTP response is written into the WebSocket stream), the task waits up to
  ``CLOSE_TIMEOUT`` seconds for the close handshake, then ``shutdown()``s the
  socket so simple-websocket's reader thread always exits, and waitress closes
  the channel.

Each open WebSocket holds one waitress worker thread for its whole life.
Recommended settings::

    server = websocket.create_server(
        app, host=..., port=...,
        threads=HTTP_HEADROOM + MAX_WEBSOCKETS + MAX_SSE_STREAMS,
        connection_limit=...,       # well above threads (waitress default 100)
        asyncore_use_poll=True,     # select() breaks past 1024 descriptors
    )
    app.config["SOCK_SERVER_OPTIONS"] = {"ping_interval": 25}  # flask-sock

The ping keeps idle sockets alive through proxies and NATs and detects dead
peers; waitress's ``channel_timeout`` does not apply to a hijacked channel.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

import waitress
from waitress.channel import HTTPChannel

from agentd.server.channel import LoopFlushChannel
from agentd.server.task import WriteTask
from agentd.server.ws_socket import SEND_TIMEOUT, WebSocketStream

__all__ = [
    "CLOSE_TIMEOUT",
    "SEND_TIMEOUT",
    "WebSocketChannel",
    "WebSocketTask",
    "active_websockets",
    "close_websockets",
    "create_server",
    "install",
]

log = logging.getLogger("agentd.ws.transport")

#: Seconds a finished handler waits for the client to answer the close frame.
CLOSE_TIMEOUT = 2.0


class _Registry:
    """The hijacked connections of one server, for shutdown and monitoring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: set[WebSocketStream] = set()

    def add(self, stream: WebSocketStream) -> None:
        with self._lock:
            self._streams.add(stream)

    def discard(self, stream: WebSocketStream) -> None:
        with self._lock:
            self._streams.discard(stream)

    def snapshot(self) -> list[WebSocketStream]:
        with self._lock:
            return list(self._streams)


class _LazySocket:
    """What ``environ["werkzeug.socket"]`` holds: hijacks on first use.

    Dunder lookups (repr, bool, copying the environ) bypass ``__getattr__``,
    so only real use by simple-websocket (``send``, ``recv``, ``fileno`` ...)
    takes the connection away from waitress.
    """

    def __init__(self, task: WebSocketTask) -> None:
        self._task = task

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._task.hijack(), name)

    def __repr__(self) -> str:
        return f"<lazy websocket for {self._task.request.path}>"


class WebSocketTask(WriteTask):
    """A WSGI task that can give its connection to a WebSocket handler."""

    _ws_lazy: _LazySocket | None = None
    _ws_stream: WebSocketStream | None = None

    def __init__(self, channel: HTTPChannel, request: Any) -> None:
        super().__init__(channel, request)
        self._ws_hijack_lock = threading.Lock()

    def get_environment(self) -> dict[str, Any]:
        environ = super().get_environment()
        if self._ws_lazy is None and "websocket" in environ.get("HTTP_UPGRADE", "").lower():
            self._ws_lazy = _LazySocket(self)
            environ["werkzeug.socket"] = self._ws_lazy
        return environ

    def hijack(self) -> WebSocketStream:
        """Take the connection from waitress (once) and return the dup'd socket."""
        with self._ws_hijack_lock:
            if self._ws_stream is not None:
                return self._ws_stream
            channel = self.channel
            channel.hijack()
            # Whatever happens now, no HTTP response may be written: mark the
            # header as sent so waitress never writes an error page into the
            # WebSocket stream, and close the channel when the task ends.
            self.wrote_header = True
            self.close_on_finish = True
            peer = "%s:%s" % tuple(channel.addr[:2]) if channel.addr else "?"
            try:
                fd = os.dup(channel.socket.fileno())
            except (OSError, AttributeError, ValueError) as exc:
                log.info("websocket client %s went away before the handshake: %s", peer, exc)
                stream = WebSocketStream(peer=peer)
            else:
                stream = WebSocketStream(fileno=fd, peer=peer, headers=self.response_headers)
            self._ws_stream = stream
            registry = _registry_of(channel.server)
            if registry is not None:
                registry.add(stream)
            return stream

    def execute(self) -> None:
        try:
            super().execute()
        except Exception:
            if self._ws_stream is None:
                raise  # ordinary HTTP: waitress answers 500 as usual
            # After the hijack there is no HTTP left to answer with.
            log.exception("websocket request %s failed after the upgrade", self.request.path)
        finally:
            if self._ws_stream is not None:
                self._finish_websocket(self._ws_stream)

    def _finish_websocket(self, stream: WebSocketStream) -> None:
        try:
            if stream.handshake_done:
                # flask-sock has sent the close frame; give the client a
                # moment to answer so the close handshake completes cleanly.
                stream.wait_closed(CLOSE_TIMEOUT)
            stream.abort()
        finally:
            registry = _registry_of(self.channel.server)
            if registry is not None:
                registry.discard(stream)

    def write(self, data: bytes) -> None:
        if self._ws_stream is not None:
            # The app's post-handshake "response" is meaningless; count it as
            # written so waitress does not warn about a short Content-Length.
            self.content_bytes_written += len(data)
            return
        super().write(data)

    def finish(self) -> None:
        if self._ws_stream is not None:
            return
        super().finish()


class WebSocketChannel(LoopFlushChannel):
    """An HTTP channel that steps aside once its connection is hijacked."""

    task_class = WebSocketTask
    ws_hijacked = False

    def __init__(self, server: Any, sock: socket.socket, addr: Any, adj: Any,
                 map: dict[int, Any] | None = None) -> None:
        # Held by the main loop while reading, so no read can race the
        # hijack and swallow the first bytes meant for the WebSocket.
        self._ws_hijack_lock = threading.Lock()
        super().__init__(server, sock, addr, adj, map=map)

    def hijack(self) -> None:
        """Stop waitress from reading, writing or parsing on this connection."""
        with self._ws_hijack_lock:
            self.ws_hijacked = True
            # The main loop asks every channel readable()/writable() on each turn: only a
            # hijacked one answers differently, so only it gets these (instance) overrides
            # and a plain HTTP channel keeps waitress's own methods.
            self.readable = self._hijacked_readable  # type: ignore[method-assign]
            self.writable = self._hijacked_writable  # type: ignore[method-assign]

    @staticmethod
    def _hijacked_readable() -> bool:
        return False

    def _hijacked_writable(self) -> bool:
        # Only wake up to close the channel once the task has finished
        # (service() sets close_when_flushed); there is never output.
        return bool(self.will_close or self.close_when_flushed)

    def handle_read(self) -> None:
        with self._ws_hijack_lock:
            if self.ws_hijacked:
                return
            super().handle_read()


def servers_of(server: Any) -> list[Any]:
    """The listening servers behind what waitress.create_server returned."""
    if hasattr(server, "channel_class"):
        return [server]
    # A MultiSocketServer (several listen addresses): its servers are in the map.
    return [s for s in getattr(server, "map", {}).values() if hasattr(s, "channel_class")]


def _registry_of(server: Any) -> _Registry | None:
    return getattr(server, "_agentd_ws_registry", None)


def install(server: Any) -> Any:
    """Make flask-sock routes work on ``server`` (from ``waitress.create_server``).

    Sets the server instance's ``channel_class`` -- waitress itself is not
    patched -- so call it before the server accepts connections. Accepts a
    ``MultiSocketServer`` too. Returns ``server``. Idempotent.
    """
    servers = servers_of(server)
    if not servers:
        raise TypeError(f"not a waitress server: {server!r}")
    registry = _registry_of(server) or _Registry()
    for srv in servers:
        current = srv.channel_class
        if not issubclass(current, WebSocketChannel):
            if current is not HTTPChannel:
                raise TypeError(f"server already uses a custom channel class {current!r}")
            srv.channel_class = WebSocketChannel
        srv._agentd_ws_registry = registry
    server._agentd_ws_registry = registry
    return server


def create_server(app: Any, **waitress_kwargs: Any) -> Any:
    """``waitress.create_server(app, **waitress_kwargs)`` with WebSockets installed."""
    return install(waitress.create_server(app, **waitress_kwargs))


def active_websockets(server: Any) -> int:
    """Number of hijacked connections whose handler is still running."""
    registry = _registry_of(server)
    return len(registry.snapshot()) if registry is not None else 0


def close_websockets(server: Any) -> int:
    """Send "1001 going away" to every open WebSocket and shut it down.

    For server shutdown: handlers then see ``ConnectionClosed`` and return,
    releasing their worker threads. Returns how many sockets were closed.
    """
    registry = _registry_of(server)
    streams = registry.snapshot() if registry is not None else []
    for stream in streams:
        stream.going_away()
    return len(streams)
