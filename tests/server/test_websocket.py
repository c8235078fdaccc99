"""agentd.server.websocket: flask-sock WebSockets on a real waitress server.

This module tests the transport itself with hostile handlers the product does not have
(stubborn writers, two writer threads, handshake aborts). The daemon's own app -- the agent
socket and the echo socket of `python -m agentd start` -- is tested in tests/api/test_ws_daemon.py and
tests/api/test_transports.py.

One waitress server (via ws_transport.create_server) runs in a background
thread for the whole module; websocket-client and requests talk to it over
127.0.0.1. Nothing here asserts on wall-clock time: waits poll a condition
with a generous deadline.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
from types import SimpleNamespace
from typing import Any, Iterator

import psutil
import pytest
import requests
import websocket
from flask import Flask, Response, jsonify, request
from flask_sock import Sock
from simple_websocket import ConnectionClosed
from simple_websocket import Server as SimpleServer
from waitress import wasyncore
from wsproto.events import TextMessage

from agentd.server import websocket as ws_transport
from agentd.server.task import DISCONNECTED_KEY
from support import wait_until

WAIT = 10.0  # generous deadline for conditions that normally hold in milliseconds


# -- the app under test ------------------------------------------------------

class Hooks:
    """Events a test uses to steer or observe a handler."""

    def __init__(self) -> None:
        self.gate_arrived = threading.Event()
        self.gate_open = threading.Event()
        self.stubborn_done = threading.Event()
        self.held: list[Any] = []  # /held requests' disconnect checks
        self.release = threading.Event()


def make_app(hooks: Hooks) -> Flask:
    app = Flask(__name__)
    # A ping interval makes simple-websocket read through a selector (the daemon's read path;
    # /ws/echo-noping covers the other). It is an hour here, not the daemon's 25 s: a client
    # busy writing a big frame cannot answer a ping, and simple-websocket closes with 1008
    # ("Ping/Pong timeout") when no pong came back within one interval. On a loaded machine
    # (a nice-19 mutmut run) the 2 MB echo outlasted 25 s that way. Keepalive itself is
    # test_unanswered_pings_close_with_1008 (its own short interval).
    app.config["SOCK_SERVER_OPTIONS"] = {"ping_interval": 3600}
    sock = Sock(app)

    @app.before_request
    def gatekeeper() -> Any:
        if request.path == "/ws/private" and request.args.get("token") != "secret":
            # Rejected before flask-sock touches the socket: must stay plain HTTP.
            return jsonify(error="unauthorized"), 401
        if request.path == "/ws/gated":
            hooks.gate_arrived.set()
            hooks.gate_open.wait(WAIT)
        return None

    @app.get("/http")
    def plain() -> Any:
        return jsonify(ok=True, n=int(request.args.get("n", 0)))

    @app.get("/held")
    def held() -> Any:  # holds its worker until released, offering its disconnect check
        hooks.held.append(request.environ[DISCONNECTED_KEY])
        hooks.release.wait(WAIT)
        return jsonify(ok=True)

    @app.get("/short")
    def short() -> Response:  # promises 10 bytes, sends 3: waitress must close the connection
        return Response(iter([b"abc"]), headers={"Content-Length": "10"}, mimetype="text/plain")

    @app.get("/chunked")
    def chunked() -> Response:
        if request.args.get("fail"):
            def broken() -> Iterator[bytes]:
                yield b"part one"
                raise RuntimeError("cut off mid-body")
            return Response(broken(), mimetype="text/plain")
        return Response(iter([b"one ", b"two"]), mimetype="text/plain")

    def echo(ws: Any) -> None:
        while True:
            ws.send(ws.receive())

    for path in ("/ws/echo", "/ws/private", "/ws/gated"):
        sock.route(path, endpoint=path)(echo)

    @app.route("/ws/echo-noping", websocket=True)
    def echo_noping() -> Response:
        # simple-websocket without pings: its reader blocks in recv() instead
        # of a selector, exercising the other read path of the transport.
        ws = SimpleServer(request.environ)
        try:
            while True:
                ws.send(ws.receive())
        except ConnectionClosed:
            pass
        # A body after the upgrade must be discarded, and counted as written: in two chunks with
        # their full Content-Length, so waitress warns ("too few bytes") unless every chunk counts.
        body = [b"a body after the upgrade ", b"must be discarded"]
        return Response(iter(body), headers={"Content-Length": str(sum(map(len, body)))})

    @app.route("/ws/keepalive", websocket=True)
    def keepalive() -> str:
        # Pings every 0.2 s from simple-websocket's reader thread, written through the
        # transport's stream; a client that never answers is closed with 1008.
        ws = SimpleServer(request.environ, ping_interval=0.2)
        try:
            while True:
                ws.receive()
        except ConnectionClosed:
            pass
        return ""

    @sock.route("/ws/spam")
    def spam(ws: Any) -> None:
        n = 0
        while True:  # until the client is gone (ConnectionClosed)
            ws.send(f"spam {n}")
            n += 1

    @sock.route("/ws/once")
    def once(ws: Any) -> None:
        ws.send("bye")  # flask-sock then sends the close frame

    @sock.route("/ws/stubborn")
    def stubborn(ws: Any) -> None:
        ws.send("ready")
        try:
            while True:
                ws.receive()
        except ConnectionClosed:
            pass
        # The reader has closed the socket; a careless handler keeps writing.
        try:
            for _ in range(20):
                ws.sock.send(b"\x81\x01x")
        finally:
            hooks.stubborn_done.set()

    @sock.route("/ws/two-threads")
    def two_threads(ws: Any) -> None:
        count, size = (int(x) for x in ws.receive().split())
        # A small send buffer makes each big frame take several partial
        # send() calls: without the transport's lock they would interleave.
        ws.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        framing = threading.Lock()

        def pump(tag: str) -> None:
            for i in range(count):
                body = f"{tag}:{i}:" + tag * size
                # wsproto's framing state is not thread-safe, so frames are
                # built under a lock -- but written outside it, concurrently:
                # keeping those writes whole is the transport's job.
                with framing:
                    frame = ws.ws.send(TextMessage(data=body))
                ws.sock.send(frame)

        pumps = [threading.Thread(target=pump, args=(tag,)) for tag in "ab"]
        for t in pumps:
            t.start()
        for t in pumps:
            t.join()
        ws.send("done")
        ws.receive()  # until the client closes

    return app


# -- fixtures ----------------------------------------------------------------

class Capture(logging.Handler):
    """Collects warnings, errors, tracebacks and our transport's lines."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def problems(self) -> list[str]:
        # "waitress.queue" warns whenever a task waits for a worker thread
        # (e.g. right after start, before the workers are idle): load noise,
        # which agentd.daemon silences too.
        return [f"{r.name}: {r.getMessage()}" for r in self.records
                if (r.levelno >= logging.WARNING or r.exc_info) and r.name != "waitress.queue"]


class Server:
    def __init__(self, hooks: Hooks, **waitress_kwargs: Any) -> None:
        self.hooks = hooks
        options = dict(threads=48, connection_limit=200, asyncore_use_poll=True, ident="test")
        options.update(waitress_kwargs)
        self.waitress = ws_transport.create_server(
            make_app(hooks), host="127.0.0.1", port=0, **options)
        self.port = self.waitress.effective_port
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="test-waitress-loop", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        # The same shape as agentd.daemon's loop: short polls until told to stop.
        while not self._stop.is_set():
            wasyncore.loop(timeout=0.05, map=self.waitress._map, use_poll=True, count=1)

    def url(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    def http(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT)
        ws_transport.close_websockets(self.waitress)
        self.waitress.task_dispatcher.shutdown(timeout=WAIT)
        self.waitress.close()
        wasyncore.close_all(self.waitress._map)


@pytest.fixture(scope="module")
def capture() -> Iterator[Capture]:
    handler = Capture()
    root = logging.getLogger()
    transport_log = logging.getLogger("agentd.ws.transport")
    old_level = transport_log.level
    transport_log.setLevel(logging.DEBUG)
    root.addHandler(handler)
    thread_errors: list[str] = []
    old_hook = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        thread_errors.append(f"{args.thread.name if args.thread else '?'}: {args.exc_value!r}")

    threading.excepthook = hook
    handler.thread_errors = thread_errors  # type: ignore[attr-defined]
    yield handler
    threading.excepthook = old_hook
    root.removeHandler(handler)
    transport_log.setLevel(old_level)


@pytest.fixture(scope="module")
def server(capture: Capture) -> Iterator[Server]:
    srv = Server(Hooks())
    yield srv
    srv.stop()
    assert not srv._thread.is_alive()


@pytest.fixture(autouse=True)
def clean_logs(capture: Capture) -> Iterator[Capture]:
    """Every test: no warnings, no tracebacks, no thread died."""
    capture.records.clear()
    capture.thread_errors.clear()  # type: ignore[attr-defined]
    yield capture
    assert capture.problems() == []
    assert capture.thread_errors == []  # type: ignore[attr-defined]


# -- helpers -----------------------------------------------------------------



def connect(server: Server, path: str = "/ws/echo", **kwargs: Any) -> websocket.WebSocket:
    return websocket.create_connection(server.url(path), timeout=WAIT, **kwargs)


def http_ok(server: Server, n: int = 0) -> None:
    r = requests.get(server.http(f"/http?n={n}"), timeout=WAIT)
    assert r.status_code == 200 and r.json() == {"ok": True, "n": n}


def drop(ws: websocket.WebSocket, reset: bool = False) -> None:
    """Vanish without a close frame: FIN, or RST with reset=True."""
    if reset:
        ws.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ws.sock.close()


def upgrade_request(port: int, path: str) -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n").encode()


def read_head(sock: socket.socket) -> tuple[str, dict[str, str], bytes]:
    """A response's status line and headers off a raw socket, and the bytes read past them."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before the response headers"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    return lines[0], {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}, rest


def read_response(sock: socket.socket) -> tuple[str, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body, read off a raw socket."""
    status, headers, body = read_head(sock)
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside the response body"
        body += chunk
    return status, headers, body


def open_fds() -> int:
    return psutil.Process().num_fds()


# -- tests -------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/ws/echo", "/ws/echo-noping"])
def test_echo_round_trips(server: Server, path: str) -> None:
    ws = connect(server, path)
    try:
        for i in range(300):
            ws.send(f"message {i}")
            assert ws.recv() == f"message {i}"
        big = "x" * (2 * 1024 * 1024)  # several partial socket writes each way
        ws.send(big)
        assert ws.recv() == big
        ws.send_binary(bytes(range(256)))
        assert ws.recv() == bytes(range(256))
    finally:
        ws.close()
    http_ok(server)


def test_concurrent_sockets_with_plain_http(server: Server) -> None:
    sockets, messages = 24, 100
    errors: list[str] = []
    done = threading.Event()
    http_count = [0]

    def talk(k: int) -> None:
        try:
            ws = connect(server)
            try:
                for i in range(messages):
                    ws.send(f"{k}/{i}")
                    got = ws.recv()
                    if got != f"{k}/{i}":
                        errors.append(f"socket {k}: sent {k}/{i}, got {got!r}")
                        return
            finally:
                ws.close()
        except Exception as exc:  # reported below
            errors.append(f"socket {k}: {exc!r}")

    def browse() -> None:
        try:
            while not done.is_set():
                http_ok(server, http_count[0])
                http_count[0] += 1
        except Exception as exc:
            errors.append(f"http: {exc!r}")

    browser = threading.Thread(target=browse)
    talkers = [threading.Thread(target=talk, args=(k,)) for k in range(sockets)]
    browser.start()
    for t in talkers:
        t.start()
    for t in talkers:
        t.join(WAIT * 3)
    done.set()
    browser.join(WAIT)
    assert errors == []
    assert http_count[0] > 0
    wait_until(lambda: ws_transport.active_websockets(server.waitress) == 0, "handlers to finish")


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_abrupt_disconnect(server: Server, reset: bool) -> None:
    # Mid-conversation: a message in flight, its echo never read.
    ws = connect(server)
    ws.send("hello")
    assert ws.recv() == "hello"
    ws.send("never read")
    drop(ws, reset)
    # While the server is busy sending.
    spammer = connect(server, "/ws/spam")
    for _ in range(50):
        assert spammer.recv().startswith("spam ")
    drop(spammer, reset)

    wait_until(lambda: ws_transport.active_websockets(server.waitress) == 0, "handlers to finish")
    http_ok(server)
    again = connect(server)
    again.send("still here")
    assert again.recv() == "still here"
    again.close()


def test_handler_writing_after_reader_closed(server: Server) -> None:
    server.hooks.stubborn_done.clear()
    ws = connect(server, "/ws/stubborn")
    assert ws.recv() == "ready"
    drop(ws)
    assert server.hooks.stubborn_done.wait(WAIT)
    wait_until(lambda: ws_transport.active_websockets(server.waitress) == 0, "handler to finish")
    http_ok(server)


def test_client_gone_during_handshake(server: Server, capture: Capture) -> None:
    hooks = server.hooks
    hooks.gate_arrived.clear()
    hooks.gate_open.clear()
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    raw.sendall(upgrade_request(server.port, "/ws/gated"))
    assert hooks.gate_arrived.wait(WAIT)  # the app holds the request...
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()  # ...while the client resets the connection
    hooks.gate_open.set()

    def logged() -> bool:
        return any("during the handshake" in r.getMessage() for r in capture.records)

    wait_until(logged, "the one-line handshake log")
    wait_until(lambda: ws_transport.active_websockets(server.waitress) == 0, "handler to finish")
    line = [r for r in capture.records if "during the handshake" in r.getMessage()]
    assert len(line) == 1 and line[0].exc_info is None and line[0].levelno == logging.INFO
    http_ok(server)
    ws = connect(server)
    ws.send("ok")
    assert ws.recv() == "ok"
    ws.close()


def test_rejected_upgrade_is_plain_http(server: Server) -> None:
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        connect(server, "/ws/private")
    assert info.value.status_code == 401

    # On one raw connection: the 401 is a normal response and the connection
    # keeps serving HTTP afterwards, i.e. it was never hijacked.
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    try:
        raw.sendall(upgrade_request(server.port, "/ws/private"))
        status, headers, body = read_response(raw)
        assert status == "HTTP/1.1 401 UNAUTHORIZED"
        assert json.loads(body) == {"error": "unauthorized"}
        assert headers.get("connection", "").lower() != "close"
        raw.sendall(f"GET /http?n=7 HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
        status, _, body = read_response(raw)
        assert status == "HTTP/1.1 200 OK" and json.loads(body) == {"ok": True, "n": 7}
    finally:
        raw.close()

    ws = connect(server, "/ws/private?token=secret")
    ws.send("authorised")
    assert ws.recv() == "authorised"
    ws.close()


def test_no_leaked_threads_or_fds(server: Server) -> None:
    http_ok(server)
    wait_until(lambda: ws_transport.active_websockets(server.waitress) == 0, "a quiet server")
    # The threads alive now, by identity: one of them (an earlier test's) may end meanwhile,
    # so a count would not tell the readers this test starts.
    base_threads, base_fds = set(threading.enumerate()), open_fds()

    def started() -> set[threading.Thread]:
        return set(threading.enumerate()) - base_threads

    clients = [connect(server, "/ws/echo-noping" if k % 2 else "/ws/echo") for k in range(20)]
    try:
        for k, ws in enumerate(clients):
            ws.send(f"hi {k}")
            assert ws.recv() == f"hi {k}"
        wait_until(lambda: ws_transport.active_websockets(server.waitress) == 20, "20 live sockets")
        assert len(started()) >= 20  # one reader thread each
    finally:
        for k, ws in enumerate(clients):  # a failure above must not leave them to the next test
            if k < 12:
                ws.close()
            else:
                drop(ws, reset=k % 2 == 0)

    wait_until(lambda: ws_transport.active_websockets(server.waitress) == 0, "handlers to finish")
    wait_until(lambda: len(started()) <= 1, "reader threads to exit")
    wait_until(lambda: open_fds() <= base_fds + 3, "descriptors to be closed")
    http_ok(server)


def test_two_threads_sending_keep_frames_whole(server: Server) -> None:
    count, size = 40, 100_000
    ws = connect(server, "/ws/two-threads")
    try:
        ws.send(f"{count} {size}")
        seen = {"a": 0, "b": 0}
        while True:
            msg = ws.recv()
            if msg == "done":
                break
            tag, index, body = msg.split(":", 2)
            assert tag in seen, f"garbled frame starting {msg[:40]!r}"
            assert int(index) == seen[tag], "frames of one thread out of order or lost"
            assert body == tag * size, "frame payload damaged"
            seen[tag] += 1
        assert seen == {"a": count, "b": count}
    finally:
        ws.close()


def test_close_websockets_for_shutdown(server: Server) -> None:
    ws = connect(server)
    ws.send("x")
    assert ws.recv() == "x"
    wait_until(lambda: ws_transport.active_websockets(server.waitress) == 1, "one live socket")
    assert ws_transport.close_websockets(server.waitress) == 1
    opcode, frame = ws.recv_data_frame(control_frame=True)
    assert opcode == websocket.ABNF.OPCODE_CLOSE
    assert struct.unpack("!H", frame.data[:2])[0] == 1001
    ws.shutdown()
    wait_until(lambda: ws_transport.active_websockets(server.waitress) == 0, "handler to finish")
    http_ok(server)


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """One unmasked server frame (opcode, payload) off a raw socket, payload under 126 bytes."""
    head = b""
    while len(head) < 2:
        chunk = sock.recv(2 - len(head))
        assert chunk, "connection closed inside a frame header"
        head += chunk
    assert head[1] < 126, f"unexpected frame header {head!r}"
    payload = b""
    while len(payload) < head[1]:
        chunk = sock.recv(head[1] - len(payload))
        assert chunk, "connection closed inside a frame"
        payload += chunk
    return head[0] & 0x0F, payload


def test_unanswered_pings_close_with_1008(server: Server) -> None:
    # The keepalive through the transport: simple-websocket's reader thread writes its pings
    # into the hijacked stream, and a client that never answers them (this raw socket) gets
    # the 1008 close after one unanswered interval, then EOF; the handler finishes.
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    try:
        raw.sendall(upgrade_request(server.port, "/ws/keepalive"))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = raw.recv(1)
            assert chunk, "connection closed before the 101"
            data += chunk
        assert data.startswith(b"HTTP/1.1 101 ")
        opcode, payload = read_frame(raw)
        assert (opcode, payload) == (websocket.ABNF.OPCODE_PING, b"")
        opcode, payload = read_frame(raw)
        assert opcode == websocket.ABNF.OPCODE_CLOSE
        assert struct.unpack("!H", payload[:2])[0] == 1008 and payload[2:] == b"Ping/Pong timeout"
        raw.settimeout(WAIT)
        while raw.recv(4096):
            pass   # EOF: the transport shut the socket down
    finally:
        raw.close()
    wait_until(lambda: ws_transport.active_websockets(server.waitress) == 0, "handler to finish")
    http_ok(server)


def test_install_is_per_server_and_idempotent() -> None:
    import waitress
    from waitress.channel import HTTPChannel

    app = Flask(__name__)
    plain = waitress.create_server(app, host="127.0.0.1", port=0)
    patched = waitress.create_server(app, host="127.0.0.1", port=0)
    try:
        assert ws_transport.install(patched) is patched
        registry = patched._agentd_ws_registry
        ws_transport.install(patched)
        assert patched._agentd_ws_registry is registry, "BUG: a second install forgets the open sockets"
        assert patched.channel_class is ws_transport.WebSocketChannel
        assert plain.channel_class is HTTPChannel  # waitress itself untouched
        assert HTTPChannel.task_class is not ws_transport.WebSocketTask
    finally:
        for srv in (plain, patched):
            srv.task_dispatcher.shutdown(timeout=WAIT)
            srv.close()
            wasyncore.close_all(srv._map)



def test_only_a_hijacked_channel_answers_the_main_loop_differently() -> None:
    """Until its hijack a channel polls as agentd's plain channels do (waitress's readable,
    the loop-flush writable: the main loop asks every channel on every turn); after it, never
    readable, writable only to be closed, and a read event reads nothing."""
    from waitress.channel import HTTPChannel

    from agentd.server.channel import LoopFlushChannel

    srv = ws_transport.create_server(Flask(__name__), host="127.0.0.1", port=0, threads=1)
    ours, theirs = socket.socketpair()
    try:
        channel = ws_transport.WebSocketChannel(srv, ours, ("127.0.0.1", 1), srv.adj, map={})
        assert type(channel).readable is HTTPChannel.readable
        assert type(channel).writable is LoopFlushChannel.writable
        assert channel.readable() is True and channel.writable() is False
        theirs.sendall(b"GET / HTTP/1.1\r\n")  # half a request: a read would buffer it
        channel.hijack()
        assert channel.ws_hijacked
        assert channel.readable() is False and channel.writable() is False
        channel.handle_read()
        assert ours.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"GET / HTTP/1.1\r\n"
        channel.close_when_flushed = True
        assert channel.writable() is True
        channel.close_when_flushed, channel.will_close = False, True
        assert channel.writable() is True
        channel.will_close = False
        assert channel.writable() is False
    finally:
        theirs.close()
        ours.close()
        srv.task_dispatcher.shutdown(timeout=WAIT)
        srv.close()
        wasyncore.close_all(srv._map)

def test_install_refuses_what_it_cannot_serve() -> None:
    import waitress
    from waitress.channel import HTTPChannel

    not_a_server = SimpleNamespace(name="x")
    with pytest.raises(TypeError) as info:
        ws_transport.install(not_a_server)
    assert str(info.value) == f"not a waitress server: {not_a_server!r}"
    with pytest.raises(TypeError) as info:   # a map without servers in it
        ws_transport.install(SimpleNamespace(map={3: SimpleNamespace(task_class=object)}))
    assert str(info.value).startswith("not a waitress server: namespace(map=")

    class Custom(HTTPChannel):
        pass

    class Ours(ws_transport.WebSocketChannel):
        pass

    srv = waitress.create_server(Flask(__name__), host="127.0.0.1", port=0)
    try:
        assert ws_transport.active_websockets(srv) == 0 and ws_transport.close_websockets(srv) == 0, \
            "BUG: a server without the transport has WebSockets"
        srv.channel_class = Custom
        with pytest.raises(TypeError) as info:
            ws_transport.install(srv)
        assert str(info.value) == f"server already uses a custom channel class {Custom!r}"
        assert srv.channel_class is Custom
        srv.channel_class = Ours   # already a WebSocket channel: kept
        assert ws_transport.install(srv) is srv and srv.channel_class is Ours
    finally:
        srv.task_dispatcher.shutdown(timeout=WAIT)
        srv.close()
        wasyncore.close_all(srv._map)


def test_multi_socket_server_shares_one_registry() -> None:
    # Two listen addresses: waitress returns a MultiSocketServer whose servers sit in its map.
    multi = ws_transport.create_server(make_app(Hooks()), listen="127.0.0.1:0 127.0.0.1:0", threads=5,
                                       asyncore_use_poll=True, ident="multi")
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            wasyncore.loop(timeout=0.05, map=multi.map, use_poll=True, count=1)

    thread = threading.Thread(target=loop, name="test-multi-loop", daemon=True)
    thread.start()
    clients: list[websocket.WebSocket] = []
    try:
        assert type(multi).__name__ == "MultiSocketServer" and multi.adj.threads == 5
        servers = [s for s in multi.map.values() if hasattr(s, "channel_class")]
        assert len(servers) == 2
        assert all(s.channel_class is ws_transport.WebSocketChannel for s in servers)
        for srv in servers:
            ws = websocket.create_connection(f"ws://127.0.0.1:{srv.effective_port}/ws/echo", timeout=WAIT)
            clients.append(ws)
            ws.send(f"via {srv.effective_port}")
            assert ws.recv() == f"via {srv.effective_port}"
        wait_until(lambda: ws_transport.active_websockets(multi) == 2, "both sockets counted on the multi server")
        assert ws_transport.install(multi) is multi   # again: the same registry, nothing forgotten
        assert ws_transport.active_websockets(multi) == 2
        assert ws_transport.close_websockets(multi) == 2
        for ws in clients:
            opcode, frame = ws.recv_data_frame(control_frame=True)
            assert opcode == websocket.ABNF.OPCODE_CLOSE and struct.unpack("!H", frame.data[:2])[0] == 1001
            ws.shutdown()
        wait_until(lambda: ws_transport.active_websockets(multi) == 0, "handlers to finish")
    finally:
        for ws in clients:
            ws.shutdown()
        stop.set()
        thread.join(WAIT)
        multi.task_dispatcher.shutdown(timeout=WAIT)
        wasyncore.close_all(multi.map)


def test_unresponsive_client_is_shut_down(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    # The handler returns and flask-sock sends its close frame, but the client
    # never answers it: after CLOSE_TIMEOUT the transport shuts the socket
    # down, so simple-websocket's reader exits instead of lingering.
    monkeypatch.setattr(ws_transport, "CLOSE_TIMEOUT", 0.2)
    ws = connect(server, "/ws/once")
    try:
        assert ws.recv() == "bye"
        data = b""
        while True:
            chunk = ws.sock.recv(4096)  # raw: websocket-client would answer the close
            if not chunk:
                break
            data += chunk
        assert data[:1] == b"\x88"  # the close frame, then EOF
    finally:
        ws.sock.close()
    wait_until(lambda: ws_transport.active_websockets(server.waitress) == 0, "handler to finish")


def test_request_lookahead_does_not_steal_frames() -> None:
    # With channel_request_lookahead waitress keeps reading a channel while its
    # task runs; a hijacked channel must still never be read again.
    srv = Server(Hooks(), threads=4, channel_request_lookahead=5)
    try:
        ws = connect(srv)
        for i in range(100):
            ws.send(f"m{i}")
            assert ws.recv() == f"m{i}"
        ws.close()
        http_ok(srv)
    finally:
        srv.stop()


def _task_on_a_socketpair(request_head: bytes, addr: tuple = ("127.0.0.1", 4711), app: Flask | None = None):
    """A WebSocketTask for `request_head` on a channel over one end of a socket pair."""
    from waitress.parser import HTTPRequestParser

    srv = ws_transport.create_server(app or Flask(__name__), host="127.0.0.1", port=0, threads=1)
    ours, theirs = socket.socketpair()
    channel = ws_transport.WebSocketChannel(srv, ours, addr, srv.adj, map={})
    parser = HTTPRequestParser(srv.adj)
    parser.received(request_head)
    task = ws_transport.WebSocketTask(channel, parser)

    def close() -> None:
        theirs.close()
        ours.close()
        srv.task_dispatcher.shutdown(timeout=WAIT)
        srv.close()
        wasyncore.close_all(srv._map)

    return task, channel, ours, close


UPGRADE_HEAD = b"GET /ws/x HTTP/1.1\r\nHost: a\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\n\r\n"


@pytest.mark.parametrize("addr, peer", [(("127.0.0.1", 4711), "127.0.0.1:4711"), (("::1", 4711, 0, 0), "::1:4711")])
def test_the_lazy_socket_hijacks_on_first_real_use_only(capture: Capture, addr: tuple, peer: str) -> None:
    task, channel, ours, close = _task_on_a_socketpair(UPGRADE_HEAD, addr)
    try:
        environ = task.get_environment()
        lazy = environ["werkzeug.socket"]
        assert task.get_environment()["werkzeug.socket"] is lazy  # one per task
        assert not hasattr(lazy, "__deepcopy__")  # a dunder probe does not take the connection
        with pytest.raises(AttributeError) as info:
            lazy.__not_there__  # noqa: B018
        assert str(info.value) == "__not_there__"
        assert repr(lazy) == "<lazy websocket for /ws/x>"
        assert not channel.ws_hijacked and not task.wrote_header
        fd = lazy.fileno()  # real use: the hijack
        assert channel.ws_hijacked and task.wrote_header is True and task.close_on_finish is True
        assert fd not in (-1, ours.fileno())  # a dup, never waitress's own descriptor
        assert task.hijack() is task._ws_stream and task._ws_stream.peer == peer
        assert not [r for r in capture.records if "handshake" in r.getMessage()]
        task._ws_stream.close()
    finally:
        close()


def test_a_plain_request_gets_no_lazy_socket() -> None:
    task, _channel, _ours, close = _task_on_a_socketpair(b"GET /ws/x HTTP/1.1\r\nHost: a\r\n\r\n")
    try:
        assert "werkzeug.socket" not in task.get_environment()
        assert task._ws_lazy is None
    finally:
        close()


def test_a_connection_gone_before_the_hijack_is_one_log_line(capture: Capture) -> None:
    task, channel, ours, close = _task_on_a_socketpair(UPGRADE_HEAD)
    try:
        lazy = task.get_environment()["werkzeug.socket"]
        ours.close()  # the descriptor is gone: nothing to dup
        lazy.fileno()  # the stand-in's: a connection that was already gone
        stream = task._ws_stream
        assert stream is not None and stream.peer == "127.0.0.1:4711"
        assert channel.ws_hijacked and task.wrote_header is True
        lines = [r for r in capture.records if "before the handshake" in r.getMessage()]
        assert len(lines) == 1 and lines[0].levelno == logging.INFO
        assert lines[0].getMessage().startswith("websocket client 127.0.0.1:4711 went away before the handshake: ")
        assert lines[0].getMessage() != "websocket client 127.0.0.1:4711 went away before the handshake: None"
    finally:
        close()


def _failing_app() -> Flask:
    app = Flask(__name__)

    def upgraded():
        request.environ["werkzeug.socket"].fileno()  # the hijack
        raise RuntimeError("handler broke")

    app.add_url_rule("/ws/x", view_func=upgraded, websocket=True)  # (as flask-sock registers them)

    @app.get("/plain")
    def plain():
        raise RuntimeError("plain broke")

    app.config["PROPAGATE_EXCEPTIONS"] = True
    return app


def test_a_handler_failing_after_the_upgrade_is_logged_not_answered(capture: Capture) -> None:
    task, _channel, _ours, close = _task_on_a_socketpair(UPGRADE_HEAD, app=_failing_app())
    try:
        task.execute()  # no exception: there is no HTTP left to answer with
        lines = [r for r in capture.records if "after the upgrade" in r.getMessage()]
        assert [r.getMessage() for r in lines] == ["websocket request /ws/x failed after the upgrade"]
        assert lines[0].levelno == logging.ERROR and lines[0].exc_info is not None
        assert task._ws_stream is not None
        capture.records[:] = [r for r in capture.records if r not in lines]  # expected, not a problem
    finally:
        close()


def test_a_plain_request_failing_is_waitresss_to_answer(capture: Capture) -> None:
    task, _channel, _ours, close = _task_on_a_socketpair(b"GET /plain HTTP/1.1\r\nHost: a\r\n\r\n",
                                                         app=_failing_app())
    try:
        with pytest.raises(RuntimeError, match="plain broke"):
            task.execute()
        assert not [r for r in capture.records if "after the upgrade" in r.getMessage()]
    finally:
        close()


def read_chunked(sock: socket.socket) -> tuple[str, dict[str, str], bytes]:
    """One chunked HTTP/1.1 response off a raw socket, up to and with its terminator."""
    status, headers, rest = read_head(sock)
    body = b""
    while True:
        while b"\r\n" not in rest:
            chunk = sock.recv(65536)
            assert chunk, "connection closed inside the chunked body"
            rest += chunk
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        while len(rest) < size + 2:
            chunk = sock.recv(65536)
            assert chunk, "connection closed inside a chunk"
            rest += chunk
        body, rest = body + rest[:size], rest[size + 2:]
        if size == 0:
            assert rest == b"", "bytes after the terminator"
            return status, headers, body


def test_a_chunked_response_keeps_its_connection(server: Server) -> None:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    try:
        for _ in range(2):
            raw.sendall(f"GET /chunked HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
            status, headers, body = read_chunked(raw)
            assert status == "HTTP/1.1 200 OK" and body == b"one two"
            assert headers["transfer-encoding"] == "chunked"
            assert "connection" not in headers, "BUG: a chunked response closes its keep-alive connection"
        raw.sendall(f"GET /http?n=3 HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
        status, _, body = read_response(raw)
        assert status == "HTTP/1.1 200 OK" and json.loads(body) == {"ok": True, "n": 3}
    finally:
        raw.close()


@pytest.mark.parametrize("request_line,extra", [("GET /chunked HTTP/1.1", "Connection: close\r\n"),
                                                ("GET /chunked HTTP/1.0", ""),
                                                ("HEAD /chunked HTTP/1.1", ""),
                                                ("GET /chunked?fail=1 HTTP/1.1", "")])
def test_a_chunked_response_still_closes_when_it_must(server: Server, request_line: str, extra: str,
                                                      capture: Capture) -> None:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    try:
        raw.sendall(f"{request_line}\r\nHost: 127.0.0.1:{server.port}\r\n{extra}\r\n".encode())
        data = b""
        while True:  # the server closes: read to the end
            chunk = raw.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        raw.close()
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    if "fail" in request_line:
        assert b"part one" in data and not data.endswith(b"0\r\n\r\n"), \
            "BUG: a body cut off by an error looked complete"
        wait_until(lambda: any("cut off mid-body" in str(r.exc_info) for r in capture.records),
                   "the error logged")
        capture.records.clear()  # that traceback is this case's point
    elif request_line.startswith("HEAD"):
        assert data.endswith(b"\r\n\r\n") and "connection: close" in head.lower()
    else:
        assert "connection: close" in head.lower() or request_line.endswith("1.0")


def test_a_short_body_after_a_chunked_one_still_closes(server: Server, capture: Capture) -> None:
    """The kept-alive chunked response skips one close only; a later one still happens."""
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    try:
        raw.sendall(f"GET /chunked HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
        assert read_chunked(raw)[2] == b"one two"
        raw.sendall(f"GET /short HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
        data = b""
        while True:
            chunk = raw.recv(65536)
            if not chunk:
                break  # closed: the client is not left waiting for the 7 missing bytes
            data += chunk
    finally:
        raw.close()
    assert data.endswith(b"\r\n\r\nabc")
    wait_until(lambda: any("too few bytes" in r.getMessage() for r in capture.records), "waitress's warning")
    capture.records.clear()  # that warning is this test's point


# -- telling a running request that its client left ---------------------------------------------------

def _held(server: Server) -> tuple[socket.socket, Any]:
    """A raw connection whose GET /held is running; and that request's disconnect check."""
    server.hooks.release.clear()
    before = len(server.hooks.held)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    sock.sendall(b"GET /held HTTP/1.1\r\nHost: t\r\n\r\n")
    wait_until(lambda: len(server.hooks.held) > before, WAIT)
    return sock, server.hooks.held[-1]


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_a_running_request_learns_that_its_client_left(server: Server, reset: bool) -> None:
    sock, gone = _held(server)
    try:
        assert gone() is False
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        wait_until(gone, WAIT)
        assert gone() is True  # and stays so
    finally:
        server.hooks.release.set()
    http_ok(server)


def test_a_client_still_there_is_not_taken_for_gone(server: Server) -> None:
    sock, gone = _held(server)
    try:
        assert gone() is False
        # A pipelined request waits unread: the check looks without taking it.
        sock.sendall(b"GET /http?n=7 HTTP/1.1\r\nHost: t\r\n\r\n")
        time.sleep(0.2)
        assert gone() is False
        server.hooks.release.set()
        stream = sock.makefile("rb")  # both answers may come in one read
        answers = []
        for _ in range(2):
            status = stream.readline()
            headers = dict(line.decode().lower().split(":", 1) for line in iter(stream.readline, b"\r\n"))
            answers.append((status[:12], json.loads(stream.read(int(headers["content-length"])))))
        assert answers == [(b"HTTP/1.1 200", {"ok": True}), (b"HTTP/1.1 200", {"ok": True, "n": 7})]
    finally:
        server.hooks.release.set()
        sock.close()


def test_the_disconnect_check_trusts_a_closed_channel() -> None:
    task, channel, ours, close = _task_on_a_socketpair(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
    try:
        gone = task.get_environment()[DISCONNECTED_KEY]
        assert gone() is False
        channel.connected = False  # waitress itself saw the client go
        assert gone() is True
        channel.connected = True
        ours.close()  # the socket closed under the request
        assert gone() is True
    finally:
        close()
