"""agentd/server/ws_socket.py exactly: the socket a hijacked WebSocket connection becomes, over a
real connected socket pair (the peer end plays the client). Timeout, whole writes, a peer
that vanished (one log line, at INFO during the handshake and DEBUG after it), close,
abort before and after a reader started, and the 1001 "going away" frame byte for byte.
The transport around it (waitress, flask-sock) is tests/server/test_websocket.py and, on the daemon's
own app, tests/api/test_sockets.py / tests/api/test_ws_daemon.py."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Iterator

import pytest

from agentd.server.ws_socket import SEND_TIMEOUT, WebSocketStream

WAIT = 10.0


@pytest.fixture
def pair() -> Iterator[tuple[WebSocketStream, socket.socket]]:
    a, peer = socket.socketpair()
    stream = WebSocketStream(fileno=os.dup(a.fileno()), peer="1.2.3.4:5")
    a.close()
    peer.settimeout(WAIT)
    yield stream, peer
    stream.close()
    peer.close()


def read_all(peer: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = peer.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_new_stream_keeps_a_send_timeout(pair) -> None:
    stream, _ = pair
    assert SEND_TIMEOUT == 60.0
    assert stream.gettimeout() == 60.0
    assert stream.peer == "1.2.3.4:5"
    assert stream.handshake_done is False
    assert stream.wait_closed(0) is False


def test_send_writes_everything_and_reports_its_length(pair) -> None:
    stream, peer = pair
    big = os.urandom(3 * 1024 * 1024)   # far past the socket buffers: several partial sends
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(read_exact(peer, len(big))))
    reader.start()
    assert stream.send(big) == len(big)
    reader.join(WAIT)
    assert got == [big]
    assert stream.handshake_done is True


def read_exact(peer: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = peer.recv(min(65536, n - len(data)))
        assert chunk
        data += chunk
    return data


def test_recv_reads_and_waits_through_timeouts(pair) -> None:
    stream, peer = pair
    peer.sendall(b"hello")
    assert stream.recv(5) == b"hello"
    stream.settimeout(0.05)   # an idle socket outlives its send timeout: recv waits again
    threading.Timer(0.4, peer.sendall, args=(b"later",)).start()
    assert stream.recv(100) == b"later"
    peer.sendall(b"abcdef")
    assert stream.recv(3) == b"abc"


def test_recv_after_close_or_abort_reads_as_closed(pair) -> None:
    stream, peer = pair
    stream.settimeout(0.05)
    threading.Timer(0.3, stream.going_away).start()   # marks it dead while recv waits
    started = time.monotonic()
    assert stream.recv(10) == b""
    assert time.monotonic() - started < WAIT
    assert stream.recv(10) == b"", "BUG: a dead stream read again"


def test_recv_on_a_closed_stream(pair) -> None:
    stream, peer = pair
    stream.settimeout(0.05)
    peer.sendall(b"unread")
    stream.close()
    assert stream.recv(10) == b"", "BUG: a closed stream handed out data"


def test_peer_gone_during_the_handshake_logs_info(pair, caplog) -> None:
    stream, peer = pair
    peer.close()
    caplog.set_level(logging.DEBUG, logger="agentd.ws.transport")
    stream.sendall(b"x" * 200_000)   # no exception
    records = [r for r in caplog.records if r.name == "agentd.ws.transport"]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert records[0].getMessage().startswith("websocket client 1.2.3.4:5 went away during the handshake: ")
    assert "[Errno" in records[0].getMessage(), "BUG: the log line does not say what failed"
    assert records[0].exc_info is None
    assert stream.handshake_done is False
    assert stream.recv(10) == b"", "BUG: a stream whose peer vanished still reads"
    caplog.clear()
    assert stream.send(b"more") == 4
    assert [r for r in caplog.records if r.name == "agentd.ws.transport"] == [], "BUG: a dead stream logs every write"


def test_peer_gone_after_the_handshake_logs_debug(pair, caplog) -> None:
    stream, peer = pair
    stream.sendall(b"HTTP/1.1 101\r\n\r\n")
    assert stream.handshake_done is True
    peer.close()
    caplog.set_level(logging.DEBUG, logger="agentd.ws.transport")
    stream.sendall(b"x" * 200_000)
    stream.sendall(b"x")
    records = [r for r in caplog.records if r.name == "agentd.ws.transport"]
    assert len(records) == 1 and records[0].levelno == logging.DEBUG
    assert records[0].getMessage().startswith("websocket client 1.2.3.4:5 gone while sending: ")


def test_dead_stand_in_fails_quietly() -> None:
    stream = WebSocketStream(peer="gone:1")
    try:
        assert stream.gettimeout() == 60.0
        assert stream.recv(10) == b""
        stream.sendall(b"x")
        assert stream.send(b"abc") == 3
        assert stream.handshake_done is False
        stream.going_away()   # nothing to send to
    finally:
        stream.abort()
    assert stream.wait_closed(0) is False   # its recv() made it a reader's socket: the reader closes it
    stream.close()
    fresh = WebSocketStream()
    fresh.abort()
    assert fresh.wait_closed(0) is True, "BUG: abort left an unused stand-in open"


def test_abort_before_a_reader_closes_the_socket(pair) -> None:
    stream, peer = pair
    stream.abort()
    assert stream.wait_closed(0) is True
    assert socket.socket.fileno(stream) == -1, "BUG: abort before any reader left the descriptor open"
    assert read_all(peer) == b"", "the peer sees the connection end"


def test_abort_after_a_reader_started_only_shuts_down(pair) -> None:
    stream, peer = pair
    fd = stream.fileno()   # a reader registers the descriptor: from now on it closes it
    assert fd >= 0
    stream.abort()
    assert stream.wait_closed(0) is False, "BUG: abort closed a socket a reader still uses"
    assert read_all(peer) == b""
    assert stream.recv(10) == b""    # the reader learns of the end and closes
    stream.close()
    assert stream.wait_closed(0) is True


def test_abort_after_recv_only_shuts_down(pair) -> None:
    stream, peer = pair
    peer.sendall(b"a")
    assert stream.recv(1) == b"a"
    stream.abort()
    assert stream.wait_closed(0) is False
    assert read_all(peer) == b""


def test_going_away_sends_close_1001_then_shuts_down(pair) -> None:
    stream, peer = pair
    stream.going_away()
    assert read_all(peer) == b"\x88\x02\x03\xe9"
    stream.sendall(b"after")   # the stream is dead: nothing more is written
    stream.going_away()
    assert stream.recv(10) == b""


def test_going_away_after_close_sends_nothing(pair) -> None:
    stream, peer = pair
    stream.close()
    stream.going_away()
    assert read_all(peer) == b""


def test_going_away_to_a_vanished_peer(pair) -> None:
    stream, peer = pair
    peer.close()
    stream.sendall(b"z" * 200_000)   # learns the peer is gone
    stream.going_away()   # already dead: returns quietly
    a, b = socket.socketpair()
    s = WebSocketStream(fileno=os.dup(a.fileno()))
    a.close()
    b.close()
    try:
        s.going_away()    # the write fails: no exception, still shut down and dead
        assert s.recv(1) == b""
    finally:
        s.close()


def tcp_pair() -> tuple[WebSocketStream, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=WAIT)
        server, _ = listener.accept()
    stream = WebSocketStream(fileno=os.dup(server.fileno()), peer="tcp")
    server.close()
    return stream, client


def test_flags_reach_the_socket() -> None:
    stream, peer = tcp_pair()
    try:
        stream.sendall(b"plain")   # default flags: ordinary data
        assert read_exact(peer, 5) == b"plain"
        peer.setblocking(False)   # urgent data does not make a socket readable: poll it directly
        assert stream.send(b"!", socket.MSG_OOB) == 1
        assert oob(peer) == b"!", "BUG: send() dropped its flags"
        stream.sendall(b"?", socket.MSG_OOB)
        assert oob(peer) == b"?", "BUG: sendall() dropped its flags"
    finally:
        stream.close()
        peer.close()


def oob(peer: socket.socket) -> bytes:
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return peer.recv(1, socket.MSG_OOB)
        except (BlockingIOError, OSError):
            if time.monotonic() > deadline:
                return b""
            time.sleep(0.02)


def test_default_flags_on_a_unix_pair(pair) -> None:
    stream, peer = pair
    stream.sendall(b"abc")   # MSG_OOB here would fail on a Unix socket
    assert read_exact(peer, 3) == b"abc"
    assert stream.handshake_done is True


def test_nothing_written_or_logged_after_going_away(pair, caplog) -> None:
    stream, peer = pair
    caplog.set_level(logging.DEBUG, logger="agentd.ws.transport")
    stream.going_away()
    stream.sendall(b"late")
    stream.going_away()
    assert [r for r in caplog.records if r.name == "agentd.ws.transport"] == [], \
        "BUG: a stream that said going-away still writes"
    assert read_all(peer) == b"\x88\x02\x03\xe9"


def test_log_line_names_the_error(pair, caplog) -> None:
    stream, peer = pair
    stream.sendall(b"101")
    peer.close()
    caplog.set_level(logging.DEBUG, logger="agentd.ws.transport")
    stream.sendall(b"x" * 200_000)
    (record,) = [r for r in caplog.records if r.name == "agentd.ws.transport"]
    assert "[Errno" in record.getMessage(), record.getMessage()


def test_recv_backstop_when_shutdown_could_not_wake_it(pair) -> None:
    # A dead stream is shut down, which wakes a waiting recv; should that shutdown fail
    # (a peer that reset), recv still returns "closed" at its next timeout, not data or a hang.
    stream, peer = pair
    stream.settimeout(0.05)
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.append(stream.recv(10)))
    t.start()
    time.sleep(0.2)
    stream._ws_dead = True   # the state a failed write leaves when its shutdown failed too
    t.join(WAIT)
    assert got == [b""]
