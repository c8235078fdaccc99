"""agentd/api/streaming.py exactly: a stream written in place (the daemon's way, waitress's
`write` in the environ) sends the same bytes as a pulled one, runs on the request's own
thread when the agent is idle, takes a worker's events when it is busy, refuses a full
queue before the stream starts, keeps quiet streams alive, ends a stopped run's stream at
once, stops the run of a client that left, and frees the agent and the stream slot of a
response closed before its run began. In process over the real kernel and the fake LLM
(real HTTP); `Wire` stands in for waitress's task.write. The daemon's own bytes are
checked in test_transports.py and test_proxy.py."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from waitress.channel import ClientDisconnected
from werkzeug.test import EnvironBuilder

from agentd.agents.events import Event
from agentd.api import create_app
from agentd.api.streaming import DIRECT_WRITE_KEY, KEEPER, StreamShape, WrittenStream
from agentd.config import parse_config
from agentd.kernel import Kernel
from support import with_test_db

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


class Env:
    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.app = create_app(kernel)
        self.client = self.app.test_client()
        self.count = 0

    def spawn(self, name: str):
        self.count += 1
        r = self.client.post("/api/agents", json={"manifest_toml": f'name = "{name}{self.count}"\n'},
                             environ_base=LOCAL)
        assert r.status_code == 201, r.get_data(as_text=True)
        return self.kernel.agents.get(r.get_json()["agent_id"])

    def v1(self, handle, text: str, wire: Wire | None, **kw):
        environ = {**LOCAL, DIRECT_WRITE_KEY: wire} if wire is not None else LOCAL
        return self.client.post("/v1/chat/completions", environ_base=environ, **kw,
                                json={"model": f"agentd:{handle.name}", "stream": True,
                                      "messages": [{"role": "user", "content": text}]})

    def sse(self, handle, text: str, wire: Wire | None, **kw):
        environ = {**LOCAL, DIRECT_WRITE_KEY: wire} if wire is not None else LOCAL
        return self.client.post(f"/api/agents/{handle.id}/message/stream", environ_base=environ, **kw,
                                json={"message": text})

    def free_slots(self) -> int:
        return self.kernel.stream_slots.total - self.kernel.stream_slots.in_use


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
def test_written_stream_sends_what_the_pulled_one_sends(env: Env, route: str) -> None:
    send = env.v1 if route == "v1" else env.sse
    # Two agents with one name length and no history: the same tokens, cost and bytes.
    pulled = send(env.spawn("same"), "[[chunks:3]]", None).get_data(as_text=True)
    handle = env.spawn("same")
    wire = Wire()
    r = send(handle, "[[chunks:3]]", wire)
    assert r.status_code == 200 and r.mimetype == "text/event-stream"
    # Nothing goes through the response iterator: every byte, the opening comment too, is written.
    assert r.get_data(as_text=True) == ""
    assert normal(wire.text()) == normal(pulled)
    closing = threading.Thread(target=r.close, daemon=True)  # a second release after the body's own
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


def test_each_event_is_written_as_the_run_emits_it_on_the_request_thread(env: Env) -> None:
    handle = env.spawn("inplace")
    wire = Wire()
    r = env.v1(handle, "[[chunks:4]]", wire)
    r.get_data()
    # Opening comment with the role chunk, four deltas, and the final chunk with [DONE], in
    # order; written as they came, deltas that arrived together in one write
    # (tests/test_held_writes.py), none after the final chunk.
    text = wire.text()
    assert text.startswith(": stream open\n\ndata: {")
    events = text.split("\n\n")[1:-1]
    assert events[0].endswith('"delta":{"role":"assistant"},"finish_reason":null}]}')
    assert [e.count('"content":') for e in events[1:5]] == [1, 1, 1, 1]
    assert events[-1] == "data: [DONE]" and '"finish_reason":"stop"' in events[-2]
    assert 2 <= len(wire.chunks) <= 6 and wire.chunks[-1].decode().endswith("data: [DONE]\n\n")
    assert set(wire.threads) == {threading.get_ident()}, "BUG: an idle agent's run left the request thread"
    settle(env, handle)


def test_a_busy_agents_stream_is_written_by_the_worker_that_runs_it(env: Env) -> None:
    handle = env.spawn("busy")
    first_wire, second_wire = Wire(), Wire()
    first = threading.Thread(target=lambda: env.sse(handle, "[[slow:1]] first", first_wire).get_data())
    first.start()
    deadline = time.monotonic() + WAIT
    while not handle.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    r = env.sse(handle, "[[reply:second]]", second_wire)
    r.get_data()
    first.join(WAIT)
    assert '"done":true' in first_wire.text()
    text = second_wire.text()
    assert 'event: chunk\ndata: {"content":"second","done":false}' in text
    assert text.rstrip().splitlines()[-2] == "event: done"
    # The worker wrote the run's events (its "streaming" phase at least: held writes go out
    # when the run waits for the model); the waiting thread the opening and, once the run
    # returned, the final event, with whatever the worker still held (the "done" phase).
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
    threads = [threading.Thread(target=lambda w=w: env.sse(handle, "[[slow:1.5]] hold", w).get_data())
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


def test_a_stop_ends_the_stream_at_once(env: Env) -> None:
    handle = env.spawn("stop")
    wire = Wire()
    done = threading.Event()

    def stream() -> None:
        env.sse(handle, "[[slow:30]] long", wire).get_data()
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
    r = env.v1(handle, "[[pace:400]] [[chunks:100]]", wire)  # 40 s, unless stopped
    assert r.get_data(as_text=True) == ""
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
        holder = threading.Thread(target=lambda: env.sse(handle, "[[slow:1]] hold", Wire()).get_data())
        holder.start()
        deadline = time.monotonic() + WAIT
        while not handle.busy and time.monotonic() < deadline:
            time.sleep(0.01)
    wire = Wire()
    # Straight through WSGI (the test client always starts the body): called, never iterated.
    environ = EnvironBuilder(f"/api/agents/{handle.id}/message/stream", method="POST",
                             json={"message": "[[reply:never]]"},
                             environ_base={**LOCAL, DIRECT_WRITE_KEY: wire}).get_environ()
    started: list[str] = []
    body = env.app(environ, lambda status, headers, exc_info=None: started.append(status))
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


def test_keepalive_after_the_heartbeat_and_not_while_events_come() -> None:
    wire = Wire()
    stream = WrittenStream(wire, shape(), heartbeat=0.6)
    stream.open()
    stream.tick()
    assert wire.text() == ": stream open\n\nO\n", "BUG: a keep-alive before the heartbeat passed"
    time.sleep(0.65)
    stream.tick()
    assert wire.text() == ": stream open\n\nO\nK\n"
    stream.tick()
    assert wire.text() == ": stream open\n\nO\nK\n", "BUG: keep-alives are not spaced by the heartbeat"
    time.sleep(0.4)
    stream.deliver(Event("text_delta"))  # 0.4 s after the keep-alive: the clock starts again here
    time.sleep(0.3)
    stream.tick()  # 0.7 s after the keep-alive, 0.3 s after the event
    assert wire.text() == ": stream open\n\nO\nK\ntext_delta\n", "BUG: an event did not reset the keep-alive clock"
    stream.deliver(Event("done"))
    assert wire.chunks[-1] == b"done\nC\n", "the final event and the closing go out in one write"
    time.sleep(0.65)
    stream.tick()
    stream.deliver(Event("late"))
    assert wire.text() == ": stream open\n\nO\nK\ntext_delta\ndone\nC\n", "BUG: written after the final event"


def test_events_before_the_opening_wait_for_it() -> None:
    wire = Wire()
    stream = WrittenStream(wire, shape(), heartbeat=0.0)
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
    stream = WrittenStream(wire, shape(), heartbeat=0.1)
    unregistered = WrittenStream(other, shape(), heartbeat=0.1)
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
    stream = WrittenStream(wire, shape(), heartbeat=100)
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
    written: list[bytes] = []

    def slow_write(data: bytes) -> None:
        entered.set()
        release.wait(WAIT)
        written.append(data)

    stream = WrittenStream(slow_write, shape(), heartbeat=0.0)
    stream._pending = None  # opened, without the opening's write
    writer = threading.Thread(target=stream.deliver, args=(Event("tool_result"),))
    writer.start()
    assert entered.wait(WAIT)
    stream.tick()  # returns at once: the lock is held by the write
    release.set()
    writer.join(WAIT)
    assert written == [b"tool_result\n"], "BUG: a keep-alive was written beside a write under way"


def test_a_gone_client_cancels_and_silences_the_stream() -> None:
    wire = Wire(gone_after=0)
    stream = WrittenStream(wire, shape(), heartbeat=0.0)
    stream.open()
    assert stream.cancel.is_set(), "BUG: a client that left did not stop the run"
    stream.deliver(Event("text_delta"))
    stream.tick()
    stream.deliver(Event("done"))
    assert wire.attempts == 1, "BUG: written again after the client was gone"


def test_nothing_is_written_after_finish() -> None:
    wire = Wire()
    stream = WrittenStream(wire, shape(), heartbeat=0.0)
    stream.open()
    wire.attempts = 0
    stream.finish()
    stream.deliver(Event("done"))
    stream.tick()
    assert wire.attempts == 0



@pytest.mark.parametrize("written", [False, True])
def test_streams_pass_the_run_options_and_attachments(env: Env, written: bool) -> None:
    handle = env.spawn("opts")
    r = env.client.post("/v1/chat/completions", environ_base=LOCAL if not written else
                        {**LOCAL, DIRECT_WRITE_KEY: (wire := Wire())},
                        json={"model": f"agentd:{handle.name}", "stream": True, "max_tokens": 17,
                              "temperature": 0.25, "messages": [{"role": "user", "content": "[[echo_params]]"}]})
    text = wire.text() if written else r.get_data(as_text=True)
    reply = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                    for line in text.splitlines()
                    if line.startswith("data: {") and json.loads(line[6:])["choices"])
    assert json.loads(reply)["max_tokens"] == 17 and json.loads(reply)["temperature"] == 0.25, \
        "BUG: the request's options did not reach the model"
    settle(env, handle)
    up = env.client.post(f"/api/agents/{handle.id}/upload", environ_base=LOCAL,
                         data={"file": (io.BytesIO(b"the attached words"), "note.txt", "text/plain")})
    assert up.status_code == 201, up.get_data(as_text=True)
    wire = Wire()
    r = env.client.post(f"/api/agents/{handle.id}/message/stream",
                        environ_base={**LOCAL, DIRECT_WRITE_KEY: wire} if written else LOCAL,
                        json={"message": "read this", "attachments": [{"file_id": up.get_json()["file_id"]}]})
    text = wire.text() if written else r.get_data(as_text=True)
    said = "".join(json.loads(line[6:])["content"] for line in text.splitlines()
                   if line.startswith('data: {"content"'))
    assert "the attached words" in said, "BUG: the attachment did not reach the model"
    settle(env, handle)


@pytest.mark.parametrize("written", [False, True])
def test_a_quiet_stream_gets_keepalives_and_then_its_answer(env: Env, written: bool) -> None:
    handles = [env.spawn("quiet"), env.spawn("quiet")]
    wires = [Wire(), Wire()]
    out: dict[int, str] = {}

    def stream(i: int) -> None:
        r = env.sse(handles[i], "[[slow:1.2]] [[reply:late]]", wires[i] if written else None)
        out[i] = r.get_data(as_text=True)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    for i in range(2):  # two streams at once: each gets its own keep-alives
        text = wires[i].text() if written else out[i]
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
    r = env.client.post(f"/api/agents/{handle.id}/message/stream", json={"message": "[[slow:60]] hi"},
                        environ_base={**LOCAL, DIRECT_WRITE_KEY: wire, "waitress.client_disconnected": gone.is_set})
    r.get_data()
    settle(env, handle)  # within WAIT, long before the model's 60 s
    assert "event: chunk" not in wire.text()
