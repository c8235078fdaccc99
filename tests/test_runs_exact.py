"""agentd/api/runs.py exactly: the stream-slot cap and its messages, the final event of a
live run (done / stopped / error, every field), keep-alives, a client that goes away
(running run cancelled, queued run withdrawn), POST /stop ending a stream, and the
blocking path's slot accounting. In process over the real kernel, runs going to the
fake LLM over real HTTP; the transports built on it are tested through the daemon in
test_transports.py and test_ws_daemon.py."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Iterator

import pytest
from flask import Flask

from agentd.agents.events import Event, QueueSink
from agentd.agents.loop import RunCancelled
from agentd.agents.runs import RunRequest, RunTicket
from agentd.api import create_app, runs
from agentd.config import parse_config
from agentd.errors import AgentdError, TooManyRequests
from agentd.kernel import Kernel
from support import with_test_db

LOCAL = {"REMOTE_ADDR": "127.0.0.1"}
WAIT = 15.0


class Env:
    def __init__(self, kernel: Kernel, app: Flask) -> None:
        self.kernel = kernel
        self.app = app
        self.client = app.test_client()

    def spawn(self, name: str, extra: str = ""):
        self.count = getattr(self, "count", 0) + 1
        name = f"{name}{self.count}"
        r = self.client.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n' + extra}, environ_base=LOCAL)
        assert r.status_code == 201, r.get_data(as_text=True)
        return self.kernel.agents.get(r.get_json()["agent_id"])


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Env]:
    """One kernel for the module (agents have their own names; slots are given back)."""
    tmp_path = tmp_path_factory.mktemp("runs")
    patch = pytest.MonkeyPatch()
    patch.setenv("OPENAI_API_KEY", "test-openai")
    data = {"api": {"rate_limit_per_second": 10000, "rate_limit_burst": 10000, "max_streams": 2},
            "llm": {"timeout_secs": 10, "retries": 1},
            "default_model": {"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
            "provider_urls": {"openai": fake_llm.openai_base}}
    kernel = Kernel.open(parse_config(with_test_db(data, tmp_path), tmp_path))
    yield Env(kernel, create_app(kernel))
    kernel.close()
    patch.undo()


def live(env: Env, handle, text: str, attachments=None, disconnected=None) -> runs.LiveRun:
    environ = {} if disconnected is None else {"waitress.client_disconnected": disconnected}
    with env.app.test_request_context("/x", environ_base=environ):
        return runs.start_live_run(env.kernel, handle, text, attachments or [])


def drained(run: runs.LiveRun, heartbeat: float | None = None) -> list:
    return list(run.events(heartbeat))


def manual(env: Env, handle, heartbeat_secs: float = 100.0, disconnected=None) -> runs.LiveRun:
    """A LiveRun over a queue this test fills and a future it settles (no model call)."""
    ticket = RunTicket(env.kernel.runs, RunRequest(handle, ""), future=Future())
    return runs.LiveRun(QueueSink(), ticket, disconnected, heartbeat_secs)


# -- client_disconnected and the slot cap ------------------------------------------------------------------------

def test_client_disconnected_is_waitress_check(env: Env) -> None:
    def check() -> bool:
        return False

    with env.app.test_request_context("/x", environ_base={"waitress.client_disconnected": check}):
        assert runs.client_disconnected() is check
    with env.app.test_request_context("/x"):
        assert runs.client_disconnected() is None


def test_a_request_for_a_busy_agent_cannot_take_the_reserved_slots(env: Env) -> None:
    """max_streams = 2 here, so no share is reserved; with 8 there are 2 for idle agents."""
    from agentd.slots import Slots
    saved, env.kernel.stream_slots = env.kernel.stream_slots, Slots(8)
    handle = env.spawn("reserve")
    try:
        for _ in range(6):
            runs.acquire_stream_slot(env.kernel, handle=handle)
        handle.busy = True
        with pytest.raises(runs.TooManyStreams):
            runs.acquire_stream_slot(env.kernel, "queued behind a hung run", handle)
        handle.busy = False
        runs.acquire_stream_slot(env.kernel, handle=handle)   # an idle agent's run starts now
        runs.acquire_stream_slot(env.kernel)                   # (no agent: as idle)
        assert env.kernel.stream_slots.in_use == 8
    finally:
        handle.busy = False
        env.kernel.stream_slots = saved


def test_stream_slots_cap_at_max_streams(env: Env) -> None:
    slots = env.kernel.stream_slots
    runs.acquire_stream_slot(env.kernel)
    runs.acquire_stream_slot(env.kernel)
    with pytest.raises(runs.TooManyStreams) as info:
        runs.acquire_stream_slot(env.kernel)   # max_streams = 2: the third is refused at once
    assert (info.value.status, info.value.message, info.value.retry_after) == \
        (503, "too many concurrent streams; try again shortly", 1)
    with pytest.raises(runs.TooManyStreams) as info:
        runs.acquire_stream_slot(env.kernel, "custom text")
    assert info.value.message == "custom text"
    slots.release()
    runs.acquire_stream_slot(env.kernel)   # a freed slot is usable again
    slots.release()
    slots.release()


# -- the final event of a live run --------------------------------------------------------------------------------

def test_done_event_is_exact(env: Env) -> None:
    handle = env.spawn("done")
    run = live(env, handle, "[[reply:hello]]")
    events = drained(run)
    assert events[-1] == Event("done", {"response": "hello", "input_tokens": 7, "output_tokens": 1, "iterations": 1,
                                        "cost_usd": 2.75e-05, "finish_reason": "stop", "tool_calls": []})
    assert list(events[-1].data) == ["response", "input_tokens", "output_tokens", "iterations", "cost_usd",
                                     "finish_reason", "tool_calls"]
    assert Event("text_delta", {"content": "hello"}) in events
    assert None not in events, "BUG: a keep-alive within a second of a 100 s heartbeat"


def test_done_event_counts_tool_calls(env: Env) -> None:
    handle = env.spawn("tooler")
    done = drained(live(env, handle, "[[tool:agent_list {}]]"))[-1]
    assert done.type == "done"
    assert done.data["iterations"] == 2
    assert [(c["name"], c["arguments"]) for c in done.data["tool_calls"]] == [("agent_list", {})]


@pytest.mark.parametrize("text, status, retryable, kind", [
    ("[[fail:400]]", 500, False, "bad_request"), ("[[fail:429]]", 429, True, "rate_limit"),
    ("[[fail:503]]", 503, True, "server")])
def test_error_event_of_a_failed_model_call(env: Env, text: str, status: int, retryable: bool, kind: str) -> None:
    handle = env.spawn("failing")
    last = drained(live(env, handle, text))[-1]
    code = text[7:10]
    assert last == Event("error", {"message": f"message delivery failed: openai model gpt-4o: HTTP {code}: "
                                              f"fakellm: scripted failure {code}",
                                   "status": status, "retry_after": None, "code": None, "retryable": retryable,
                                   "kind": kind})


def test_error_event_carries_retry_after(env: Env) -> None:
    handle = env.spawn("later")
    last = drained(live(env, handle, "[[fail:429 retry_after=1]]"))[-1]
    assert last.type == "error"
    assert (last.data["status"], last.data["retry_after"], last.data["retryable"]) == (429, 1.0, True)


def test_error_event_of_agentd_and_internal_errors(env: Env) -> None:
    handle = env.spawn("bad")
    last = drained(live(env, handle, "hi", [{"bogus": 1}]))[-1]
    # An AgentdError that has no `retryable` (BadRequest) reads as not retryable.
    assert last == Event("error", {"message": "invalid file id: '' is not a UUID", "status": 400,
                                   "retry_after": None, "code": None, "retryable": False, "kind": None})
    last = drained(live(env, handle, "hi", "notalist"))[-1]   # type: ignore[arg-type]
    assert last == Event("error", {"message": "internal error: 'str' object has no attribute 'get'", "status": 500,
                                   "retry_after": None, "code": None, "retryable": False, "kind": None})



def test_error_event_carries_the_error_code() -> None:
    busy = TooManyRequests("agent a is busy", retry_after=2, code="agent_busy")
    assert runs.failure_event(busy) == Event("error", {"message": "agent a is busy", "status": 429,
                                                       "retry_after": 2, "code": "agent_busy",
                                                       "retryable": False, "kind": None})

def test_cancelled_run_ends_with_stopped(env: Env) -> None:
    handle = env.spawn("stopper")
    run = live(env, handle, "[[slow:5]] late")
    time.sleep(0.3)
    run.cancel.set()
    run.future.exception(timeout=WAIT)
    # The run's own end, read from the queue (events() might end first on the cancel flag).
    items = list(run.sink.events(0.1))
    assert items[-1] == Event("stopped", {"message": "run stopped"}), items
    assert isinstance(run.future.exception(), RunCancelled)


# -- events(): keep-alives, stop, disconnect ----------------------------------------------------------------------

def test_events_end_with_stopped_on_post_stop(env: Env) -> None:
    run = manual(env, env.spawn("m1"))
    run.sink(Event("text_delta", {"content": "a"}))
    run.cancel.set()    # POST /stop while the run has not ended yet
    got = []
    for event in run.events():
        got.append(event)
    assert got == [Event("text_delta", {"content": "a"}), Event("stopped", {"message": "run stopped"})]
    # Once the run has ended, the cancel flag is not a reason to stop: its own final events come.
    run = manual(env, env.spawn("m2"))
    run.cancel.set()
    run.future.set_result(None)
    run.sink(Event("done", {"response": "x"}))
    run.sink.finish()
    assert list(run.events()) == [Event("done", {"response": "x"})]


def test_keepalive_after_heartbeat_of_silence(env: Env) -> None:
    run = manual(env, env.spawn("hb"), heartbeat_secs=0.3)
    it = run.events()
    started = time.monotonic()
    assert next(it) is None, "BUG: no keep-alive after the heartbeat interval"
    assert time.monotonic() - started >= 0.3, "BUG: keep-alive before the heartbeat interval passed"
    run.sink(Event("x"))
    assert next(it) == Event("x")
    run.sink.finish()
    assert list(it) == []



def test_a_live_run_keeps_alive_at_the_configured_interval(env: Env, monkeypatch) -> None:
    monkeypatch.setattr(env.kernel.config.api, "sse_keepalive_secs", 0.3)
    run = live(env, env.spawn("hbcfg"), "[[slow:3]] late")
    try:
        quiet_since = time.monotonic()
        for event in run.events():
            if event is None:
                break
            assert event.type == "phase", f"BUG: the slow run ended ({event}) before any keep-alive"
            quiet_since = time.monotonic()
        # (The default heartbeat is 15 s: a keep-alive within the 3 s run is the configured one.)
        assert 0.3 <= time.monotonic() - quiet_since < 2.5
    finally:
        run.close()
        drained(run)

def test_explicit_heartbeat_overrides_the_configured_one(env: Env) -> None:
    run = manual(env, env.spawn("hb2"), heartbeat_secs=100.0)
    it = run.events(0.2)
    threading.Timer(3.0, run.sink.finish).start()   # a bound, should the keep-alive never come
    assert next(it) is None, "BUG: events(heartbeat) ignored its argument"
    run.sink.finish()


def test_keepalives_are_spaced_by_the_heartbeat(env: Env) -> None:
    run = manual(env, env.spawn("hb3"), heartbeat_secs=0.5)
    threading.Timer(2.0, run.sink.finish).start()
    nones = sum(1 for e in run.events() if e is None)
    # 2 s of silence at 0.5 s: 3 or 4 keep-alives; never one per 0.1 s poll.
    assert 1 <= nones <= 5, f"BUG: {nones} keep-alives in 2 s at a 0.5 s heartbeat"


def test_events_reset_the_keepalive_clock(env: Env) -> None:
    run = manual(env, env.spawn("hb4"), heartbeat_secs=0.6)
    stop = threading.Event()

    def feed() -> None:
        for i in range(8):
            if stop.wait(0.2):
                return
            run.sink(Event("tick", {"i": i}))
        run.sink.finish()

    threading.Thread(target=feed, daemon=True).start()
    got = list(run.events())
    stop.set()
    assert None not in got, "BUG: a keep-alive although events kept coming"
    assert [e.data["i"] for e in got] == list(range(8))


def test_disconnected_client_stops_the_stream_and_its_run(env: Env) -> None:
    handle = env.spawn("gone")
    left = threading.Event()
    run = live(env, handle, "[[slow:5]] hi", disconnected=left.is_set)
    assert run.disconnected is not None
    threading.Timer(0.3, left.set).start()
    got = drained(run)
    assert got == [] or all(e is None or e.type == "phase" for e in got), got
    assert run.cancel.is_set(), "BUG: a client that went away did not stop its run"
    assert isinstance(run.future.exception(timeout=WAIT), RunCancelled)


def test_connected_client_gets_every_event(env: Env) -> None:
    handle = env.spawn("stays")
    calls = []

    def check() -> bool:
        calls.append(1)
        return False

    got = drained(live(env, handle, "[[reply:fine]]", disconnected=check))
    assert got[-1].type == "done" and got[-1].data["response"] == "fine"
    assert calls, "the disconnect check was never consulted"


def test_close_of_a_queued_run_withdraws_it(env: Env) -> None:
    handle = env.spawn("queue")
    first = live(env, handle, "[[slow:1.5]] first")
    second = live(env, handle, "[[reply:second]]")
    time.sleep(0.2)
    assert not second.future.done()
    second.close()
    assert second.sink.closed
    with pytest.raises(RunCancelled) as info:
        second.future.result(timeout=1)
    assert str(info.value) == "run withdrawn before it started"
    assert not first.cancel.is_set(), "BUG: withdrawing a queued run stopped the running one"
    assert drained(first)[-1].type == "done"


def test_close_of_a_running_run_cancels_it(env: Env) -> None:
    handle = env.spawn("running")
    run = live(env, handle, "[[slow:5]] hi")
    time.sleep(0.3)
    run.close()
    assert run.sink.closed and run.cancel.is_set()
    assert isinstance(run.future.exception(timeout=WAIT), RunCancelled)
    run.sink(Event("late"))
    assert Event("late") not in drained_now(run.sink), "BUG: a closed sink still queues events"


def drained_now(sink: QueueSink) -> list:
    out = []
    sink.finish()
    for e in sink.events(0.05):
        if e is None:
            break
        out.append(e)
    return out


def test_stop_run_of_a_finished_run_sets_nothing(env: Env) -> None:
    run = manual(env, env.spawn("fin"))
    run.future.set_result(None)
    run.stop_run()
    assert not run.cancel.is_set(), "BUG: stopping a finished run flagged it cancelled"
    run = manual(env, env.spawn("unfin"))
    run.stop_run()   # a future the manager never queued: cannot be withdrawn, so cancelled
    assert run.cancel.is_set()


# -- run_blocking -------------------------------------------------------------------------------------------------

def test_run_blocking_returns_and_frees_its_slot(env: Env) -> None:
    handle = env.spawn("block")
    with env.app.test_request_context("/x"):
        result = runs.run_blocking(env.kernel, handle, "[[reply:sync]]", [])
    assert (result.response, result.usage.output_tokens) == ("sync", 1)
    for _ in range(2):   # both slots free again
        assert env.kernel.stream_slots.acquire(blocking=False)
    with env.app.test_request_context("/x"):
        with pytest.raises(runs.TooManyStreams) as info:
            runs.run_blocking(env.kernel, handle, "[[reply:no]]", [])
    assert (info.value.status, info.value.message, info.value.retry_after) == \
        (503, "server busy: too many requests are waiting for agents; try again shortly", 1)
    env.kernel.stream_slots.release()
    env.kernel.stream_slots.release()


def test_run_blocking_frees_its_slot_when_the_run_fails(env: Env) -> None:
    handle = env.spawn("blockfail")
    with env.app.test_request_context("/x"):
        with pytest.raises(AgentdError):
            runs.run_blocking(env.kernel, handle, "[[fail:400]]", [])
    for _ in range(2):
        assert env.kernel.stream_slots.acquire(blocking=False), "BUG: a failed blocking run kept its slot"
    env.kernel.stream_slots.release()
    env.kernel.stream_slots.release()


def test_run_blocking_refused_by_precheck_takes_no_slot(env: Env) -> None:
    handle = env.spawn("quota", "[resources]\nmax_llm_tokens_per_hour = 1\n")
    with env.app.test_request_context("/x"):
        runs.run_blocking(env.kernel, handle, "[[reply:spend]]", [])
        with pytest.raises(TooManyRequests):
            runs.run_blocking(env.kernel, handle, "[[reply:again]]", [])
        with pytest.raises(TooManyRequests):
            live(env, handle, "[[reply:again]]")
    for _ in range(2):
        assert env.kernel.stream_slots.acquire(blocking=False)
    env.kernel.stream_slots.release()
    env.kernel.stream_slots.release()


def test_run_blocking_client_gone_cancels(env: Env) -> None:
    handle = env.spawn("blockgone")
    left = threading.Event()
    threading.Timer(0.3, left.set).start()
    with env.app.test_request_context("/x", environ_base={"waitress.client_disconnected": left.is_set}):
        with pytest.raises(RunCancelled):
            runs.run_blocking(env.kernel, handle, "[[slow:5]] hi", [])
    deadline = time.monotonic() + 3.0
    while handle.busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not handle.busy, "BUG: the run of a client that left went on (its cancel event was not the run's)"
    assert env.kernel.stream_slots.acquire(blocking=False)
    env.kernel.stream_slots.release()


def test_run_blocking_passes_attachments_and_options(env: Env) -> None:
    import json

    from agentd.agents.manager import RunOptions

    handle = env.spawn("blockopts")
    with env.app.test_request_context("/x"):
        result = runs.run_blocking(env.kernel, handle, "[[echo_params]]", [], RunOptions(max_tokens=21))
        assert json.loads(result.response)["max_tokens"] == 21, "BUG: run options were dropped"
        with pytest.raises(AgentdError) as info:
            runs.run_blocking(env.kernel, handle, "hi", [{"bogus": 1}])
    assert (info.value.status, info.value.message) == (400, "invalid file id: '' is not a UUID"), \
        "BUG: attachments were dropped"
    with env.app.test_request_context("/x"):
        run = runs.start_live_run(env.kernel, handle, "[[echo_params]]", [], RunOptions(max_tokens=22))
    assert json.loads(drained(run)[-1].data["response"])["max_tokens"] == 22
