"""A message's bytes leave in as few socket writes as they can: the answer's head with its
first body bytes (agentd/server/task.py, WriteTask.write) and a model request's head with
its body (llm/drivers/guard.py, _OneWrite). Each write is a socket send, about 20-35 µs of
CPU on loopback, so these are counted here, call by call, not timed.
"""

from __future__ import annotations

import gc
import socket
import threading
import weakref
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from waitress.adjustments import Adjustments
from waitress.parser import HTTPRequestParser

from agentd.server.task import DISCONNECTED_KEY, LAST_WRITE_KEY, WriteTask
from agentd.llm.drivers import reading
from agentd.llm.drivers import transport
from agentd.llm.drivers.guard import _TrackedHTTPConnection

# -- the answer: head and first body bytes -----------------------------------------------------------

ADJ = Adjustments()


class Channel:
    """What a waitress task uses of its channel, with every `write_soon` recorded."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.adj = ADJ
        self.server = SimpleNamespace(adj=ADJ)
        self.addr = ("127.0.0.1", 50000)
        self.creation_time = 0

    def write_soon(self, data: bytes) -> int:
        self.writes.append(bytes(data))
        return len(data)


def task(head: bytes = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n",
         headers: list[tuple[str, str]] | None = None) -> tuple[WriteTask, Channel]:
    request = HTTPRequestParser(ADJ)
    request.received(head)
    channel = Channel()
    t = WriteTask(channel, request)  # type: ignore[arg-type]
    t.status, t.complete = "200 OK", True
    t.response_headers = headers if headers is not None else [("Content-Type", "text/plain")]
    return t, channel


def test_the_head_leaves_with_the_first_body_bytes() -> None:
    t, channel = task()
    t.write(b"hello")
    t.write(b" world")
    assert len(channel.writes) == 2, "BUG: the head and the first chunk left in separate writes"
    head, _, first = channel.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Transfer-Encoding: chunked" in head
    assert first == b"5\r\nhello\r\n"
    assert channel.writes[1] == b"6\r\n world\r\n"
    assert t.channel is channel, "BUG: the task kept the stand-in channel"


def test_a_length_delimited_answer_is_one_write() -> None:
    t, channel = task(headers=[("Content-Type", "application/json"), ("Content-Length", "2")])
    t.content_length = 2
    t.write(b"{}")
    assert len(channel.writes) == 1 and channel.writes[0].endswith(b"\r\n\r\n{}")


def test_an_answer_without_a_body_writes_its_head_alone() -> None:
    t, channel = task()
    t.status = "204 No Content"
    t.write(b"ignored")
    assert len(channel.writes) == 1 and channel.writes[0].endswith(b"\r\n\r\n")
    assert b"ignored" not in channel.writes[0]


def test_an_empty_write_sends_the_head() -> None:
    t, channel = task()
    t.write(b"")
    assert len(channel.writes) == 1 and channel.writes[0].endswith(b"\r\n\r\n")
    t.write(b"x")
    assert channel.writes[1] == b"1\r\nx\r\n"


# -- the model request: head and body ----------------------------------------------------------------

class Sock:
    """A connected socket that records each `sendall`."""

    def __init__(self) -> None:
        self.sends: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sends.append(bytes(data))

    def settimeout(self, _timeout: Any) -> None:
        pass

    def close(self) -> None:
        pass


def connection() -> tuple[_TrackedHTTPConnection, Sock]:
    conn = _TrackedHTTPConnection("127.0.0.1", 9)
    conn.sock = sock = Sock()  # type: ignore[assignment]
    return conn, sock


def test_a_model_request_is_one_write() -> None:
    conn, sock = connection()
    conn.request("POST", "/v1/chat/completions", body=b'{"model": "m"}',
                 headers={"Content-Type": "application/json", "Content-Length": "14"})
    assert len(sock.sends) == 1, f"BUG: {len(sock.sends)} writes for one request"
    head, _, body = sock.sends[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and body == b'{"model": "m"}'


def test_a_chunked_request_is_one_write_with_its_terminator() -> None:
    conn, sock = connection()
    conn.request("POST", "/x", body=[b"ab", b"cd"], chunked=True)
    assert len(sock.sends) == 1
    assert sock.sends[0].endswith(b"\r\n\r\n2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n")


def test_a_body_past_the_limit_goes_out_as_it_comes() -> None:
    conn, sock = connection()
    big = b"x" * (_TrackedHTTPConnection.GATHER_BYTES + 1)
    conn.request("POST", "/x", body=big, headers={"Content-Length": str(len(big))})
    assert len(sock.sends) == 2 and sock.sends[1] == big and sock.sends[0].endswith(b"\r\n\r\n")
    assert conn._gathered is None


def test_a_request_of_exactly_the_limit_is_still_one_write() -> None:
    limit = _TrackedHTTPConnection.GATHER_BYTES
    conn, sock = connection()
    probe = b"p" * 60000  # (a body with as many length digits as the ones below)
    conn.request("POST", "/x", body=probe, headers={"Content-Length": str(len(probe))})
    head = len(sock.sends[0]) - len(probe)
    for size, writes in ((limit - head, 1), (limit - head + 1, 2)):
        conn, sock = connection()
        conn.request("POST", "/x", body=b"y" * size, headers={"Content-Length": str(size)})
        assert len(sock.sends) == writes, (size, [len(s) for s in sock.sends])
        assert b"".join(sock.sends).endswith(b"y" * size)


def test_every_gathered_piece_counts_toward_the_limit() -> None:
    # Two chunks that fit the limit together, but not with the head before them.
    conn, sock = connection()
    half = b"z" * 32740
    conn.request("POST", "/x", body=[half, half], chunked=True)
    # The head and the first chunk leave together, then the rest as it comes.
    assert [len(s) for s in sock.sends[1:]] == [32748, 5], [len(s) for s in sock.sends]
    assert sock.sends[0].endswith(b"\r\n\r\n7fe4\r\n" + half + b"\r\n")
    assert sock.sends[1] == b"7fe4\r\n" + half + b"\r\n" and sock.sends[2] == b"0\r\n\r\n"


def test_a_send_made_while_connecting_goes_out_first() -> None:
    # A proxy tunnel's CONNECT is sent from connect(), which runs inside the gathered send.
    class Tunnelled(_TrackedHTTPConnection):
        def connect(self) -> None:
            self.sock = self.recorder  # type: ignore[assignment]
            self.send(b"CONNECT up:443 HTTP/1.1\r\n\r\n")

    conn = Tunnelled("127.0.0.1", 9)
    conn.recorder = sock = Sock()  # type: ignore[attr-defined]
    conn.request("POST", "/x", body=b"{}", headers={"Content-Length": "2"})
    assert [s.split(b" ", 1)[0] for s in sock.sends] == [b"CONNECT", b"POST"]
    assert sock.sends[1].endswith(b"\r\n\r\n{}")


def test_a_request_that_fails_before_its_end_sends_nothing() -> None:
    conn, sock = connection()
    with pytest.raises(ValueError):
        conn.request("POST", "/x", body=b"{}", headers={"Bad\nName": "v"})
    assert sock.sends == []


def test_a_real_exchange_through_the_drivers_transport() -> None:
    # The bytes a server receives are the request, head and body, whatever the writes.
    listener = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data or not data.endswith(b"}"):
                data += conn.recv(65536)
            got.append(data)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1/chat/completions"
    response = transport.send_json(url, {"Authorization": "Bearer k"}, {"model": "m"}, timeout=(5, 5))
    assert response.status_code == 200 and reading.read_body(response) == b"{}"
    head, _, body = got[0].partition(b"\r\n\r\n")
    assert b"Authorization: Bearer k" in head and b"Content-Length: 14" in head
    assert body == b'{"model": "m"}'
    assert isinstance(response, requests.Response)


# -- the end of a streamed answer: its last bytes with the chunked terminator -----------------------

def test_the_last_bytes_leave_with_the_end_of_the_answer() -> None:
    t, channel = task()
    t.write(b"first")
    t.write_last(b"last")
    assert len(channel.writes) == 1, "BUG: the last bytes were sent before the end"
    t.finish()
    assert channel.writes[1:] == [b"4\r\nlast\r\n0\r\n\r\n"]


def test_last_bytes_with_nothing_before_them_leave_with_the_head_and_the_end() -> None:
    t, channel = task()
    t.write_last(b"only")
    t.finish()
    assert len(channel.writes) == 1
    assert channel.writes[0].endswith(b"\r\n\r\n4\r\nonly\r\n0\r\n\r\n")
    assert t.channel is channel


def test_an_answer_without_last_bytes_ends_as_waitress_ends_it() -> None:
    t, channel = task()
    t.write(b"x")
    t.finish()
    assert channel.writes[1:] == [b"0\r\n\r\n"]


def test_last_bytes_given_in_parts_leave_whole() -> None:
    t, channel = task()
    t.write(b"x")
    t.write_last(b"ab")
    t.write_last(b"cd")
    t.finish()
    assert channel.writes[1:] == [b"4\r\nabcd\r\n0\r\n\r\n"]


def test_the_task_offers_write_last_and_the_disconnect_check_to_the_app() -> None:
    # (`write` itself reaches the app as PEP 3333 says: `start_response` returns it.)
    t, channel = task()
    channel.server.server_name, channel.server.effective_port = "localhost", 8080  # type: ignore[attr-defined]
    channel.check_client_disconnected = lambda: False  # type: ignore[attr-defined]
    channel.socket = None  # type: ignore[attr-defined]
    environ = t.get_environment()
    assert callable(environ[DISCONNECTED_KEY])
    assert "agentd.write" not in environ
    t.write(b"x")
    environ[LAST_WRITE_KEY](b"ab")
    t.write_last(b"cd")
    t.finish()
    assert channel.writes[1:] == [b"4\r\nabcd\r\n0\r\n\r\n"], "BUG: the app's last bytes did not leave with the end"


def test_the_environ_does_not_keep_its_task_alive() -> None:
    # The task holds its environ: a value of the environ referring back to the task would
    # keep every answer's task, environ, request and buffers until the cycle collector ran.
    t, channel = task()
    channel.server.server_name, channel.server.effective_port = "localhost", 8080  # type: ignore[attr-defined]
    channel.check_client_disconnected = lambda: False  # type: ignore[attr-defined]
    channel.socket = None  # type: ignore[attr-defined]
    environ = t.get_environment()
    environ[LAST_WRITE_KEY](b"end")
    t.finish()
    assert channel.writes[0].endswith(b"3\r\nend\r\n0\r\n\r\n")
    task_ref, request_ref = weakref.ref(t), weakref.ref(t.request)
    gc.disable()
    try:
        del t, environ
        assert task_ref() is None, "BUG: the task outlived its last reference (a reference cycle)"
        assert request_ref() is None, "BUG: the request outlived its task"
    finally:
        gc.enable()
