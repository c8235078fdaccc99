"""The socket a WebSocket handler gets once agentd.server.websocket hijacked its connection.

simple-websocket reads and writes an ``os.dup()`` of waitress's descriptor
through this class (see websocket.py for how the hijack works):

* The dup keeps a (long) timeout rather than blocking mode, because O_NONBLOCK
  lives on the open file shared by both descriptors; ``recv`` simply waits
  again when the timeout expires, so idle sockets stay open, while a client
  that stops reading fails a ``send`` after ``SEND_TIMEOUT`` seconds instead of
  pinning a thread forever.
* ``send``/``sendall`` are one full ``sendall`` under a lock, so frames written
  by several threads (the handler, simple-websocket's reader answering pings)
  never interleave on the wire and are never cut short by a partial send.
  Note that wsproto's *framing* state is not thread-safe either: an app that
  calls ``ws.send`` from several threads should still hold one lock around it
  (``agentd.api.sockets`` does).
* A peer that vanished (mid-handshake or later) costs one log line and no
  traceback: the failed write is dropped, the socket is shut down, and the
  handler learns of it through simple-websocket's ``ConnectionClosed``.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

__all__ = ["SEND_TIMEOUT", "WebSocketStream"]

log = logging.getLogger("agentd.ws.transport")

#: Socket timeout of a hijacked connection: bounds each send (recv just retries).
SEND_TIMEOUT = 60.0

# Close frame "1001 going away" as a server sends it (unmasked, 2-byte payload).
_GOING_AWAY_FRAME = b"\x88\x02\x03\xe9"


class WebSocketStream(socket.socket):
    """The dup'd connection simple-websocket reads and writes after the hijack."""

    def __init__(self, *, fileno: int | None = None, peer: str = "?",
                 headers: list[tuple[str, str]] | None = None) -> None:
        if fileno is None:
            # Stand-in for a connection that was already gone at hijack time:
            # an unconnected socket gives the selector a valid descriptor and
            # fails every operation, which simple-websocket treats as a close.
            super().__init__(socket.AF_INET, socket.SOCK_STREAM)
        else:
            super().__init__(fileno=fileno)
        # A timeout, not blocking mode: O_NONBLOCK is shared with waitress's
        # descriptor (same open file), and a timeout keeps it set.
        self.settimeout(SEND_TIMEOUT)
        self.peer = peer
        # Serialises every write and guards close/shutdown against a send in
        # flight: CPython reads the descriptor number before the syscall, so a
        # concurrent close could make that syscall hit a reused descriptor.
        self._ws_lock = threading.RLock()
        self._ws_closed = threading.Event()
        self._ws_dead = fileno is None
        self._ws_handshake_done = False
        self._ws_reader_started = False
        # The headers the app answered the handshake with (its request id...): they go into
        # the 101, which simple-websocket writes whole in the first send.
        self._ws_head = "".join(f"{name}: {value}\r\n" for name, value in headers or ()).encode("latin-1")

    # -- used by simple-websocket --------------------------------------------

    def fileno(self) -> int:
        # Only simple-websocket's reader calls this (to register a selector
        # when pings are on); from then on it may be waiting on the descriptor.
        with self._ws_lock:
            self._ws_reader_started = True
        return super().fileno()

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        with self._ws_lock:
            self._ws_reader_started = True
            if self._ws_dead or self._ws_closed.is_set():
                return b""  # simple-websocket reads this as "closed"
        while True:
            try:
                return super().recv(bufsize, flags)
            except TimeoutError:
                # The timeout exists for sends; an idle socket is fine.
                if self._ws_dead or self._ws_closed.is_set():
                    return b""

    def send(self, data: Any, flags: int = 0) -> int:
        # simple-websocket ignores the return value of send(), so a partial
        # send would truncate a frame: always write it all.
        self.sendall(data, flags)
        return len(data)

    def sendall(self, data: Any, flags: int = 0) -> None:
        with self._ws_lock:
            if self._ws_dead or self._ws_closed.is_set():
                return  # the peer is gone; the reader reports the close
            if not self._ws_handshake_done and self._ws_head:
                data = bytes(data).replace(b"\r\n\r\n", b"\r\n" + self._ws_head + b"\r\n", 1)
            try:
                super().sendall(data, flags)
            except OSError as exc:
                # A vanished client is routine: one line, no traceback, and
                # no exception into simple-websocket's reader thread (it would
                # die without closing the socket) or into the handler.
                if self._ws_handshake_done:
                    log.debug("websocket client %s gone while sending: %s", self.peer, exc)
                else:
                    log.info("websocket client %s went away during the handshake: %s",
                             self.peer, exc)
                self._ws_dead = True
                self._shutdown_locked()
                return
            self._ws_handshake_done = True

    def close(self) -> None:
        with self._ws_lock:
            super().close()
            self._ws_closed.set()

    # -- used by this module -------------------------------------------------

    def _shutdown_locked(self) -> None:
        if self._ws_closed.is_set():
            return
        try:
            super().shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already reset by the peer

    @property
    def handshake_done(self) -> bool:
        """Whether a write has gone through (the 101 response, at least)."""
        return self._ws_handshake_done

    def wait_closed(self, timeout: float) -> bool:
        """Wait until simple-websocket's reader has closed the socket."""
        return self._ws_closed.wait(timeout)

    def abort(self) -> None:
        """Shut the connection down so the reader thread wakes up and exits."""
        with self._ws_lock:
            self._shutdown_locked()
            if not self._ws_reader_started:
                # No reader thread ever used it (the handshake failed before
                # one started, or it has not run yet and will see "closed"),
                # so nobody else will close it.
                super().close()
                self._ws_closed.set()

    def going_away(self) -> None:
        """Send close 1001 and shut down (server shutdown)."""
        with self._ws_lock:
            if self._ws_dead or self._ws_closed.is_set():
                return
            try:
                super().sendall(_GOING_AWAY_FRAME)
            except OSError:
                pass
            self._ws_dead = True
            self._shutdown_locked()
