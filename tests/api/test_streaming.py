"""agentd/api/streaming.py exactly: a run's stream is written as it goes with the server's
`write` callable (what `start_response` returns: waitress's task.write in the daemon, the
test client's buffer here), the same bytes under either; it runs on the request's own
thread when the agent is idle, takes a worker's events when it is busy, refuses a full
queue before the stream starts, keeps quiet streams alive, ends a stopped run's stream at
once, stops the run of a client that left, and frees the agent and the stream slot of a
response closed before its run began. Which writes leave together is decided here alone:
the opening of a run on this thread with its first event, the `done` phase with the final
event, each delta on its own. In process over the real kernel and the fake LLM (real
HTTP); `Wire` stands in for waitress's task.write (`Served` calls the app as waitress
does). The daemon's own chunks are read at the end, and in tests/api/test_transports.py and
tests/server/test_proxy.py."""

from __future__ import annotations

import io
import json
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waitress.channel import ClientDisconnected
from werkzeug.datastructures import Headers
from werkzeug.test import EnvironBuilder

from agentd.agents.events import Event
from agentd.api import create_app
from agentd.api.streaming import KEEPER, STALE_HOLD, StreamShape, WrittenStream
from agentd.config import parse_config
from agentd.kernel import Kernel
from agentd.server.task import LAST_WRITE_KEY
from support import Clock, Daemon, wait_until, with_test_db

LOCAL = {"REMOTE_ADDR": "127.0.0.1"}
WAIT = 15.0
MAX_STREAMS = 4
KEEPALIVE = 0.3


class Wire:
    """waitress's task.write, recorded: the bytes and the thread of every write."""

    def __init__(self, gone_after: int | None = None) -> None:
        self.chunks: list[bytes] = []
        self.threads: list[int] = []
        self.attempts = 0
        self.gone_after = gone_after  # writes that succeed before the client is gone

    def __call__(self, data: bytes) -> None:
        self.attempts += 1
        if self.gone_after is not None and len(self.chunks) >= self.gone_after:
            raise ClientDisconnected("client gone")
        self.chunks.append(data)
        self.threads.append(threading.get_ident())

    def text(self) -> str:
        return b"".join(self.chunks).decode()


class Served:
    """One POST straight through WSGI as waitress serves it: `start_response` returns
    `wire`, the body is iterated and then closed."""

    def __init__(self, app: Any, path: str, body: dict, wire: Wire, environ: dict | None = None) -> None:
        built = EnvironBuilder(path, method="POST", json=body,
                               environ_base={**LOCAL, **(environ or {})}).get_environ()
        self.status, self.headers = "", Headers()

        def start_response(status: str, headers: list, exc_info: Any = None) -> Wire:
            self.status, self.headers = status, Headers(headers)
            return wire

        self.iterable = app(built, start_response)
        try:
            self.body = b"".join(self.iterable)
        finally:
            self.iterable.close()

    @property
    def status_code(self) -> int:
        return int(self.status.split()[0])

    @property
    def mimetype(self) -> str:
        return self.headers.get("Content-Type", "").split(";")[0]

    def get_json(self) -> Any:
        return json.loads(self.body)


class Env:
    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.app = create_app(kernel)
        self.client = self.app.test_client()
        self.slots = self.app.extensions["agentd.stream_slots"]
        self.count = 0

    def spawn(self, name: str):
        self.count += 1
        r = self.client.post("/api/agents", json={"manifest_toml": f'name = "{name}{self.count}"\n'},
                             environ_base=LOCAL)
        assert r.status_code == 201, r.get_data(as_text=True)
        return self.kernel.agents.get(r.get_json()["agent_id"])

    def post(self, path: str, body: dict, wire: Wire | None, environ: dict | None = None):
        """Through the test client without `wire`, else as waitress calls the app."""
        if wire is None:
            return self.client.post(path, environ_base={**LOCAL, **(environ or {})}, json=body)
        return Served(self.app, path, body, wire, environ)

    def v1(self, handle, text: str, wire: Wire | None, **kw):
        return self.post("/v1/chat/completions", {"model": f"agentd:{handle.name}", "stream": True,
                                                  "messages": [{"role": "user", "content": text}]}, wire, **kw)

    def sse(self, handle, text: str, wire: Wire | None, **kw):
        return self.post(f"/api/agents/{handle.id}/message/stream", {"message": text}, wire, **kw)

    def free_slots(self) -> int:
        return self.slots.total - self.slots.in_use


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Env]:
    tmp_path = tmp_path_factory.mktemp("streaming")
    patch = pytest.MonkeyPatch()
    patch.setenv("OPENAI_API_KEY", "test-openai")
    data = {"api": {"rate_limit_per_second": 10000, "rate_limit_burst": 10000, "max_streams": MAX_STREAMS,
                    "sse_keepalive_secs": KEEPALIVE},
            "agents": {"max_queue": 1},
            "memory": {"auto_remember": False},
            "llm": {"timeout_secs": 20, "retries": 1},
            "default_model": {"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
            "provider_urls": {"openai": fake_llm.openai_base}}
    kernel = Kernel.open(parse_config(with_test_db(data, tmp_path), tmp_path))
    yield Env(kernel)
    kernel.close()
    patch.undo()


def normal(text: str) -> str:
    """A stream with its per-request ids and timestamps blanked."""
    text = re.sub(r'"id":"chatcmpl-[0-9a-f-]+"', '"id":"X"', text)
    text = re.sub(r'"model":"same\d+"', '"model":"same"', text)
    return re.sub(r'"created":\d+', '"created":0', text)


def settle(env: Env, handle) -> None:
    """Wait until the agent is idle again and every stream slot is back."""
    deadline = time.monotonic() + WAIT
    while (handle.busy or env.free_slots() != MAX_STREAMS) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not handle.busy, "BUG: the agent stayed busy after its stream ended"
    assert env.free_slots() == MAX_STREAMS, "BUG: a stream slot was not given back"
    assert KEEPER._watched == {}, "BUG: an ended stream is still kept alive"


@pytest.mark.parametrize("route", ["v1", "sse"])
def test_the_test_client_gets_the_bytes_the_servers_write_gets(env: Env, route: str) -> None:
    send = env.v1 if route == "v1" else env.sse
    # Two agents with one name length and no history: the same tokens, cost and bytes.
    handle = env.spawn("same")
    through_client = send(handle, "[[chunks:3]]", None)
    assert through_client.status_code == 200 and through_client.mimetype == "text/event-stream"
    assert through_client.headers["Cache-Control"] == "no-cache"
    assert through_client.headers["X-Accel-Buffering"] == "no"
    settle(env, handle)
    handle = env.spawn("same")
    wire = Wire()
    r = send(handle, "[[chunks:3]]", wire)
    assert r.status_code == 200 and r.mimetype == "text/event-stream"
    assert (r.headers["Cache-Control"], r.headers["X-Accel-Buffering"]) == ("no-cache", "no")
    # Nothing goes through the response iterator: every byte, the opening comment too, is written.
    assert r.body == b""
    assert normal(wire.text()) == normal(through_client.get_data(as_text=True))
    closing = threading.Thread(target=r.iterable.close, daemon=True)  # a second release after the body's own
    closing.start()
    closing.join(WAIT)
    assert not closing.is_alive(), "BUG: closing a finished stream's response hangs"
    if route == "v1":
        assert wire.text().endswith('"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
        assert wire.text().count('"content":') == 3
    else:
        assert wire.text().count("event: chunk\n") == 3
        assert "event: done\n" in wire.text()
    settle(env, handle)


def test_the_final_event_goes_with_the_servers_last_write(env: Env) -> None:
    handle = env.spawn("last")
    wire, last = Wire(), Wire()
    env.v1(handle, "[[reply:end]]", wire, environ={LAST_WRITE_KEY: last})
    # The daemon's server sends these bytes with the end of the chunked answer: one socket write.
    assert last.text().endswith("data: [DONE]\n\n") and len(last.chunks) == 1
    assert "[DONE]" not in wire.text()
    settle(env, handle)


def test_each_event_is_written_as_the_run_emits_it_on_the_request_thread(env: Env) -> None:
    handle = env.spawn("inplace")
    wire = Wire()
    env.v1(handle, "[[chunks:4]]", wire)
    # Opening comment with the role chunk, four deltas, and the final chunk with [DONE], in
    # order; written as they came, none after the final chunk.
    text = wire.text()
    assert text.startswith(": stream open\n\ndata: {")
    events = text.split("\n\n")[1:-1]
    assert events[0].endswith('"delta":{"role":"assistant"},"finish_reason":null}]}')
    assert [e.count('"content":') for e in events[1:5]] == [1, 1, 1, 1]
    assert events[-1] == "data: [DONE]" and '"finish_reason":"stop"' in events[-2]
    assert len(wire.chunks) == 6 and wire.chunks[-1].decode().endswith("data: [DONE]\n\n")
    assert [c.decode().count('"content":') for c in wire.chunks[1:5]] == [1, 1, 1, 1]
    assert set(wire.threads) == {threading.get_ident()}, "BUG: an idle agent's run left the request thread"
    settle(env, handle)


def runs_counted(env: Env, origin: str) -> float:
    """agentd_runs_total of `origin` (completed runs), as /metrics shows it."""
    text = env.client.get("/metrics", environ_base=LOCAL).get_data(as_text=True)
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "agentd_runs_total" and s.labels.get("origin") == origin
               and s.labels.get("outcome") == "completed")


def test_an_idle_agents_stream_opens_with_the_runs_first_event_and_counts_as_sse(env: Env) -> None:
    handle = env.spawn("opens")
    before = runs_counted(env, "sse")
    wire = Wire()
    env.sse(handle, "[[reply:hi]]", wire)
    # One write for the opening and the run's first event; on a loaded host the run may take
    # longer than STALE_HOLD to get there, and the keeper (another thread) writes the opening alone.
    assert wire.chunks[0].startswith(b": stream open\n\nevent: phase\n") or wire.threads[0] != threading.get_ident(), \
        f"BUG: the opening left on its own ahead of the run's first event: {wire.chunks[:2]!r}"
    wait_until(lambda: runs_counted(env, "sse") == before + 1, "the run counted under origin sse")
    settle(env, handle)


def test_a_busy_agents_stream_is_written_by_the_worker_that_runs_it(env: Env) -> None:
    handle = env.spawn("busy")
    first_wire, second_wire = Wire(), Wire()
    first = threading.Thread(target=lambda: env.sse(handle, "[[slow:1]] first", first_wire))
    first.start()
    deadline = time.monotonic() + WAIT
    while not handle.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    env.sse(handle, "[[reply:second]]", second_wire)
    first.join(WAIT)
    assert '"done":true' in first_wire.text()
    text = second_wire.text()
    assert 'event: chunk\ndata: {"content":"second","done":false}' in text
    assert text.rstrip().splitlines()[-2] == "event: done"
    # The worker wrote the run's events; the waiting thread the opening and, once the run
    # returned, the final event, with what the worker held (the "done" phase).
    me = threading.get_ident()
    writes = [(c.decode(), t) for c, t in zip(second_wire.chunks, second_wire.threads)]
    [(phase, worker)] = [(c, t) for c, t in writes if '"phase":"streaming"' in c]
    assert worker != me, "BUG: a queued run ran on the waiting thread"
    assert writes[0][0].startswith(": stream open") and writes[0][1] == me
    last, writer = writes[-1]
    assert writer == me and last.rstrip().splitlines()[-2] == "event: done"
    assert '"phase":"done"' in last and last.index('"phase":"done"') < last.index("event: done")
    settle(env, handle)


def test_a_full_queue_is_refused_before_the_stream_starts(env: Env) -> None:
    handle = env.spawn("full")
    wires = [Wire(), Wire()]
    threads = [threading.Thread(target=lambda w=w: env.sse(handle, "[[slow:1.5]] hold", w))
               for w in wires]
    threads[0].start()
    deadline = time.monotonic() + WAIT
    while not handle.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    threads[1].start()
    while len(handle.waiting) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    refused = Wire()
    r = env.sse(handle, "[[reply:third]]", refused)
    assert r.status_code == 429
    assert r.get_json() == {"error": f"agent {handle.name} is busy: 1 requests are already waiting for it "
                                     "(max_queue 1); try again later"}
    assert r.headers["Retry-After"] == "2"
    assert refused.chunks == [] and refused.attempts == 0
    for t in threads:
        t.join(WAIT)
    settle(env, handle)


def test_a_stream_that_would_wait_for_its_agent_leaves_the_reserved_slot_to_idle_agents(env: Env) -> None:
    busy = env.spawn("share")
    assert [env.slots.acquire() for _ in range(2)] == [True, True]  # two other streams: 2 of 4 slots
    first = threading.Thread(target=lambda: env.sse(busy, "[[slow:30]] hold", Wire()))
    try:
        first.start()
        wait_until(lambda: busy.busy, "the first stream's run")  # the third slot
        r = env.sse(busy, "[[reply:queued]]", None)
        assert (r.status_code, r.get_json(), r.headers["Retry-After"]) == \
            (503, {"error": "too many concurrent streams; try again shortly"}, "1")
        idle = env.spawn("share")
        r = env.sse(idle, "[[reply:now]]", None)  # the last slot, kept for runs that start at once
        assert r.status_code == 200 and 'event: chunk\ndata: {"content":"now","done":false}' in r.get_data(as_text=True)
    finally:
        env.kernel.agents.stop(busy)
        first.join(WAIT)
        env.slots.release()
        env.slots.release()
    settle(env, busy)


def test_a_streamed_message_joins_the_session_it_names(env: Env, fake_llm) -> None:
    handle = env.spawn("session")
    wire = Wire()
    env.post(f"/api/agents/{handle.id}/message/stream", {"message": "[[reply:streamed]] one", "session": "talk"},
             wire)
    assert 'data: {"content":"streamed","done":false}' in wire.text()
    mark = len(fake_llm.requests)
    r = env.client.post(f"/api/agents/{handle.id}/message", environ_base=LOCAL,
                        json={"message": "[[reply:plain]] two", "session": "talk"})
    assert r.status_code == 200 and r.get_json()["response"] == "plain"
    [asked] = fake_llm.requests[mark:]
    assert [(m["role"], m["content"]) for m in asked["json"]["messages"] if m["role"] != "system"] == [
        ("user", "[[reply:streamed]] one"), ("assistant", "streamed"), ("user", "[[reply:plain]] two")]
    settle(env, handle)


def test_a_stop_ends_the_stream_at_once(env: Env) -> None:
    handle = env.spawn("stop")
    wire = Wire()
    done = threading.Event()

    def stream() -> None:
        env.sse(handle, "[[slow:30]] long", wire)
        done.set()

    threading.Thread(target=stream, daemon=True).start()
    deadline = time.monotonic() + WAIT
    while handle.cancel is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert env.kernel.agents.stop(handle) is True
    assert done.wait(WAIT), "BUG: a stopped run's stream did not end"
    assert wire.text().endswith(
        'event: phase\ndata: {"phase":"cancelled","detail":"run stopped"}\n\n'
        'event: done\ndata: {"done":true,"stopped":true,"usage":{"input_tokens":0,"output_tokens":0}}\n\n')
    assert wire.text().count("event: done") == 1, "BUG: the run's own end was written after the stop"
    settle(env, handle)


def test_a_client_that_left_stops_its_run_and_nothing_more_is_written(env: Env) -> None:
    handle = env.spawn("left")
    wire = Wire(gone_after=1)  # the opening goes out; the first delta finds the client gone
    started = time.monotonic()
    r = env.v1(handle, "[[pace:400]] [[chunks:100]]", wire)  # 40 s, unless stopped
    assert time.monotonic() - started < WAIT, "BUG: the run of a client that left went on"
    assert r.body == b""
    assert len(wire.chunks) == 1 and wire.attempts == 2, (wire.chunks, wire.attempts)
    settle(env, handle)
    # The run stopped at its first write: the agent answers the next message at once.
    r = env.client.post(f"/api/agents/{handle.id}/message", json={"message": "[[reply:next]]"},
                        environ_base=LOCAL)
    assert r.status_code == 200 and r.get_json()["response"] == "next"


@pytest.mark.parametrize("busy", [False, True])
def test_a_response_closed_before_its_run_began_frees_the_agent_and_the_slot(env: Env, busy: bool) -> None:
    handle = env.spawn("closed")
    holder = None
    if busy:
        holder = threading.Thread(target=lambda: env.sse(handle, "[[slow:1]] hold", Wire()))
        holder.start()
        deadline = time.monotonic() + WAIT
        while not handle.busy and time.monotonic() < deadline:
            time.sleep(0.01)
    wire = Wire()
    # Straight through WSGI (the test client always starts the body): called, never iterated.
    environ = EnvironBuilder(f"/api/agents/{handle.id}/message/stream", method="POST",
                             json={"message": "[[reply:never]]"},
                             environ_base=LOCAL).get_environ()
    started: list[str] = []

    def start_response(status: str, headers: list, exc_info: Any = None) -> Wire:
        started.append(status)
        return wire

    body = env.app(environ, start_response)
    assert started == ["200 OK"]
    if busy:
        assert len(handle.waiting) == 1
    body.close()
    assert wire.chunks == []
    assert not handle.waiting, "BUG: an abandoned queued run is still waiting"
    if holder is not None:
        holder.join(WAIT)
    settle(env, handle)


# -- WrittenStream and the keeper ---------------------------------------------------------------------------

def shape() -> StreamShape:
    def render(event: Event) -> tuple[list[str], bool]:
        if event.type == "stopped":
            return ["S\n"], True
        return [f"{event.type}\n"], event.type == "done"
    return StreamShape(opening=("O\n",), render=render, keep_alive="K\n", closing=("C\n",))


def written(write: Any, heartbeat: float, clock: Clock | None = None) -> WrittenStream:
    stream = WrittenStream(shape(), heartbeat, clock or time.monotonic)
    stream.attach(write)
    return stream


def test_keepalive_after_the_heartbeat_and_not_while_events_come() -> None:
    wire, clock = Wire(), Clock()
    stream = written(wire, 1.0, clock)
    stream.open()
    clock.now = 1000.75
    stream.tick()
    assert wire.text() == ": stream open\n\nO\n", "BUG: a keep-alive before the heartbeat passed"
    clock.now = 1001.0
    stream.tick()
    assert wire.text() == ": stream open\n\nO\nK\n"
    stream.tick()
    assert wire.text() == ": stream open\n\nO\nK\n", "BUG: keep-alives are not spaced by the heartbeat"
    clock.now = 1001.5
    stream.deliver(Event("text_delta"))  # 0.5 s after the keep-alive: the clock starts again here
    clock.now = 1002.25
    stream.tick()  # 1.25 s after the keep-alive, 0.75 s after the event
    assert wire.text() == ": stream open\n\nO\nK\ntext_delta\n", "BUG: an event did not reset the keep-alive clock"
    clock.now = 1002.5
    stream.tick()
    assert wire.text() == ": stream open\n\nO\nK\ntext_delta\nK\n"
    stream.deliver(Event("done"))
    assert wire.chunks[-1] == b"done\nC\n", "the final event and the closing go out in one write"
    clock.now = 1004.0
    stream.tick()
    stream.deliver(Event("late"))
    assert wire.text() == ": stream open\n\nO\nK\ntext_delta\nK\ndone\nC\n", "BUG: written after the final event"


def test_events_before_the_opening_wait_for_it() -> None:
    wire = Wire()
    stream = written(wire, 0.0)
    stream.deliver(Event("text_delta"))  # a queued run's worker, ahead of the response
    stream.tick()
    stream.cancel.set()
    stream.tick()
    assert wire.attempts == 0, "BUG: written before the stream's opening"
    stream.open()
    assert wire.chunks == [b": stream open\n\nO\ntext_delta\n"]
    stream.deliver(Event("done"))
    assert wire.chunks[-1] == b"done\nC\n"


def test_the_keeper_writes_keepalives_of_registered_streams_only() -> None:
    wire, other = Wire(), Wire()
    stream = written(wire, 0.1)
    unregistered = written(other, 0.1)
    stream.open()
    unregistered.open()
    wire.chunks.clear()
    key = KEEPER.add_check(id(stream), stream.tick)
    try:
        deadline = time.monotonic() + WAIT
        while not wire.chunks and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        KEEPER.remove(key)
    assert wire.chunks and set(wire.chunks) == {b"K\n"}
    assert other.chunks == [b": stream open\n\nO\n"]
    assert KEEPER._thread is not None and KEEPER._thread.daemon and KEEPER._thread.name == "agentd-stream-keeper"


def test_a_stopped_run_is_ended_by_the_tick_once() -> None:
    wire = Wire()
    stream = written(wire, 100)
    stream.open()
    stream.tick()
    assert wire.chunks == [b": stream open\n\nO\n"]
    stream.cancel.set()
    stream.tick()
    stream.tick()
    stream.deliver(Event("stopped"))  # the run's own end, moments later
    assert wire.chunks[1:] == [b"S\nC\n"]


def test_a_tick_never_waits_for_a_write_under_way() -> None:
    release = threading.Event()
    entered = threading.Event()
    landed: list[bytes] = []

    def slow_write(data: bytes) -> None:
        entered.set()
        release.wait(WAIT)
        landed.append(data)

    stream = written(slow_write, 0.0)
    stream._pending = None  # opened, without the opening's write
    writer = threading.Thread(target=stream.deliver, args=(Event("tool_result"),))
    writer.start()
    assert entered.wait(WAIT)
    stream.tick()  # returns at once: the lock is held by the write
    release.set()
    writer.join(WAIT)
    assert landed == [b"tool_result\n"], "BUG: a keep-alive was written beside a write under way"


def test_a_gone_client_cancels_and_silences_the_stream() -> None:
    wire = Wire(gone_after=0)
    stream = written(wire, 0.0)
    stream.open()
    assert stream.cancel.is_set(), "BUG: a client that left did not stop the run"
    stream.deliver(Event("text_delta"))
    stream.tick()
    stream.deliver(Event("done"))
    assert wire.attempts == 1, "BUG: written again after the client was gone"


def test_nothing_is_written_after_finish() -> None:
    wire = Wire()
    stream = written(wire, 0.0)
    stream.open()
    wire.attempts = 0
    stream.finish()
    stream.deliver(Event("done"))
    stream.tick()
    assert wire.attempts == 0



# -- which writes leave together ----------------------------------------------------------------------------

class Writes:
    def __init__(self) -> None:
        self.writes: list[str] = []

    def __call__(self, data: bytes) -> None:
        self.writes.append(data.decode())


def labelled() -> StreamShape:
    def render(event: Event) -> tuple[list[str], bool]:
        if event.type == "hidden":
            return [], False
        label = event.data.get("phase", event.type)
        return [f"{label};"], event.type == "done"
    return StreamShape(opening=("O;",), render=render, keep_alive="K;", closing=("C;",))


def labelled_stream(wire: Writes, clock: Clock | None = None) -> WrittenStream:
    stream = WrittenStream(labelled(), 60, clock or time.monotonic)
    stream.attach(wire)
    return stream


def test_each_event_is_written_when_it_is_delivered() -> None:
    wire = Writes()
    stream = labelled_stream(wire)
    stream.open()
    assert wire.writes == [": stream open\n\nO;"]
    for event in (Event("phase", {"phase": "streaming"}), Event("text_delta"), Event("hidden"),
                  Event("tool_use"), Event("tool_args_delta"), Event("phase", {"phase": "thinking"}),
                  Event("tool_result"), Event("phase", {"phase": "tool_use"}), Event("text_delta")):
        stream.deliver(event)
    assert wire.writes[1:] == ["streaming;", "text_delta;", "tool_use;", "tool_args_delta;", "thinking;",
                               "tool_result;", "tool_use;", "text_delta;"]


def test_the_done_phase_leaves_with_the_final_event_through_the_last_write() -> None:
    wire, last = Writes(), Writes()
    stream = WrittenStream(labelled(), heartbeat=60)
    stream.attach(wire, last)
    stream.open()
    stream.deliver(Event("text_delta"))
    stream.deliver(Event("phase", {"phase": "done"}))
    assert wire.writes == [": stream open\n\nO;", "text_delta;"], "BUG: the done phase did not wait for the end"
    stream.deliver(Event("done"))
    assert last.writes == ["done;done;C;"] and len(wire.writes) == 2
    stream.tick()
    assert len(wire.writes) == 2 and len(last.writes) == 1


def test_without_a_last_write_the_final_event_goes_through_write() -> None:
    wire = Writes()
    stream = labelled_stream(wire)
    stream.open()
    stream.deliver(Event("phase", {"phase": "done"}))
    stream.deliver(Event("done"))
    assert wire.writes == [": stream open\n\nO;", "done;done;C;"]


def test_a_held_opening_leaves_with_the_runs_first_event() -> None:
    wire = Writes()
    stream = labelled_stream(wire)
    stream.deliver(Event("tool_result"))  # emitted before the response opened: waits for the opening
    stream.open(hold=True)
    assert wire.writes == []
    stream.deliver(Event("phase", {"phase": "streaming"}))
    assert wire.writes == [": stream open\n\nO;tool_result;streaming;"]


def test_a_held_opening_leaves_at_an_event_the_transport_does_not_show() -> None:
    # (/v1 shows no phase: its opening must not wait for the model's first token.)
    wire = Writes()
    stream = labelled_stream(wire)
    stream.open(hold=True)
    stream.deliver(Event("hidden"))
    assert wire.writes == [": stream open\n\nO;"]
    stream.deliver(Event("hidden"))
    assert len(wire.writes) == 1, "BUG: an event not shown wrote something"


def test_the_keeper_writes_what_was_held_once_it_is_a_poll_interval_old() -> None:
    wire, clock = Writes(), Clock(0.0)  # from 0: the age is STALE_HOLD exactly, not a rounding above it
    stream = labelled_stream(wire, clock)
    stream.open()
    stream.deliver(Event("phase", {"phase": "done"}))
    clock.now = STALE_HOLD * 0.9
    stream.tick()
    assert len(wire.writes) == 1, "BUG: the keeper raced the run's end"
    clock.now = STALE_HOLD
    stream.tick()
    assert wire.writes[1:] == ["done;"]
    stream.tick()
    assert len(wire.writes) == 2, "BUG: the keeper wrote again with nothing held"


def test_a_held_opening_is_aged_from_when_it_was_held() -> None:
    wire, clock = Writes(), Clock()
    stream = labelled_stream(wire, clock)
    stream.deliver(Event("text_delta"))
    clock.now = held = 1000.0 + 2 * STALE_HOLD  # waiting for the opening is not holding
    stream.open(hold=True)
    stream.tick()
    assert wire.writes == [], "BUG: the keeper wrote an opening just held"
    clock.now = held + STALE_HOLD / 2
    stream.deliver(Event("phase", {"phase": "done"}))  # held later: the first held chunk sets the age
    clock.now = held + STALE_HOLD
    stream.tick()
    assert wire.writes == [": stream open\n\nO;text_delta;done;"]


def test_nothing_held_is_written_after_finish() -> None:
    wire, clock = Writes(), Clock()
    stream = labelled_stream(wire, clock)
    stream.open()
    stream.deliver(Event("phase", {"phase": "done"}))
    stream.finish()
    clock.now = 1000.0 + 2 * STALE_HOLD
    stream.tick()
    assert wire.writes == [": stream open\n\nO;"]


@pytest.mark.parametrize("served", [False, True])
def test_streams_pass_the_run_options_and_attachments(env: Env, served: bool) -> None:
    handle = env.spawn("opts")
    wire = Wire() if served else None
    r = env.post("/v1/chat/completions", {"model": f"agentd:{handle.name}", "stream": True, "max_tokens": 17,
                                          "temperature": 0.25,
                                          "messages": [{"role": "user", "content": "[[echo_params]]"}]}, wire)
    text = wire.text() if wire is not None else r.get_data(as_text=True)
    reply = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                    for line in text.splitlines()
                    if line.startswith("data: {") and json.loads(line[6:])["choices"])
    assert json.loads(reply)["max_tokens"] == 17 and json.loads(reply)["temperature"] == 0.25, \
        "BUG: the request's options did not reach the model"
    settle(env, handle)
    up = env.client.post(f"/api/agents/{handle.id}/upload", environ_base=LOCAL,
                         data={"file": (io.BytesIO(b"the attached words"), "note.txt", "text/plain")})
    assert up.status_code == 201, up.get_data(as_text=True)
    wire = Wire() if served else None
    r = env.post(f"/api/agents/{handle.id}/message/stream",
                 {"message": "read this", "attachments": [{"file_id": up.get_json()["file_id"]}]}, wire)
    text = wire.text() if wire is not None else r.get_data(as_text=True)
    said = "".join(json.loads(line[6:])["content"] for line in text.splitlines()
                   if line.startswith('data: {"content"'))
    assert "the attached words" in said, "BUG: the attachment did not reach the model"
    settle(env, handle)


@pytest.mark.parametrize("served", [False, True])
def test_a_quiet_stream_gets_keepalives_and_then_its_answer(env: Env, served: bool) -> None:
    handles = [env.spawn("quiet"), env.spawn("quiet")]
    wires = [Wire(), Wire()]
    out: dict[int, str] = {}

    def stream(i: int) -> None:
        r = env.sse(handles[i], "[[slow:1.2]] [[reply:late]]", wires[i] if served else None)
        out[i] = "" if served else r.get_data(as_text=True)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    for i in range(2):  # two streams at once: each gets its own keep-alives
        text = wires[i].text() if served else out[i]
        before = text.split("event: chunk")[0]
        # 1.2 s of silence at 0.3 s: 3 or 4 (more on a slow machine), never one per 0.1 s tick.
        assert 2 <= before.count(": keep-alive\n\n") <= 8, f"BUG: keep-alives of a 1.2 s silence at 0.3 s: {text!r}"
        assert 'event: chunk\ndata: {"content":"late","done":false}' in text
        assert text.rstrip().splitlines()[-2] == "event: done", "BUG: a keep-alive ended the stream"
    for h in handles:
        settle(env, h)


def test_a_client_that_disconnects_while_the_model_is_silent_stops_the_run(env: Env) -> None:
    handle = env.spawn("silent")
    gone = threading.Event()
    threading.Timer(0.3, gone.set).start()
    wire = Wire()
    started = time.monotonic()
    env.sse(handle, "[[slow:60]] hi", wire, environ={"waitress.client_disconnected": gone.is_set})
    # Long before the model's 60 s and the model call's own limit (llm.timeout_secs, 20 s).
    assert time.monotonic() - started < WAIT, "BUG: a client that went away did not stop the run"
    assert "event: chunk" not in wire.text()
    assert wire.text().endswith('event: done\ndata: {"done":true,"stopped":true,'
                                '"usage":{"input_tokens":0,"output_tokens":0}}\n\n')
    settle(env, handle)


# -- through the daemon ------------------------------------------------------------------------------------

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


@pytest.mark.parametrize("pace", ["", " [[pace:300]]"])
def test_the_daemon_writes_a_chunk_per_event_and_the_end_in_one(agent_daemon: Daemon, pace: str) -> None:
    r = agent_daemon.post("/api/agents", json={"manifest_toml": f'name = "chunks{len(pace)}"\nprofile = "minimal"\n'})
    agent_id = r.json()["agent_id"]
    # A first run loads the driver modules: that may outlast the keeper's grace (STALE_HOLD),
    # which would write the opening on its own. This test is about runs after that.
    assert agent_daemon.post(f"/api/agents/{agent_id}/message", json={"message": "warm up"}).status_code == 200
    chunks = stream_chunks(agent_daemon, agent_id, "[[chunks:3]]" + pace)
    # The opening leaves with the run's first event, before the model is asked; on a loaded
    # host the run may take longer than the keeper's grace (STALE_HOLD) to get there, and the
    # keeper writes the opening alone (the holding itself is timed in the tests above).
    assert chunks[0].startswith(": stream open"), chunks
    if chunks[0] == ": stream open\n\n":
        chunks[:2] = [chunks[0] + chunks[1]]
    assert '"phase":"streaming"' in chunks[0], chunks
    # Each word in a chunk of its own, as it comes (at once, or 300 ms apart).
    words = [c for c in chunks if "event: chunk" in c]
    assert [c.count("event: chunk") for c in words] == [1, 1, 1], chunks
    # The phase that ends the run and the final event follow each other at once: one write.
    # Between them the run's end is stored; on a loaded host that may outlast the keeper's
    # grace too, and the keeper writes the phase alone.
    if chunks[-1].startswith("event: done\n") and chunks[-2].startswith('event: phase\ndata: {"phase":"done"'):
        chunks[-2:] = [chunks[-2] + chunks[-1]]
    assert chunks[-1].startswith('event: phase\ndata: {"phase":"done"') and "event: done" in chunks[-1], chunks
    assert len(chunks) == 5, chunks
