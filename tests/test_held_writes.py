"""Events a streamed run produces back to back leave in one write; nothing is held while
its thread waits (agentd/held_writes.py, api/streaming.py WrittenStream, the drivers' reads).

A write is a chunk on the wire (waitress frames every write of a streamed answer as one
HTTP chunk), so the daemon test below reads the chunks themselves.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from agentd import held_writes
from agentd.agents.events import Event
from agentd.api.streaming import STALE_HOLD, StreamShape, WrittenStream
from agentd.llm.drivers import reading
from agentd.llm.drivers import transport
from agentd.llm.drivers.guard import CallGuard
from support import Daemon

WAIT = 10.0


# -- held_writes ---------------------------------------------------------------------------------------

def test_before_wait_runs_what_this_thread_held_once_in_order() -> None:
    ran: list[str] = []
    first, second = (lambda: ran.append("first")), (lambda: ran.append("second"))
    held_writes.before_wait()  # nothing held: nothing happens
    held_writes.hold(first)
    held_writes.hold(second)
    held_writes.hold(first)  # held again before the wait: still once, in its first place
    held_writes.before_wait()
    assert ran == ["first", "second"]
    held_writes.before_wait()
    assert ran == ["first", "second"], "BUG: a flush ran again at the next wait"


def test_another_threads_wait_does_not_run_what_this_thread_held() -> None:
    ran: list[str] = []
    held_writes.hold(lambda: ran.append("mine"))
    other = threading.Thread(target=held_writes.before_wait)
    other.start()
    other.join(WAIT)
    assert ran == []
    held_writes.before_wait()
    assert ran == ["mine"]


# -- WrittenStream ------------------------------------------------------------------------------------

class Wire:
    def __init__(self) -> None:
        self.writes: list[str] = []

    def __call__(self, data: bytes) -> None:
        self.writes.append(data.decode())


def shape() -> StreamShape:
    def render(event: Event) -> tuple[list[str], bool]:
        if event.type == "hidden":
            return [], False
        label = event.data.get("phase", event.type)
        return [f"{label};"], event.type == "done"
    return StreamShape(opening=("O;",), render=render, keep_alive="K;", closing=("C;",))


@pytest.fixture
def wire() -> Wire:
    held_writes.before_wait()  # (nothing another test held on this thread)
    return Wire()


def test_events_followed_at_once_leave_together_when_the_thread_waits(wire: Wire) -> None:
    stream = WrittenStream(wire, shape(), heartbeat=60)
    stream.open()
    assert wire.writes == [": stream open\n\nO;"]
    for event in (Event("phase", {"phase": "streaming"}), Event("text_delta"), Event("hidden"),
                  Event("tool_use"), Event("tool_args_delta"), Event("tool_input"), Event("text_delta")):
        stream.deliver(event)
    assert len(wire.writes) == 1, "BUG: an event followed at once was written on its own"
    held_writes.before_wait()
    assert wire.writes[1:] == ["streaming;text_delta;tool_use;tool_args_delta;tool_input;text_delta;"]


def test_the_final_event_takes_what_is_held_with_it(wire: Wire) -> None:
    stream = WrittenStream(wire, shape(), heartbeat=60)
    stream.open()
    stream.deliver(Event("text_delta"))
    stream.deliver(Event("phase", {"phase": "done"}))
    stream.deliver(Event("done"))
    assert wire.writes[1:] == ["text_delta;done;done;C;"]
    held_writes.before_wait()  # the stream's flush, still held by this thread, writes nothing more
    assert len(wire.writes) == 2


@pytest.mark.parametrize("event", [Event("tool_result"), Event("phase", {"phase": "tool_use"}),
                                   Event("phase", {"phase": "awaiting_approval"}), Event("error")])
def test_an_event_before_a_wait_of_unknown_length_is_written_at_once(wire: Wire, event: Event) -> None:
    # (A tool runs, or a person decides, right after these: nothing may be held meanwhile.)
    stream = WrittenStream(wire, shape(), heartbeat=60)
    stream.open()
    stream.deliver(Event("text_delta"))
    stream.deliver(event)
    label = event.data.get("phase", event.type)
    assert wire.writes[1:] == [f"text_delta;{label};"]


def test_a_held_opening_leaves_with_the_first_events(wire: Wire) -> None:
    stream = WrittenStream(wire, shape(), heartbeat=60)
    stream.deliver(Event("tool_result"))  # emitted before the response opened: waits for the opening
    stream.open(hold=True)
    stream.deliver(Event("phase", {"phase": "streaming"}))
    assert wire.writes == []
    held_writes.before_wait()
    assert wire.writes == [": stream open\n\nO;tool_result;streaming;"]


def test_the_keeper_writes_what_a_thread_held_and_never_waited_after(wire: Wire) -> None:
    stream = WrittenStream(wire, shape(), heartbeat=60)
    stream.open()
    stream.deliver(Event("text_delta"))
    stream.tick()
    assert len(wire.writes) == 1, "BUG: the keeper raced a thread that is about to write what it holds"
    time.sleep(STALE_HOLD / 2)
    stream.deliver(Event("tool_use"))  # held later: the first held chunk sets the age
    time.sleep(STALE_HOLD / 2 + 0.02)
    stream.tick()
    assert wire.writes[1:] == ["text_delta;tool_use;"]
    stream.tick()
    assert len(wire.writes) == 2, "BUG: the keeper wrote again with nothing held"
    stream.deliver(Event("text_delta"))  # a new hold starts a new age
    stream.tick()
    assert len(wire.writes) == 2, "BUG: a new hold was written at once: its age was the old one's"
    time.sleep(STALE_HOLD + 0.02)
    stream.tick()
    assert wire.writes[2:] == ["text_delta;"]


def test_a_held_opening_is_aged_from_when_it_was_held(wire: Wire) -> None:
    stream = WrittenStream(wire, shape(), heartbeat=60)
    stream.deliver(Event("text_delta"))
    time.sleep(STALE_HOLD + 0.02)  # waiting for the opening is not holding
    stream.open(hold=True)
    stream.tick()
    assert wire.writes == [], "BUG: the keeper wrote an opening the thread had just held"
    time.sleep(STALE_HOLD + 0.02)
    stream.tick()
    assert wire.writes == [": stream open\n\nO;text_delta;"]


def test_nothing_held_is_written_after_finish(wire: Wire) -> None:
    stream = WrittenStream(wire, shape(), heartbeat=60)
    stream.open()
    stream.deliver(Event("text_delta"))
    stream.finish()
    held_writes.before_wait()
    stream.tick()
    assert wire.writes == [": stream open\n\nO;"]


# -- the drivers' waits ------------------------------------------------------------------------------

class OneAnswer:
    """A server on 127.0.0.1 answering one POST: `head` at once, `rest` once `go` is set."""

    def __init__(self, head: bytes, rest: bytes = b"") -> None:
        self.head, self.rest = head, rest
        self.go = threading.Event()
        self.log: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1/chat/completions"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            self.log.append("request arrived")
            conn.sendall(self.head)
            self.go.wait(WAIT)
            conn.sendall(self.rest)
        self.listener.close()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_a_model_request_leaves_after_what_the_thread_held() -> None:
    server = OneAnswer(HEAD + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    server.go.set()
    held_writes.hold(lambda: server.log.append("held events written"))
    ep = transport.ProviderEndpoint("acme", "openai", "http://x", timeout=WAIT)
    guard = CallGuard(time.monotonic() + WAIT, None, threading.Event())
    transport.post(ep, "m1", server.url, {}, {"stream": True}, guard).close()
    assert server.log == ["held events written", "request arrived"]


def test_a_body_read_writes_what_is_held_only_when_it_would_wait() -> None:
    # Two SSE chunks arrive with the head; the third only after the held events were written.
    server = OneAnswer(HEAD + chunk(b"data: a\n\n") + chunk(b"data: b\n\n"),
                       chunk(b"data: c\n\n") + b"0\r\n\r\n")
    response = transport.send_json(server.url, {}, {"stream": True}, timeout=(WAIT, WAIT))
    guard = CallGuard(time.monotonic() + WAIT, None, threading.Event())
    reads: list[bytes] = []
    flushed_after: list[int] = []

    def flush() -> None:
        flushed_after.append(len(reads))
        server.go.set()

    for data in reading.read_chunks(response, guard):
        reads.append(data)
        held_writes.hold(flush)  # this read's events, held
    assert b"".join(reads) == b"data: a\n\ndata: b\n\ndata: c\n\n"
    # Held over the reads that had their bytes already; written before the one that waited.
    # (The body's end was there with the third chunk: its events are still held.)
    assert flushed_after == [2], f"BUG: held events written after reads {flushed_after}"
    held_writes.before_wait()
    assert flushed_after == [2, 3]
    response.close()


def test_readable_now_is_false_without_a_buffered_plain_socket() -> None:
    server = OneAnswer(HEAD)
    response = transport.send_json(server.url, {}, {}, timeout=(WAIT, WAIT))
    assert reading.readable_now(response) is False  # the head came, no byte of the body
    server.go.set()
    response.close()


# -- through the daemon ------------------------------------------------------------------------------

def stream_chunks(daemon: Daemon, agent_id: str, message: str) -> list[str]:
    """POST a streamed message on a raw socket; the HTTP chunks of the answer, as sent."""
    body = ('{"message": "%s"}' % message).encode()
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=WAIT * 3) as s:
        s.sendall(f"POST /api/agents/{agent_id}/message/stream HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                  "Connection: close\r\n\r\n".encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head, head
    chunks = []
    while True:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return chunks
        chunks.append(rest[:n].decode())
        rest = rest[n + 2:]


def test_a_streamed_message_is_written_in_a_chunk_per_wait(agent_daemon: Daemon) -> None:
    r = agent_daemon.post("/api/agents", json={"manifest_toml": 'name = "held-writes"\nprofile = "minimal"\n'})
    agent_id = r.json()["agent_id"]
    # A first run loads the driver modules: that may outlast the keeper's grace (STALE_HOLD),
    # which would write the opening on its own. This test is about runs after that.
    assert agent_daemon.post(f"/api/agents/{agent_id}/message", json={"message": "warm up"}).status_code == 200
    # The fake provider sends each word 300 ms after the one before: each wait of the run for
    # the provider ends a write, so every word arrives in a chunk of its own, none held.
    chunks = stream_chunks(agent_daemon, agent_id, "[[chunks:3]] [[pace:300]]")
    assert chunks[0].startswith(": stream open") and '"phase":"streaming"' in chunks[0]
    words = [c for c in chunks if "event: chunk" in c]
    assert [c.count("event: chunk") for c in words] == [1, 1, 1], chunks
    # The phase that ends the run and the final event follow each other at once: one write.
    assert chunks[-1].startswith('event: phase\ndata: {"phase":"done"') and "event: done" in chunks[-1]
    assert len(chunks) == 5, chunks


def test_readable_now_with_a_length_delimited_body() -> None:
    server = OneAnswer(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    response = transport.send_json(server.url, {}, {}, timeout=(WAIT, WAIT))
    assert reading.readable_now(response) is True
    assert response.raw.read1(64) == b"{}"
    server.go.set()
    response.close()
