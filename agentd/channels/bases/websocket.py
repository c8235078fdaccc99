"""WebSocket base on `websocket-client`: connect, read frames, heartbeat pings,
reconnect with backoff; stop() closes the socket so the reader ends at once."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import websocket

from agentd.channels.adapter import Adapter
from agentd.channels.bases.backoff import Reconnects
from agentd import jsonsafe
from agentd.channels.bases.sender import HttpSender
from agentd.retry import Backoff


class Reconnect(Exception):
    """The platform asked for a new connection (Slack's `disconnect`, Discord's op 7): a
    routine event, logged at info and answered at once, without backoff or an audit row."""


class WebSocketAdapter(Adapter):
    """Subclasses implement `ws_url()`, `on_message(data)` and may override `on_open()`."""

    #: seconds between heartbeat pings; a peer silent for 2 intervals is dropped
    heartbeat = 20.0

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)
        self.backoff = Backoff(initial=0.5, maximum=30.0)
        self.ws: websocket.WebSocket | None = None
        self.healthy = False
        self._send_lock = threading.Lock()

    def start(self) -> None:
        self.prepare()
        self.spawn(self._loop, "ws")

    def prepare(self) -> None:
        """Checks and REST calls before connecting (who am I...); raise ChannelError."""

    def ws_url(self) -> str:
        raise NotImplementedError

    def ws_headers(self) -> list[str]:
        return []

    def on_open(self) -> None:
        """Called after each (re)connect: authenticate, subscribe..."""

    def on_message(self, data: Any) -> None:
        raise NotImplementedError

    def on_close(self, code: int, reason: str) -> None:
        """The server closed the socket with `code` (the base reconnects afterwards unless
        the adapter sets `stopping`: codes some platforms use for "never come back")."""

    def ws_send(self, payload: Any) -> None:
        """Send one JSON frame (serialised: reader and workers may both send)."""
        ws = self.ws
        if ws is None:
            return
        with self._send_lock:
            ws.send(json.dumps(payload))

    def _loop(self) -> None:
        link = Reconnects(self.ctx, self.backoff, "websocket failed: %s")
        while not self.stopping.is_set():
            try:
                ws = websocket.create_connection(self.ws_url(), header=self.ws_headers(),
                                                 timeout=self.heartbeat, enable_multithread=True)
                self.ws = ws
                self.on_open()
                self.healthy = True
                link.up()
                self._read(ws)
                raise RuntimeError("connection closed by the server")
            except Reconnect as exc:
                self.healthy = False
                if self.stopping.is_set():
                    break
                self.ctx.log.info("reconnecting: %s", exc)
            except Exception as exc:  # noqa: BLE001
                self.healthy = False
                if self.stopping.is_set():
                    break
                link.down(exc)
                self.backoff.wait(self.stopping)
            finally:
                ws, self.ws = self.ws, None
                _kill(ws)

    def _read(self, ws: websocket.WebSocket) -> None:
        last_seen = time.monotonic()
        while not self.stopping.is_set():
            try:
                opcode, data = ws.recv_data(control_frame=True)
            except websocket.WebSocketTimeoutException:
                if time.monotonic() - last_seen > 2 * self.heartbeat:
                    raise RuntimeError("no answer to heartbeat pings") from None
                with self._send_lock:
                    ws.ping()
                continue
            last_seen = time.monotonic()
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                code = int.from_bytes(data[:2], "big") if len(data) >= 2 else 1005
                self.on_close(code, data[2:].decode("utf-8", "replace"))
                return
            if opcode in (websocket.ABNF.OPCODE_TEXT, websocket.ABNF.OPCODE_BINARY):
                try:
                    message = jsonsafe.loads(data)
                except ValueError:
                    continue
                self.on_message(message)

    def close(self) -> None:
        _kill(self.ws)
        self.http.close()

    def health(self) -> bool:
        return self.healthy


def _kill(ws: websocket.WebSocket | None) -> None:
    """Close at once. shutdown() first: a bare close() leaves a recv() blocked in the
    reader thread waiting (and the TCP connection open) until its timeout."""
    if ws is None:
        return
    sock = ws.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    ws.shutdown()
