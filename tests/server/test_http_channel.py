"""agentd's HTTP channel: the main loop leaves a running request's output to the worker
writing it, and still sends what that worker could not (a full socket), through a real
waitress server and raw sockets."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Iterator

import pytest
from waitress import wasyncore

from agentd.server import websocket as ws_transport
from agentd.server.channel import LoopFlushChannel

CHUNK = 256 * 1024
CHUNKS = 8


def _channel(**adj: Any) -> tuple[LoopFlushChannel, socket.socket, Any]:
    srv = ws_transport.create_server(lambda environ, start: [], host="127.0.0.1", port=0, threads=1, **adj)
    ours, theirs = socket.socketpair()
    return ws_transport.WebSocketChannel(srv, ours, ("127.0.0.1", 1), srv.adj, map={}), theirs, srv


def _close(srv: Any, channel: LoopFlushChannel, *socks: socket.socket) -> None:
    channel.close()
    for s in socks:
        s.close()
    srv.task_dispatcher.shutdown(timeout=5)
    srv.close()


def test_a_running_requests_output_is_polled_for_only_when_its_writer_left_some() -> None:
    channel, theirs, srv = _channel()
    try:
        assert channel.writable() is False
        channel.requests.append(object())  # a request is being served
        channel.total_outbufs_len = 300  # its worker is writing 300 bytes right now
        assert channel.writable() is False, "BUG: the loop spins on output its worker is sending"
        channel.outbufs[-1].append(b"x" * 300)
        channel.total_outbufs_len = 300
        assert channel._flush_some() is True and channel.total_outbufs_len == 0
        assert channel.output_left is False and channel.writable() is False
        # The client stops reading: the writer's flush leaves the rest for the loop.
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        channel.outbufs[-1].append(b"y" * (4 * 1024 * 1024))
        channel.total_outbufs_len = 4 * 1024 * 1024
        channel._flush_some()
        assert 0 < channel.total_outbufs_len < 4 * 1024 * 1024
        assert channel.output_left is True and channel.writable(), "BUG: output a writer left is never sent"
        channel.total_outbufs_len = 0
        channel.output_left = False
        channel.will_close = True
        assert channel.writable() is True, "BUG: a channel to close is never woken"
    finally:
        _close(srv, channel, theirs)


@pytest.mark.filterwarnings("ignore:send_bytes will be removed:DeprecationWarning")
def test_with_a_larger_send_bytes_the_loop_sends_small_writes_as_waitress_does() -> None:
    channel, theirs, srv = _channel(send_bytes=2)
    try:
        channel.requests.append(object())
        channel.total_outbufs_len = 300
        assert channel.writable(), "BUG: writes waitress leaves to the loop are never sent"
    finally:
        _close(srv, channel, theirs)


def test_a_flush_to_a_peer_that_left_closes_the_channel() -> None:
    channel, theirs, srv = _channel()
    try:
        theirs.close()
        channel.requests.append(object())
        channel.outbufs[-1].append(b"x" * 300)
        channel.total_outbufs_len = 300
        channel._flush_some()
        assert channel.connected is False, "BUG: a send error no longer closes the channel"
    finally:
        _close(srv, channel)


def _stream(environ: dict[str, Any], start: Any) -> Iterator[bytes]:
    start("200 OK", [("Content-Type", "application/octet-stream"), ("Content-Length", str(CHUNK * CHUNKS))])
    for i in range(CHUNKS):
        yield bytes([65 + i]) * CHUNK


def test_a_slow_reader_gets_a_streamed_answer_larger_than_the_output_limit() -> None:
    """The worker writes 2 MB against a 64 KB output limit to a client that does not read
    at first: past the limit the worker waits for the main loop to send (waitress's
    `outbuf_high_watermark`), which it only does if the channel says its output was left."""
    srv = ws_transport.create_server(_stream, host="127.0.0.1", port=0, threads=2,
                                     outbuf_high_watermark=64 * 1024)
    # Small socket buffers on both ends (an accepted socket inherits the listener's), so
    # the 2 MB cannot all be taken by the kernel while the client does not read.
    srv.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
    loop = threading.Thread(target=wasyncore.loop, kwargs={"timeout": 0.05, "map": srv._map, "use_poll": True},
                            daemon=True)
    loop.start()
    client = socket.create_connection(("127.0.0.1", srv.effective_port), timeout=10)
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
        client.sendall(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        time.sleep(0.5)  # the socket fills up; the worker is left waiting on the loop
        received = bytearray()
        while b"\r\n\r\n" not in received or len(received.split(b"\r\n\r\n", 1)[1]) < CHUNK * CHUNKS:
            data = client.recv(65536)
            assert data, "BUG: the server closed before the whole answer"
            received += data
        body = bytes(received.split(b"\r\n\r\n", 1)[1])
        assert body == b"".join(bytes([65 + i]) * CHUNK for i in range(CHUNKS))
    finally:
        client.close()
        srv.task_dispatcher.shutdown(timeout=5)
        wasyncore.close_all(srv._map)


def test_the_server_layer_names_the_waitress_it_is_tested_with_and_the_tests_to_rerun() -> None:
    """agentd/server/ relies on waitress internals: its docstring names the version setup.cfg
    pins and the installed one, and each test file to run again for a new waitress exists."""
    import configparser
    import re
    from importlib.metadata import version
    from pathlib import Path

    import agentd.server

    root = Path(agentd.server.__file__).resolve().parents[2]
    setup = configparser.ConfigParser()
    setup.read(root / "setup.cfg")
    pinned = re.search(r"^waitress==(\S+)$", setup["options"]["install_requires"], re.M).group(1)
    doc = agentd.server.__doc__
    assert re.search(r"tested with waitress ([\d.]+)", doc).group(1) == pinned == version("waitress")
    named = re.findall(r"tests/[\w/]+\.py", doc)
    assert len(named) >= 5 and [n for n in named if not (root / n).is_file()] == []
