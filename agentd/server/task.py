"""How an answer leaves waitress: the WSGI task every request of the daemon runs as.

* The head goes with the first body bytes. waitress sends the header block and the first
  body bytes apart (each of its `write_soon`s sends at once, `send_bytes` being 1): two
  socket writes for every answer, each a send (on loopback also the receiver's TCP work).
* A chunked answer keeps its connection (an SSE stream would otherwise cost a new TCP
  connection per request).
* `write`, PEP 3333's write callable that `start_response` returns, is what a stream
  written as its run goes (agentd/api/streaming.py) writes with, from any thread, as it
  would under any WSGI server. `environ[LAST_WRITE_KEY]` takes an answer's last bytes:
  `finish` sends them with the chunked encoding's end, in one socket write instead of two.
* `environ[DISCONNECTED_KEY]` tells a running request that its client has gone
  (`peer_left`).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

from waitress.channel import ClientDisconnected, HTTPChannel
from waitress.task import WSGITask

#: The environ key of the answer's last bytes (`WriteTask.write_last`).
LAST_WRITE_KEY = "agentd.write_last"

#: The environ key of the check whether the client has gone (waitress's name for it).
DISCONNECTED_KEY = "waitress.client_disconnected"

#: What `write` raises once the client has gone (besides OSError).
ClientGone = ClientDisconnected


def peer_left(channel: HTTPChannel) -> Callable[[], bool]:
    """A check whether the client of `channel` has gone, for a request that is running.

    waitress only learns of it by reading the socket, which it does while a request runs
    only with `channel_request_lookahead`; that setting made its loop poll every busy
    channel and cost about a third of the daemon's CPU per request at 32 connections. This
    looks instead, when asked, without taking anything: an orderly close reads as end of
    file, a reset as an error. Bytes waiting (a pipelined request) mean the client is there."""
    def check() -> bool:
        if not channel.connected:
            return True
        try:
            return channel.socket.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except (OSError, AttributeError, ValueError):  # reset, or closed under us
            return True
    return check


class _Gathered:
    """The channel, but `write_soon` collects the bytes instead of sending them."""

    def __init__(self, channel: HTTPChannel) -> None:
        self._channel = channel
        self.parts: list[bytes] = []

    def write_soon(self, data: bytes) -> int:
        self.parts.append(data)
        return len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


class WriteTask(WSGITask):
    """waitress's WSGI task, writing an answer in as few socket writes as it can."""

    _framing_header = False  # inside build_response_header

    def build_response_header(self) -> bytes:
        self._framing_header = True
        try:
            return super().build_response_header()
        finally:
            self._framing_header = False

    def set_close_on_finish(self) -> None:
        # waitress closes the connection after every HTTP/1.1 response without a
        # Content-Length, chunked ones included (an SSE stream), so each streamed request
        # cost a new TCP connection. A chunked body is delimited by its terminator, which
        # `finish()` writes; a body cut off by an error still closes the connection (the
        # channel sets close_on_finish itself then). Only that one call is skipped: the
        # one build_response_header makes for a 1.1 request that did not ask to close. Not
        # for HEAD: waitress would still write the terminator, bytes a HEAD answer must not have.
        if (self._framing_header and self.version == "1.1" and self.request.command != "HEAD"
                and self.request.headers.get("CONNECTION", "").lower() != "close"):
            return
        super().set_close_on_finish()

    def __init__(self, channel: HTTPChannel, request: Any) -> None:
        super().__init__(channel, request)
        self._last: list[bytes] = []  # written by finish(), with the end of the answer

    def get_environment(self) -> dict[str, Any]:
        environ = super().get_environment()
        # Nothing in the environ refers back to the task (the task holds the environ), so an
        # answer's task, environ, request and buffers are freed as it ends, not left to the
        # cycle collector.
        environ[LAST_WRITE_KEY] = self._last.append
        environ[DISCONNECTED_KEY] = peer_left(self.channel)
        return environ

    def write(self, data: bytes) -> None:
        if self.wrote_header or not data:
            super().write(data)
            return
        with self._one_write():
            super().write(data)

    @contextmanager
    def _one_write(self) -> Iterator[None]:
        """What waitress writes meanwhile goes to the channel in one `write_soon`."""
        channel, gathered = self.channel, _Gathered(self.channel)
        self.channel = gathered  # type: ignore[assignment]
        try:
            yield
        finally:
            self.channel = channel
        if gathered.parts:
            channel.write_soon(b"".join(gathered.parts))

    def write_last(self, data: bytes) -> None:
        """The answer's last bytes: `finish` sends them with the chunked encoding's end (or
        the head, if none was sent), in one socket write instead of two."""
        self._last.append(data)

    def finish(self) -> None:
        last = b"".join(self._last)
        self._last.clear()
        with self._one_write():
            if last:
                self.write(last)
            super().finish()
