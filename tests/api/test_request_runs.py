"""agentd/api/runs.py exactly: the stream-slot cap (the app's) and its messages, the final
event of a streamed run (done / stopped / error, every field), and the blocking path's
slot accounting. In process over the real kernel, runs going to the fake LLM over real
HTTP; how a stream is written is tests/api/test_streaming.py, the transports built on it are
tested through the daemon in tests/api/test_transports.py and tests/api/test_ws_daemon.py."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import pytest
from flask import Flask, request

from agentd.agents.events import Event
from agentd.agents.loop import RunCancelled
from agentd.api import create_app, runs, streaming
from agentd.config import parse_config
from agentd.errors import AgentdError, TooManyRequests
from agentd.kernel import Kernel
from support import wait_until, with_test_db

LOCAL = {"REMOTE_ADDR": "127.0.0.1"}
WAIT = 15.0


class Env:
    def __init__(self, kernel: Kernel, app: Flask) -> None:
        self.kernel = kernel
        self.app = app
        self.client = app.test_client()
        self.slots = app.extensions["agentd.stream_slots"]

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


def streamed(env: Env, handle, text: str, attachments: Any = None) -> list[Event]:
    """The run's events as a stream delivers them, its final event last."""
    events: list[Event] = []

    def render(event: Event) -> tuple[list[str], bool]:
        events.append(event)
        return [], event.type in ("done", "stopped", "error")

    shape = streaming.StreamShape(opening=(), render=render, keep_alive="")
    with env.app.test_request_context("/x", method="POST"):
        response = streaming.stream_run(env.kernel, handle, text, attachments or [], None, shape)
        body = response(request.environ, lambda status, headers, exc_info=None: lambda data: None)
        try:
            list(body)
        finally:
            body.close()
    return events


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
    from agentd.server.slots import Slots
    saved = env.slots
    env.app.extensions["agentd.stream_slots"] = slots = Slots(8)
    handle = env.spawn("reserve")
    try:
        with env.app.app_context():
            for _ in range(6):
                runs.acquire_stream_slot(handle=handle)
            handle.busy = True
            with pytest.raises(runs.TooManyStreams):
                runs.acquire_stream_slot("queued behind a hung run", handle)
            handle.busy = False
            runs.acquire_stream_slot(handle=handle)   # an idle agent's run starts now
            runs.acquire_stream_slot()                # (no agent: as idle)
        assert slots.in_use == 8
    finally:
        handle.busy = False
        env.app.extensions["agentd.stream_slots"] = saved


def test_stream_slots_cap_at_max_streams(env: Env) -> None:
    slots = env.slots
    assert slots.total == 2  # [api] max_streams
    context = env.app.app_context()
    context.push()
    runs.acquire_stream_slot()
    runs.acquire_stream_slot()
    with pytest.raises(runs.TooManyStreams) as info:
        runs.acquire_stream_slot()   # max_streams = 2: the third is refused at once
    assert (info.value.status, info.value.message, info.value.retry_after) == \
        (503, "too many concurrent streams; try again shortly", 1)
    with pytest.raises(runs.TooManyStreams) as info:
        runs.acquire_stream_slot("custom text")
    assert info.value.message == "custom text"
    slots.release()
    runs.acquire_stream_slot()   # a freed slot is usable again
    slots.release()
    slots.release()
    context.pop()


def test_every_app_has_slots_of_its_own(env: Env) -> None:
    other = create_app(env.kernel)
    assert other.extensions["agentd.stream_slots"] is not env.slots
    assert other.extensions["agentd.stream_slots"].total == 2


# -- the final event of a streamed run --------------------------------------------------------------------------------

def test_done_event_is_exact(env: Env) -> None:
    handle = env.spawn("done")
    events = streamed(env, handle, "[[reply:hello]]")
    assert events[-1] == Event("done", {"input_tokens": 7, "output_tokens": 1, "iterations": 1,
                                        "cost_usd": 2.75e-05, "finish_reason": "stop", "tool_calls": []})
    assert list(events[-1].data) == ["input_tokens", "output_tokens", "iterations", "cost_usd",
                                     "finish_reason", "tool_calls"]
    assert Event("text_delta", {"content": "hello"}) in events


def test_done_event_counts_tool_calls(env: Env) -> None:
    handle = env.spawn("tooler")
    done = streamed(env, handle, "[[tool:agent_list {}]]")[-1]
    assert done.type == "done"
    assert done.data["iterations"] == 2
    assert [(c["name"], c["arguments"]) for c in done.data["tool_calls"]] == [("agent_list", {})]


@pytest.mark.parametrize("text, status, retryable, kind", [
    ("[[fail:400]]", 500, False, "bad_request"), ("[[fail:429]]", 429, True, "rate_limit"),
    ("[[fail:503]]", 503, True, "server")])
def test_error_event_of_a_failed_model_call(env: Env, text: str, status: int, retryable: bool, kind: str) -> None:
    handle = env.spawn("failing")
    last = streamed(env, handle, text)[-1]
    code = text[7:10]
    assert last == Event("error", {"message": f"message delivery failed: openai model gpt-4o: HTTP {code}: "
                                              f"fakellm: scripted failure {code}",
                                   "status": status, "retry_after": None, "code": None, "retryable": retryable,
                                   "kind": kind})


def test_error_event_carries_retry_after(env: Env) -> None:
    handle = env.spawn("later")
    last = streamed(env, handle, "[[fail:429 retry_after=1]]")[-1]
    assert last.type == "error"
    assert (last.data["status"], last.data["retry_after"], last.data["retryable"]) == (429, 1.0, True)


def test_error_event_of_agentd_and_internal_errors(env: Env) -> None:
    handle = env.spawn("bad")
    last = streamed(env, handle, "hi", [{"bogus": 1}])[-1]
    # An AgentdError that has no `retryable` (BadRequest) reads as not retryable.
    assert last == Event("error", {"message": "invalid file id: '' is not a UUID", "status": 400,
                                   "retry_after": None, "code": None, "retryable": False, "kind": None})
    last = streamed(env, handle, "hi", "notalist")[-1]   # type: ignore[arg-type]
    assert last == Event("error", {"message": "internal error: 'str' object has no attribute 'get'", "status": 500,
                                   "retry_after": None, "code": None, "retryable": False, "kind": None})



def test_error_event_carries_the_error_code() -> None:
    busy = TooManyRequests("agent a is busy", retry_after=2, code="agent_busy")
    assert runs.failure_event(busy) == Event("error", {"message": "agent a is busy", "status": 429,
                                                       "retry_after": 2, "code": "agent_busy",
                                                       "retryable": False, "kind": None})

def test_a_cancelled_run_ends_with_stopped() -> None:
    assert runs.failure_event(RunCancelled("run cancelled")) == Event("stopped", {"message": "run stopped"})


# -- run_blocking -------------------------------------------------------------------------------------------------

def test_run_blocking_returns_and_frees_its_slot(env: Env) -> None:
    handle = env.spawn("block")
    with env.app.test_request_context("/x"):
        result = runs.run_blocking(env.kernel, handle, "[[reply:sync]]", [])
    assert (result.response, result.usage.output_tokens) == ("sync", 1)
    for _ in range(2):   # both slots free again
        assert env.slots.acquire(blocking=False)
    with env.app.test_request_context("/x"):
        with pytest.raises(runs.TooManyStreams) as info:
            runs.run_blocking(env.kernel, handle, "[[reply:no]]", [])
    assert (info.value.status, info.value.message, info.value.retry_after) == \
        (503, "server busy: too many requests are waiting for agents; try again shortly", 1)
    env.slots.release()
    env.slots.release()


def test_run_blocking_frees_its_slot_when_the_run_fails(env: Env) -> None:
    handle = env.spawn("blockfail")
    with env.app.test_request_context("/x"):
        with pytest.raises(AgentdError):
            runs.run_blocking(env.kernel, handle, "[[fail:400]]", [])
    for _ in range(2):
        assert env.slots.acquire(blocking=False), "BUG: a failed blocking run kept its slot"
    env.slots.release()
    env.slots.release()


def test_run_blocking_and_streams_refused_by_precheck_take_no_slot(env: Env) -> None:
    handle = env.spawn("quota", "[resources]\nmax_llm_tokens_per_hour = 1\n")
    with env.app.test_request_context("/x"):
        runs.run_blocking(env.kernel, handle, "[[reply:spend]]", [])
        with pytest.raises(TooManyRequests):
            runs.run_blocking(env.kernel, handle, "[[reply:again]]", [])
    with pytest.raises(TooManyRequests):
        streamed(env, handle, "[[reply:again]]")
    for _ in range(2):
        assert env.slots.acquire(blocking=False)
    env.slots.release()
    env.slots.release()


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
    assert env.slots.acquire(blocking=False)
    env.slots.release()


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


def test_run_blocking_for_a_busy_agent_cannot_take_the_reserved_slots_and_leaves_nothing_queued(env: Env) -> None:
    from agentd.agents.run_request import WORKER, RunRequest
    from agentd.server.slots import Slots

    saved = env.slots
    env.app.extensions["agentd.stream_slots"] = slots = Slots(8)
    hung, idle = env.spawn("hung"), env.spawn("idle")
    running = env.kernel.runs.start(RunRequest(hung, "[[slow:10]] hung", on=WORKER))
    try:
        wait_until(lambda: hung.busy, "the agent's run to start")
        for _ in range(6):
            assert slots.acquire()
        with env.app.test_request_context("/x"):
            with pytest.raises(runs.TooManyStreams) as info:
                runs.run_blocking(env.kernel, hung, "[[reply:queued]]", [])
            assert (info.value.status, info.value.message, info.value.retry_after) == \
                (503, "server busy: too many requests are waiting for agents; try again shortly", 1)
            assert (len(hung.waiting), slots.in_use) == (0, 6), "BUG: a refused request left its run queued"
            assert runs.run_blocking(env.kernel, idle, "[[reply:now]]", []).response == "now", \
                "an idle agent's request takes a reserved slot"
        assert slots.in_use == 6
    finally:
        running.stop()
        with pytest.raises(RunCancelled):
            running.future.result(WAIT)
        env.app.extensions["agentd.stream_slots"] = saved


def test_run_blocking_runs_in_the_requests_session_with_the_api_origin(env: Env) -> None:
    import uuid

    handle = env.spawn("fields")
    heard: list = []
    env.kernel.events.subscribe(lambda event: heard.append(event) if event.agent_id == handle.id else None)
    session_id = str(uuid.uuid4())
    with env.app.test_request_context("/x"):
        result = runs.run_blocking(env.kernel, handle, "[[reply:hi ann]]", [],
                                   run={"owner": "user:ann", "session_id": session_id, "label": "user:ann"})
        assert result.response == "hi ann"
        with pytest.raises(AgentdError):
            runs.run_blocking(env.kernel, handle, "[[fail:400]]", [])
        with pytest.raises(AgentdError):
            runs.run_blocking(env.kernel, handle, "[[fail:400]]", [], origin="v1")
    person = env.kernel.agents.session(handle, session_id)
    assert (person["label"], [m["content"] for m in person["messages"]]) == \
        ("user:ann", ["[[reply:hi ann]]", "hi ann"]), "BUG: the request's session was not the run's"
    assert [m["content"] for m in env.kernel.agents.session(handle)["messages"]][0] == "[[fail:400]]"
    wait_until(lambda: len(heard) == 2, "the agent_failed events")
    assert [(e.type, e.origin, e.payload["run_origin"]) for e in heard] == \
        [("agent_failed", "api", "api"), ("agent_failed", "v1", "v1")]
