"""Line-socket base: a TCP connection (optional TLS) speaking CRLF lines, IRC style.

A reader thread feeds `handle_line()`; a writer thread drains the send queue at a
flood-safe pace (a burst, then one line per `send_interval`); the connection is
re-established with backoff when it drops.
"""

from __future__ import annotations

import queue
import socket
import ssl
import time

from agentd.channels.adapter import Adapter, ChannelError
from agentd.channels.bases.backoff import Reconnects
from agentd.channels.bases.duplex import DuplexSocket
from agentd.retry import Backoff


class LineSocketAdapter(Adapter):
    """Subclasses implement `address()`, `on_connect()` and `handle_line(line)`."""

    burst = 4
    send_interval = 0.5
    encoding = "utf-8"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.backoff = Backoff(initial=0.5, maximum=30.0)
        self.sock: DuplexSocket | None = None
        self.healthy = False
        self._outbox: "queue.Queue[bytes]" = queue.Queue(maxsize=1000)
        self.send_error = ""

    def address(self) -> tuple[str, int, bool, bool]:
        """(host, port, use_tls, verify_certificate)."""
        raise NotImplementedError

    def on_connect(self) -> None:
        """Send the greeting (NICK/USER...) right after connecting."""

    def handle_line(self, line: str) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self.spawn(self._loop, "reader")
        self.spawn(self._writer, "writer")

    def send_line(self, line: str, urgent: bool = False) -> None:
        """Queue one line (CR/LF stripped); `urgent` lines (PONG) skip the queue."""
        data = line.replace("\r", " ").replace("\n", " ").encode(self.encoding, "replace")[:510] + b"\r\n"
        if urgent:
            self._write(data)
        else:
            self._outbox.put_nowait(data)

    def _write(self, data: bytes) -> None:
        sock = self.sock
        if sock is None:
            raise ConnectionError("not connected")
        sock.sendall(data)

    def _connect(self) -> DuplexSocket:
        host, port, use_tls, verify = self.address()
        sock = socket.create_connection((host, port), timeout=15)
        if use_tls:
            context = ssl.create_default_context()
            if not verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            sock = context.wrap_socket(sock, server_hostname=host)
        return DuplexSocket(sock)  # the reader and the writer thread share it

    def _loop(self) -> None:
        link = Reconnects(self.ctx, self.backoff, "connection failed: %s")
        while not self.stopping.is_set():
            try:
                self.sock = self._connect()
                link.up()
                self.on_connect()
                buffer = b""
                while not self.stopping.is_set():
                    chunk = self.sock.recv(4096)
                    if not chunk:
                        raise ConnectionError("server closed the connection")
                    buffer += chunk
                    while b"\n" in buffer:
                        raw, buffer = buffer.split(b"\n", 1)
                        self.handle_line(raw.rstrip(b"\r").decode(self.encoding, "replace"))
            except Exception as exc:  # noqa: BLE001
                self.healthy = False
                if self.stopping.is_set():
                    break
                link.down(exc)
                self._drop()
                self.backoff.wait(self.stopping)
        self._drop()

    def _writer(self) -> None:
        tokens, last = float(self.burst), time.monotonic()
        while not self.stopping.is_set():
            try:
                data = self._outbox.get(timeout=0.2)
            except queue.Empty:
                continue
            now = time.monotonic()
            tokens = min(float(self.burst), tokens + (now - last) / self.send_interval)
            last = now
            if tokens < 1:
                if self.stopping.wait((1 - tokens) * self.send_interval):
                    return
                tokens, last = 1.0, time.monotonic()
            tokens -= 1
            try:
                self._write(data)
            except (OSError, ConnectionError) as exc:
                self.send_error = str(exc)
                self.ctx.log.warning("send failed: %s", exc)
            finally:
                self._outbox.task_done()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued line was written; ChannelError if one failed or time ran out."""
        self.send_error = ""
        deadline = time.monotonic() + timeout
        while self._outbox.unfinished_tasks and time.monotonic() < deadline:
            if self.stopping.wait(0.02):
                break
        if self._outbox.unfinished_tasks:
            raise ChannelError("lines still queued: not delivered in time")
        if self.send_error:
            raise ChannelError(f"send failed: {self.send_error}")

    def _drop(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def close(self) -> None:
        sock = self.sock
        if sock is not None:
            sock.shutdown()

    def health(self) -> bool:
        return self.healthy
