"""The workflow engine and its step runner in process, value by value: a real store, a real
`WorkflowEngine`/`StepRunner` and executor, and a scripted stand-in for the agent manager
(the object steps call `run`, `find` and `by_name` on). What an agent run really does is
tests/workflows/test_workflows.py, through the daemon; this file pins the engine's own logic: the
order and shape of step records, templates, conditions, loops, fan-out, retries and their
messages, timeouts, cancellation, recovery and the run records. Follows --db=postgres."""

from __future__ import annotations

import concurrent.futures
import logging
import re
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from support import store_url_for

from agentd.agents.loop import RunCancelled, RunResult
from agentd.errors import AgentdError, BadRequest, Conflict, NotFound
from agentd.llm.types import Usage
from agentd.store import open_store
from agentd.workflows import steps as steps_mod
from agentd.workflows.definition import WorkflowDef
from agentd.agents.run_request import INLINE, RunRequest
from agentd.workflows.engine import INTERRUPTED, WorkflowEngine
from agentd.workflows.steps import StepRunner, _stop_reason, _wait_any, resolve
from agentd.workflows.store import WorkflowStore

Behaviour = Callable[[str, threading.Event], str]


class Agents:
    """The parts of the agent registry and of Runs the workflow code uses; each agent answers
    by a script."""

    def __init__(self) -> None:
        self.handles: dict[str, SimpleNamespace] = {}
        self.script: dict[str, Behaviour] = {}
        self.calls: list[tuple[str, str, float]] = []
        self.cancels: list[threading.Event] = []
        self._lock = threading.Lock()

    def add(self, name: str, behave: Behaviour | None = None) -> SimpleNamespace:
        handle = SimpleNamespace(id=str(uuid.uuid4()), name=name, killed=False)
        self.handles[handle.id] = handle
        self.script[name] = behave or (lambda prompt, cancel: f"{name}({prompt})")
        return handle

    def find(self, agent_id: str) -> SimpleNamespace | None:
        return self.handles.get(agent_id)

    def by_name(self, name: str) -> SimpleNamespace | None:
        return next((h for h in self.handles.values() if h.name == name), None)

    def start(self, request: RunRequest) -> SimpleNamespace:
        """Runs.start: a step's run is inline, bounded by the step's timeout, its prompt not a client's."""
        assert (request.on, request.from_client, request.attachments) == (INLINE, False, [])
        return SimpleNamespace(result=lambda: self.run(request.handle, request.text, request.wait, request.cancel))

    def run(self, handle: SimpleNamespace, prompt: str, lock_timeout: float, cancel: threading.Event) -> RunResult:
        with self._lock:
            self.calls.append((handle.name, prompt, lock_timeout))
            self.cancels.append(cancel)
        text = self.script[handle.name](prompt, cancel)
        return RunResult(response=text, usage=Usage(len(prompt), len(text)), iterations=1,
                         finish_reason="stop", new_messages=[], cost_usd=0.125)


@pytest.fixture
def store(tmp_path: Path):
    s = open_store(tmp_path / "wf.db", store_url_for(tmp_path))
    yield s
    s.close()


@pytest.fixture
def pool():
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=8)
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


@pytest.fixture
def agents() -> Agents:
    return Agents()


@pytest.fixture
def engine(store, agents, pool):
    e = WorkflowEngine(store, agents, agents, pool, backoff_base=0.01, daemon_id="d1")
    yield e
    e.close()


def flow(engine: WorkflowEngine, *steps: dict[str, Any], name: str = "wf") -> str:
    return engine.create({"name": name, "steps": list(steps)})


def records(engine: WorkflowEngine, body: dict[str, Any]) -> list[dict[str, Any]]:
    return engine.run_detail(body["run_id"])["step_results"]


def fail_with(message: str, status: int = 500) -> Behaviour:
    def behave(prompt: str, cancel: threading.Event) -> str:
        raise AgentdError(message, status=status)
    return behave


def flaky(times: int, then: str = "ok", status: int = 500) -> Behaviour:
    left = [times]

    def behave(prompt: str, cancel: threading.Event) -> str:
        if left[0] > 0:
            left[0] -= 1
            raise AgentdError(f"flake {left[0]}", status=status)
        return then
    return behave


def blocking(seconds: float = 10.0) -> Behaviour:
    def behave(prompt: str, cancel: threading.Event) -> str:
        cancel.wait(seconds)
        if cancel.is_set():
            raise RunCancelled("stopped")
        return "late"
    return behave


# -- a run's result and records -----------------------------------------------------------------

def test_sequential_run_with_templates_variables_and_exact_records(engine, agents) -> None:
    a, b = agents.add("a"), agents.add("b")
    wid = flow(engine, {"name": "one", "agent_name": "a", "prompt": "x {{input}}", "output_var": "first"},
               {"name": "two", "agent": {"id": b.id}, "prompt": "{{input}}|{{first}}", "timeout_secs": 7})
    began = time.monotonic()
    body = engine.run(wid, "in")
    took_ms = (time.monotonic() - began) * 1000
    assert body == {"run_id": body["run_id"], "output": "b(a(x in)|a(x in))", "status": "completed"}, \
        "BUG: a completed run's body is not {run_id, output, status}"
    assert agents.calls == [("a", "x in", 120), ("b", "a(x in)|a(x in)", 7)], \
        "BUG: the step's timeout is not the agent's lock timeout, or templates expand wrongly"
    first, second = records(engine, body)
    for rec in (first, second):
        duration = rec.pop("duration_ms")
        assert isinstance(duration, int) and 0 <= duration <= took_ms, \
            f"BUG: a step's duration ({duration} ms) is not within the run's {took_ms:.0f} ms"
    assert first == {"step_name": "one", "agent_id": a.id, "agent_name": "a", "output": "a(x in)",
                     "input_tokens": 4, "output_tokens": 7, "step_index": 0, "mode": "sequential",
                     "status": "completed", "error": None, "attempts": 1, "iteration": None,
                     "cost_usd": 0.125, "note": None}
    assert (second["step_name"], second["agent_id"], second["agent_name"], second["step_index"], second["output"]) == (
        "two", b.id, "b", 1, "b(a(x in)|a(x in))"), "BUG: a step referring to its agent by id records no agent name"
    detail = engine.run_detail(body["run_id"])
    assert (detail["state"], detail["steps_completed"], detail["output"], detail["error"], detail["daemon_id"]) == (
        {"status": "completed"}, 2, "b(a(x in)|a(x in))", None, "d1")
    assert engine._active == {}, "BUG: a finished run stays registered as active"


def test_progress_is_saved_after_every_step(engine, agents) -> None:
    seen: list[tuple[int, list[str]]] = []

    def look(prompt: str, cancel: threading.Event) -> str:
        run = engine.recent_runs(1)[0]
        detail = engine.run_detail(run["id"])
        seen.append((detail["steps_completed"], [r["step_name"] for r in detail["step_results"]]))
        return prompt

    agents.add("a", look)
    wid = flow(engine, *({"name": f"s{i}", "agent_name": "a"} for i in range(3)))
    assert engine.run(wid, "go")["status"] == "completed"
    assert seen == [(0, []), (1, ["s0"]), (2, ["s0", "s1"])], "BUG: step results are not saved after each step"


def test_a_failing_step_ends_the_run_with_its_name_and_number(engine, agents) -> None:
    agents.add("a")
    bad = agents.add("bad", fail_with("quota exceeded", 429))
    wid = flow(engine, {"name": "ok", "agent_name": "a"}, {"name": "boom", "agent_name": "bad"},
               {"name": "never", "agent_name": "a"})
    body = engine.run(wid, "x")
    assert body == {"run_id": body["run_id"], "output": "", "status": "failed",
                    "error": "step 2 ('boom') failed: quota exceeded"}
    recs = records(engine, body)
    assert [(r["step_name"], r["status"], r["error"], r["output"]) for r in recs] == [
        ("ok", "completed", None, "a(x)"), ("boom", "failed", "quota exceeded", "")]
    assert (recs[1]["step_index"], recs[1]["agent_id"], recs[1]["agent_name"], recs[1]["attempts"],
            recs[1]["input_tokens"], recs[1]["cost_usd"]) == (1, bad.id, "bad", 1, 0, None), \
        "BUG: a failed step's record does not name its step index or its agent"
    assert [c[0] for c in agents.calls] == ["a", "bad"], "BUG: a status 429 refusal was retried or the run went on"
    detail = engine.run_detail(body["run_id"])
    assert (detail["state"], detail["steps_completed"], detail["output"], detail["error"]) == (
        {"status": "failed"}, 1, "", "step 2 ('boom') failed: quota exceeded"), "BUG: the run record lost its error"


def test_a_crash_inside_the_runner_fails_the_run(engine, agents, caplog) -> None:
    def crash(prompt: str, cancel: threading.Event) -> str:
        raise RuntimeError("kaput")

    agents.add("a", crash)
    wid = flow(engine, {"name": "s", "agent_name": "a"})
    with caplog.at_level(logging.ERROR, logger="agentd.workflows"):
        body = engine.run(wid, "x")
    assert (body["status"], body["error"], body["output"]) == ("failed", "internal error: kaput", "")
    assert engine.run_detail(body["run_id"])["state"] == {"status": "failed"}
    assert f"workflow run {body['run_id']} crashed" in [r.getMessage() for r in caplog.records]
    assert engine._active == {}


# -- modes -------------------------------------------------------------------------------------------

def test_conditional_is_case_insensitive_and_a_skip_passes_its_input_on(engine, agents) -> None:
    a = agents.add("a", lambda p, c: f"Result {p}")
    agents.add("b")
    wid = flow(engine, {"name": "first", "agent_name": "a"},
               {"name": "if-ok", "agent_name": "b", "mode": "conditional", "condition": "RESULT"},
               {"name": "if-no", "agent_name": "a", "mode": "conditional", "condition": "absent"})
    body = engine.run(wid, "q")
    assert body["output"] == "b(Result q)"
    recs = records(engine, body)
    skipped = recs[2]
    assert (skipped["status"], skipped["output"], skipped["note"], skipped["agent_id"], skipped["agent_name"]) == (
        "skipped", "b(Result q)", "condition 'absent' not met by the previous output", a.id, "a")
    assert (skipped["attempts"], skipped["input_tokens"], skipped["output_tokens"], skipped["cost_usd"],
            skipped["duration_ms"], skipped["step_index"]) == (0, 0, 0, None, 0, 2)
    assert engine.run_detail(body["run_id"])["steps_completed"] == 3


def test_loop_until_and_its_iterations(engine, agents) -> None:
    count = [0]

    def counter(prompt: str, cancel: threading.Event) -> str:
        count[0] += 1
        return f"{prompt}+" if count[0] < 3 else "ALL DONE"

    agents.add("a", counter)
    wid = flow(engine, {"name": "l", "agent_name": "a", "mode": "loop", "until": "done", "max_iterations": 9,
                        "output_var": "v"}, {"name": "after", "agent_name": "a", "prompt": "{{v}}!"})
    body = engine.run(wid, "s")
    assert [c[1] for c in agents.calls] == ["s", "s+", "s++", "ALL DONE!"], \
        "BUG: a loop iteration does not get the previous iteration's output, or until is case-sensitive"
    recs = records(engine, body)
    assert [(r["iteration"], r["note"]) for r in recs[:3]] == [(1, None), (2, None), (3, None)]
    assert recs[3]["iteration"] is None


def test_loop_stops_at_max_iterations_with_a_note(engine, agents) -> None:
    agents.add("a", lambda p, c: p + ".")
    wid = flow(engine, {"name": "l", "agent_name": "a", "mode": "loop", "until": "never", "max_iterations": 3})
    body = engine.run(wid, "x")
    assert body["output"] == "x..." and body["status"] == "completed"
    recs = records(engine, body)
    assert [r["note"] for r in recs] == [None, None, "until 'never' not met after 3 iteration(s)"], \
        "BUG: the until note is not on the last iteration"
    plain = flow(engine, {"name": "l", "agent_name": "a", "mode": "loop", "max_iterations": 3}, name="p")
    body = engine.run(plain, "y")
    assert body["output"] == "y..." and [r["note"] for r in records(engine, body)] == [None, None, None], \
        "BUG: a loop without until gets a note"


def test_loop_failure_and_skip(engine, agents) -> None:
    calls = [0]

    def second_fails(prompt: str, cancel: threading.Event) -> str:
        calls[0] += 1
        if calls[0] == 2:
            raise AgentdError("bad input", status=400)
        return prompt + "!"

    agents.add("a", second_fails)
    wid = flow(engine, {"name": "l", "agent_name": "a", "mode": "loop", "max_iterations": 4})
    body = engine.run(wid, "x")
    assert body["error"] == "step 1 ('l') failed: iteration 2: bad input"
    assert [(r["iteration"], r["status"]) for r in records(engine, body)] == [(1, "completed"), (2, "failed")]
    calls[0] = 0
    skip = flow(engine, {"name": "l", "agent_name": "a", "mode": "loop", "max_iterations": 4,
                         "error_mode": "skip"}, name="s")
    body = engine.run(skip, "x")
    assert (body["status"], body["output"]) == ("completed", "x!"), "BUG: a skipped iteration does not end the loop"
    assert [(r["iteration"], r["status"]) for r in records(engine, body)] == [(1, "completed"), (2, "skipped")]
    assert calls[0] == 2


def test_fan_out_runs_in_parallel_and_collect_joins_in_step_order(engine, agents) -> None:
    gate = threading.Barrier(2, timeout=5)

    def together(prompt: str, cancel: threading.Event) -> str:
        gate.wait()   # both branches must be running at once
        return prompt.upper()

    agents.add("p", together)
    agents.add("c")
    wid = flow(engine, {"name": "f1", "agent_name": "p", "mode": "fan_out", "prompt": "one {{input}}",
                        "output_var": "o1"},
               {"name": "f2", "agent_name": "p", "mode": "fan_out", "prompt": "two"},
               {"name": "join", "mode": "collect"},
               {"name": "use", "agent_name": "c", "prompt": "{{o1}}"})
    body = engine.run(wid, "in")
    joined = "--- begin f1 ---\nONE IN\n--- end f1 ---\n\n--- begin f2 ---\nTWO\n--- end f2 ---"
    recs = records(engine, body)
    assert [r["step_name"] for r in recs] == ["f1", "f2", "join", "use"]
    assert recs[2]["output"] == joined, "BUG: collect does not join the branches in step order"
    assert (recs[2]["agent_id"], recs[2]["agent_name"], recs[2]["attempts"], recs[2]["status"],
            recs[2]["mode"], recs[2]["step_index"], recs[2]["duration_ms"]) == ("", "", 0, "completed", "collect", 2, 0)
    assert body["output"] == "c(ONE IN)" and engine.run_detail(body["run_id"])["steps_completed"] == 4


def test_collect_with_an_agent_gets_the_joined_text_and_groups_do_not_mix(engine, agents) -> None:
    agents.add("a", lambda p, c: p)
    agents.add("c", lambda p, c: f"<{p}>")
    wid = flow(engine, {"name": "x", "agent_name": "a", "mode": "fan_out", "prompt": "X"},
               {"name": "j1", "agent_name": "c", "mode": "collect"},
               {"name": "y", "agent_name": "a", "mode": "fan_out", "prompt": "Y"},
               {"name": "j2", "mode": "collect"})
    body = engine.run(wid, "")
    recs = records(engine, body)
    assert recs[1]["output"] == "<--- begin x ---\nX\n--- end x --->"
    assert recs[3]["output"] == "--- begin y ---\nY\n--- end y ---", "BUG: a collect joins an earlier group again"


def test_fan_out_failure_cancels_the_siblings(engine, agents) -> None:
    agents.add("slow", blocking())
    agents.add("bad", fail_with("nope", 400))
    wid = flow(engine, {"name": "s", "agent_name": "slow", "mode": "fan_out"},
               {"name": "b", "agent_name": "bad", "mode": "fan_out"},
               {"name": "j", "mode": "collect"})
    body = engine.run(wid, "x")   # the slow branch would answer "late" after 10 s if not stopped
    assert body["error"] == "step 2 ('b') failed: nope"
    recs = records(engine, body)
    assert [(r["step_name"], r["status"], r["error"]) for r in recs] == [
        ("s", "failed", "cancelled because a parallel fan_out step failed"), ("b", "failed", "nope")]
    assert engine.run_detail(body["run_id"])["steps_completed"] == 0


def test_fan_out_skip_keeps_the_others(engine, agents) -> None:
    agents.add("a")
    agents.add("bad", fail_with("nope", 400))
    wid = flow(engine, {"name": "s", "agent_name": "bad", "mode": "fan_out", "error_mode": "skip"},
               {"name": "g", "agent_name": "a", "mode": "fan_out", "output_var": "gv"},
               {"name": "j", "mode": "collect"})
    body = engine.run(wid, "x")
    recs = records(engine, body)
    assert body["status"] == "completed"
    assert [(r["step_name"], r["status"], r["output"]) for r in recs] == [
        ("s", "skipped", "x"), ("g", "completed", "a(x)"), ("j", "completed", "--- begin g ---\na(x)\n--- end g ---")]
    assert engine.run_detail(body["run_id"])["steps_completed"] == 3


# -- retries, timeouts, missing agents ----------------------------------------------------------------

def test_retries_then_success_and_give_up_messages(engine, agents) -> None:
    agents.add("f", flaky(2))
    wid = flow(engine, {"name": "r", "agent_name": "f", "error_mode": "retry", "max_retries": 2})
    body = engine.run(wid, "x")
    assert (body["status"], body["output"]) == ("completed", "ok")
    assert records(engine, body)[0]["attempts"] == 3
    agents.add("g", flaky(5))
    wid = flow(engine, {"name": "r", "agent_name": "g", "error_mode": "retry", "max_retries": 2}, name="g")
    body = engine.run(wid, "x")
    assert body["error"] == "step 1 ('r') failed: failed after 3 attempts: flake 2"
    rec = records(engine, body)[0]
    assert (rec["attempts"], rec["status"], rec["error"]) == (3, "failed", "failed after 3 attempts: flake 2")
    agents.add("h", flaky(5))   # one retry: 2 attempts are "attempts" too
    body = engine.run(flow(engine, {"name": "r", "agent_name": "h", "error_mode": "retry", "max_retries": 1},
                           name="h"), "x")
    assert body["error"] == "step 1 ('r') failed: failed after 2 attempts: flake 3"
    assert records(engine, body)[0]["attempts"] == 2
    # A conflict (409: the agent was busy) is worth another try; a refusal (4xx) is not.
    agents.add("busy", flaky(1, status=409))
    assert engine.run(flow(engine, {"name": "r", "agent_name": "busy", "error_mode": "retry"}, name="b"),
                      "x")["status"] == "completed"
    agents.add("no", flaky(1, status=422))
    body = engine.run(flow(engine, {"name": "r", "agent_name": "no", "error_mode": "retry"}, name="n"), "x")
    assert body["error"] == "step 1 ('r') failed: flake 0", "BUG: a refused request was retried"
    assert records(engine, body)[0]["attempts"] == 1


def retry_wait(message: str) -> tuple[int, str, float]:
    """(attempt, its error, seconds) of a step's "retrying in" log line."""
    found = re.fullmatch(r"workflow step 'r' attempt (\d+) failed \((.*)\); retrying in (\d+\.\d\d)s", message)
    assert found, message
    return int(found.group(1)), found.group(2), float(found.group(3))


def test_retry_backoff_doubles(store, agents, pool, caplog) -> None:
    e = WorkflowEngine(store, agents, agents, pool, backoff_base=0.05)
    try:
        agents.add("g", flaky(3))
        wid = flow(e, {"name": "r", "agent_name": "g", "error_mode": "retry", "max_retries": 3})
        with caplog.at_level(logging.INFO, logger="agentd.workflows"):
            assert e.run(wid, "x")["status"] == "completed"
        waits = [retry_wait(r.getMessage()) for r in caplog.records if "retrying" in r.getMessage()]
        assert [(n, left) for n, left, _ in waits] == [(1, "flake 2"), (2, "flake 1"), (3, "flake 0")]
        for (_, _, secs), base in zip(waits, [0.05, 0.10, 0.20]):
            assert round(0.8 * base, 2) <= secs <= round(1.2 * base, 2), waits
    finally:
        e.close()


def test_backoff_is_capped(store, agents, pool, caplog) -> None:
    e = WorkflowEngine(store, agents, agents, pool, backoff_base=10.0)
    try:
        agents.add("g", flaky(5))
        wid = flow(e, {"name": "r", "agent_name": "g", "error_mode": "retry", "max_retries": 2})
        cancel_after = threading.Timer(0.3, e.close)
        cancel_after.start()
        with caplog.at_level(logging.INFO, logger="agentd.workflows"):
            body = e.run(wid, "x")
        assert body["error"] == "step 1 ('r') failed: flake 4; retry abandoned: the daemon is shutting down"
        waits = [retry_wait(r.getMessage()) for r in caplog.records if "retrying" in r.getMessage()]
        assert len(waits) == 1 and waits[0][:2] == (1, "flake 4")
        assert 6.4 <= waits[0][2] <= 9.6, "BUG: the retry backoff is not capped at 8 s (±20 %)"
    finally:
        e.close()
    assert steps_mod.BACKOFF_MAX == 8.0 and steps_mod.BACKOFF_BASE == 0.25


def test_a_step_times_out_and_its_agent_run_is_cancelled(engine, agents) -> None:
    agents.add("slow", blocking(5.0))
    wid = flow(engine, {"name": "t", "agent_name": "slow", "timeout_secs": 1})
    started = time.monotonic()
    body = engine.run(wid, "x")
    took_ms = (time.monotonic() - started) * 1000
    assert body["error"] == "step 1 ('t') failed: timed out after 1s"
    duration = records(engine, body)[0]["duration_ms"]
    assert 1000 <= duration <= took_ms, f"BUG: a step timed out after 1 s records {duration} ms (run: {took_ms:.0f})"
    assert agents.cancels[0].is_set(), "BUG: a timed-out step leaves its agent run going"
    skip = flow(engine, {"name": "t", "agent_name": "slow", "timeout_secs": 1, "error_mode": "skip"}, name="s")
    body = engine.run(skip, "passed")
    assert (body["status"], body["output"]) == ("completed", "passed")
    assert records(engine, body)[0]["error"] == "timed out after 1s"
    # A step named by its label alone is not named twice.
    unnamed = flow(engine, {"agent_name": "slow", "timeout_secs": 1}, name="u")
    assert engine.run(unnamed, "x")["error"] == "step 1 failed: timed out after 1s"


def test_missing_and_killed_agents(engine, agents) -> None:
    a = agents.add("a")
    b = agents.add("b", blocking())
    wid = flow(engine, {"name": "s", "agent_name": "a"})
    by_id = flow(engine, {"name": "s", "agent": {"id": a.id}}, name="i")
    a.killed = True
    body = engine.run(wid, "x")
    assert body["error"] == "step 1 ('s') failed: agent 'a' not found (killed, or never existed)"
    rec = records(engine, body)[0]
    assert (rec["agent_id"], rec["agent_name"], rec["attempts"]) == ("", "a", 1)
    del agents.handles[a.id]
    body = engine.run(by_id, "x")
    assert body["error"] == f"step 1 ('s') failed: agent with id {a.id} not found (killed, or never existed)"
    assert records(engine, body)[0]["agent_id"] == a.id
    # Killed while its step runs: said so, never retried.
    mid = flow(engine, {"name": "k", "agent_name": "b", "error_mode": "retry"}, name="k")

    def kill() -> None:
        b.killed = True
        for cancel in agents.cancels:
            cancel.set()

    threading.Timer(0.3, kill).start()
    body = engine.run(mid, "x")
    assert body["error"] == "step 1 ('k') failed: agent 'b' was killed while the step was running"
    assert len(agents.calls) == 1 and records(engine, body)[0]["attempts"] == 1


def test_a_cancelled_agent_run_is_not_retried(engine, agents) -> None:
    def stopped(prompt: str, cancel: threading.Event) -> str:
        raise RunCancelled("stopped")

    agents.add("s", stopped)
    body = engine.run(flow(engine, {"name": "s", "agent_name": "s", "error_mode": "retry"}), "x")
    assert body["error"] == "step 1 ('s') failed: the agent's run was cancelled (stopped or killed)"
    assert len(agents.calls) == 1


def test_resolve(agents) -> None:
    a = agents.add("a")
    assert resolve(agents, None) is None and resolve(agents, {}) is None
    assert resolve(agents, {"name": "a"}) is a and resolve(agents, {"id": a.id}) is a
    assert resolve(agents, {"id": a.id.upper()}) is a, "BUG: an id in capitals is not the same agent"
    assert resolve(agents, {"id": "not-a-uuid"}) is None
    assert resolve(agents, {"name": "A"}) is None
    other = SimpleNamespace(id=str(uuid.uuid4()), name="x", killed=False)
    assert resolve(agents, {"id": str(uuid.uuid4())}) is None
    a.killed = True
    assert resolve(agents, {"name": "a"}) is None, "BUG: a killed agent is resolved by name"

    class Loose(Agents):   # a manager whose find() matches loosely (e.g. by name or prefix)
        def find(self, agent_id: str) -> SimpleNamespace | None:
            return other

    assert resolve(Loose(), {"id": a.id}) is None, "BUG: a handle with another id is taken for the asked one"


# -- the engine's bookkeeping -------------------------------------------------------------------------

def test_definitions_errors_and_lists(engine, agents) -> None:
    agents.add("a")
    wid = flow(engine, {"name": "s", "agent_name": "a"}, name="first")
    assert engine.get(wid)["name"] == "first" and [w["id"] for w in engine.list()] == [wid]
    engine.update(wid.upper(), {"name": "renamed", "steps": [{"agent_name": "a"}]})
    assert engine.get(wid)["name"] == "renamed"
    missing = str(uuid.uuid4())
    for call in (lambda: engine.get(missing), lambda: engine.delete(missing), lambda: engine.runs(missing),
                 lambda: engine.update(missing, {"name": "x", "steps": [{"agent_name": "a"}]})):
        with pytest.raises(NotFound, match=r"^workflow not found$"):
            call()
    with pytest.raises(NotFound, match=r"^workflow run not found$"):
        engine.run_detail(missing)
    with pytest.raises(BadRequest, match=r"^invalid workflow id: 'nope' is not a UUID$"):
        engine.get("nope")
    with pytest.raises(BadRequest, match=r"^invalid workflow id: 'nope' is not a UUID$"):
        engine.update("nope", {"name": "x", "steps": [{"agent_name": "a"}]})
    with pytest.raises(BadRequest, match=r"^invalid workflow id: 'nope' is not a UUID$"):
        engine.delete("nope")
    with pytest.raises(BadRequest, match=r"^invalid run id: 'nope' is not a UUID$"):
        engine.run_detail("nope")
    with pytest.raises(BadRequest, match="no agent with name 'ghost'"):
        flow(engine, {"agent_name": "ghost"})
    with pytest.raises(BadRequest, match="no agent with name 'ghost'"):
        engine.update(wid, {"name": "x", "steps": [{"agent_name": "ghost"}]})
    ids = [engine.run(wid, str(i))["run_id"] for i in range(11)]
    assert [r["id"] for r in engine.recent_runs()] == ids[::-1][:10], "BUG: the overview is not the newest 10"
    assert [r["id"] for r in engine.recent_runs(2)] == ids[::-1][:2]
    assert [r["id"] for r in engine.runs(wid)] == ids[::-1]
    engine.delete(wid)
    assert engine.list() == []


def test_create_logs_its_steps(engine, agents, caplog) -> None:
    agents.add("a")
    with caplog.at_level(logging.INFO, logger="agentd.workflows"):
        wid = flow(engine, {"agent_name": "a"}, {"agent_name": "a"}, name="logged")
    assert f"created workflow logged ({wid}) with 2 step(s)" in [r.getMessage() for r in caplog.records]


def test_delete_refused_while_a_run_is_in_progress(engine, agents) -> None:
    agents.add("b", blocking())
    wid = flow(engine, {"agent_name": "b"})
    runner = threading.Thread(target=engine.run, args=(wid, "x"), daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 5
        while not agents.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(Conflict, match=r"^workflow has 1 run\(s\) in progress; delete it when they end$"):
            engine.delete(wid)
    finally:
        for cancel in agents.cancels:
            cancel.set()
        runner.join(5)
    engine.delete(wid)


def test_close_stops_runs_and_refuses_new_ones(engine, agents) -> None:
    agents.add("b", blocking())
    wid = flow(engine, {"name": "s", "agent_name": "b"})
    out: list[dict] = []
    runner = threading.Thread(target=lambda: out.append(engine.run(wid, "x")), daemon=True)
    runner.start()
    deadline = time.monotonic() + 5
    while not agents.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.close()
    runner.join(5)
    assert out and out[0]["error"] == "step 1 ('s') failed: the daemon is shutting down"
    assert agents.cancels[0].is_set(), "BUG: close() leaves the agent run going"
    with pytest.raises(AgentdError) as caught:
        engine.run(wid, "y")
    assert (caught.value.status, caught.value.message) == (503, "the daemon is shutting down")


def test_recover_fails_runs_left_behind(store, agents, pool, caplog) -> None:
    db = WorkflowStore(store)
    workflow = db.get(db.create(WorkflowDef("w", "", [{"name": "s"}])))
    mine, other, unowned = (db.create_run(workflow, "m", "me"), db.create_run(workflow, "o", "other"),
                            db.create_run(workflow, "u"))
    shared = WorkflowEngine(store, agents, agents, pool, daemon_id="me", shared=True)
    with caplog.at_level(logging.WARNING, logger="agentd.workflows"):
        assert shared.recover() == 2
    assert "marked 2 interrupted workflow run(s) failed" in [r.getMessage() for r in caplog.records]
    assert [db.run(r)["state"]["status"] for r in (mine, other, unowned)] == ["failed", "pending", "failed"]
    assert db.run(mine)["error"] == INTERRUPTED == (
        "interrupted: the daemon stopped while this run was in progress (marked failed when the daemon restarted)")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agentd.workflows"):
        assert shared.recover() == 0
    assert not caplog.records, "BUG: a recovery with nothing to do logs a warning"
    alone = WorkflowEngine(store, agents, agents, pool, daemon_id="me")
    assert alone.recover() == 1 and db.run(other)["state"]["status"] == "failed", \
        "BUG: a daemon on its own database leaves another id's runs running"
    for e in (shared, alone):
        e.close()


def test_a_run_failed_by_another_daemon_keeps_that_verdict(engine, agents, store) -> None:
    reaper = WorkflowStore(store)

    def reaped(prompt: str, cancel: threading.Event) -> str:
        reaper.fail_interrupted("daemon d1 stopped (reaped)", ("d1",))
        return "too late"

    agents.add("a", reaped)
    agents.add("b")
    wid = flow(engine, {"name": "s", "agent_name": "a"}, {"name": "t", "agent_name": "b"})
    body = engine.run(wid, "x")
    assert body == {"run_id": body["run_id"], "output": "", "status": "failed",
                    "error": "daemon d1 stopped (reaped)"}, "BUG: the reaper's verdict was overwritten"
    assert [c[0] for c in agents.calls] == ["a"], "BUG: the run went on after another daemon failed it"
    detail = engine.run_detail(body["run_id"])
    assert (detail["state"], detail["error"], detail["step_results"]) == (
        {"status": "failed"}, "daemon d1 stopped (reaped)", [])


def test_a_run_failed_before_it_started(engine, agents, store) -> None:
    class ReapedAtOnce(WorkflowStore):
        def create_run(self, workflow, text, owner=None):
            run_id = super().create_run(workflow, text, owner)
            self.fail_interrupted("", (owner,))   # another daemon's reaper, before this one starts it
            return run_id

    agents.add("a")
    wid = flow(engine, {"name": "s", "agent_name": "a"})
    engine.db = ReapedAtOnce(store)
    body = engine.run(wid, "x")
    assert body == {"run_id": body["run_id"], "output": "", "status": "failed",
                    "error": "the run was failed by another daemon"}
    assert agents.calls == [], "BUG: a run another daemon failed was still driven"


def test_drive_stops_when_progress_cannot_be_saved(agents, pool) -> None:
    agents.add("a")
    saved: list[int] = []

    def refuse(run_id: str, results: list, completed: int) -> bool:
        saved.append(completed)
        return False

    runner = StepRunner(agents, agents, pool, refuse, threading.Event(), backoff_base=0.01)
    step = {"name": "s", "agent": {"name": "a"}, "prompt": "{{input}}", "mode": "sequential", "timeout_secs": 5,
            "error_mode": "fail", "output_var": None}
    run = steps_mod.RunState(run_id="r", workflow={"steps": [step, dict(step, name="t")]}, current="x")
    assert runner.drive(run) == "the run was failed elsewhere (its daemon was believed dead); stopped"
    assert saved == [1] and len(agents.calls) == 1
    runner.close()


# -- helpers -------------------------------------------------------------------------------------------

def test_wait_any_and_stop_reasons() -> None:
    a, b = threading.Event(), threading.Event()
    started = time.monotonic()
    assert _wait_any((a, b), 0.1) is False and time.monotonic() - started >= 0.1
    threading.Timer(0.1, b.set).start()
    assert _wait_any((a, b), 5.0) is True, "BUG: waiting does not end when the second event is set"
    closing = threading.Event()
    assert _stop_reason((a, b), closing) == "cancelled because a parallel fan_out step failed"
    a.set()
    assert _stop_reason((a, b), closing) == "run cancelled"
    assert _stop_reason((b,), closing) == "run cancelled"
    closing.set()
    assert _stop_reason((a, b), closing) == "the daemon is shutting down"


def step_def(name: str = "s", agent: str = "a", **kw: Any) -> dict[str, Any]:
    base = {"name": name, "agent": {"name": agent}, "prompt": "{{input}}", "mode": "sequential",
            "timeout_secs": 5, "error_mode": "fail", "output_var": None}
    return {**base, **kw}


def test_time_queued_for_an_executor_thread_does_not_count(agents) -> None:
    agents.add("a")
    one = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        one.submit(time.sleep, 1.5)   # the only thread is busy for longer than the step's timeout
        runner = StepRunner(agents, agents, one, lambda *a: True, threading.Event())
        run = steps_mod.RunState(run_id="r", workflow={"steps": [step_def(timeout_secs=1)]}, current="x")
        assert runner.drive(run) is None, "BUG: waiting for an executor thread counted against the step's timeout"
        assert run.current == "a(x)" and run.results[0]["duration_ms"] >= 1400
        runner.close()
    finally:
        one.shutdown(wait=False)


def test_steps_after_shutdown_of_either_pool(agents) -> None:
    agents.add("a")
    gone = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    gone.shutdown()
    runner = StepRunner(agents, agents, gone, lambda *a: True, threading.Event())
    run = steps_mod.RunState(run_id="r", workflow={"steps": [step_def(error_mode="retry", max_retries=2)]},
                             current="x")
    assert runner.drive(run) == "step 1 ('s') failed: the daemon is shutting down"
    assert run.results[0]["attempts"] == 1 and agents.calls == [], "BUG: a refused submit was retried"
    runner.close()
    live = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        fan = StepRunner(agents, agents, live, lambda *a: True, threading.Event())
        fan.close()   # the coordinators' pool is gone: fan-out branches cannot start
        run = steps_mod.RunState(run_id="r", workflow={"steps": [step_def(mode="fan_out"),
                                                                 step_def("t", mode="fan_out")]}, current="x")
        assert fan.drive(run) == "the daemon is shutting down" and run.results == []
    finally:
        live.shutdown(wait=False)


def test_a_queued_attempt_dropped_at_shutdown(agents) -> None:
    agents.add("a")
    one = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    release = threading.Event()
    one.submit(release.wait, 10)
    runner = StepRunner(agents, agents, one, lambda *a: True, threading.Event())
    run = steps_mod.RunState(run_id="r", workflow={"steps": [step_def(error_mode="retry", max_retries=3)]},
                             current="x")
    out: list = []
    driver = threading.Thread(target=lambda: out.append(runner.drive(run)), daemon=True)
    driver.start()
    time.sleep(0.3)
    one.shutdown(wait=False, cancel_futures=True)   # the queued attempt is cancelled, never run
    driver.join(5)
    release.set()
    assert out == ["step 1 ('s') failed: the daemon is shutting down"] and agents.calls == []
    assert run.results[0]["attempts"] == 1
    runner.close()


def test_a_skip_step_stopped_by_shutdown_fails(engine, agents) -> None:
    agents.add("b", blocking())
    wid = flow(engine, {"name": "s", "agent_name": "b", "error_mode": "skip"})
    out: list[dict] = []
    runner = threading.Thread(target=lambda: out.append(engine.run(wid, "x")), daemon=True)
    runner.start()
    deadline = time.monotonic() + 5
    while not agents.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.close()
    runner.join(5)
    assert out[0]["error"] == "step 1 ('s') failed: the daemon is shutting down", \
        "BUG: a step stopped by shutdown was skipped instead of failing the run"
    rec = records(engine, out[0])[0]
    assert (rec["status"], rec["output"], rec["error"]) == ("failed", "", "the daemon is shutting down")


def test_a_fan_out_group_at_the_end_hands_on_its_last_branch(engine, agents) -> None:
    agents.add("a")
    wid = flow(engine, {"name": "f1", "agent_name": "a", "mode": "fan_out", "prompt": "one"},
               {"name": "f2", "agent_name": "a", "mode": "fan_out", "prompt": "two"},
               {"name": "next", "agent_name": "a"})
    body = engine.run(wid, "x")
    assert body["output"] == "a(a(two))", "BUG: the step after a fan-out group does not get its last branch's output"


def test_three_branches_the_slowest_first_are_collected_in_step_order(engine, agents) -> None:
    # (in process what tests/workflows/test_workflows.py::test_fan_out_collect_in_step_order does through the daemon)
    done = {"b": threading.Event(), "c": threading.Event()}

    def last(prompt: str, cancel: threading.Event) -> str:
        assert done["b"].wait(10) and done["c"].wait(10), "the other branches did not run alongside"
        return f"A:{prompt}"

    def then(name: str) -> Behaviour:
        def behave(prompt: str, cancel: threading.Event) -> str:
            done[name].set()   # set just before it answers: A answers last
            return f"{name.upper()}:{prompt}"
        return behave

    agents.add("a", last)
    agents.add("b", then("b"))
    agents.add("c", then("c"))
    agents.add("z")
    wid = flow(engine, {"name": "A", "agent_name": "a", "mode": "fan_out", "prompt": "alpha {{input}}", "output_var": "x"},
               {"name": "B", "agent_name": "b", "mode": "fan_out", "prompt": "beta {{input}}"},
               {"name": "C", "agent_name": "c", "mode": "fan_out", "prompt": "gamma {{input}}"},
               {"name": "join", "mode": "collect"},
               {"name": "after", "agent_name": "z", "prompt": "{{x}} | {{input}}"})
    body = engine.run(wid, "q")
    joined = ("--- begin A ---\nA:alpha q\n--- end A ---\n\n--- begin B ---\nB:beta q\n--- end B ---\n\n"
              "--- begin C ---\nC:gamma q\n--- end C ---")
    assert body == {"run_id": body["run_id"], "output": f"z(A:alpha q | {joined})", "status": "completed"}, \
        "BUG: collect does not list the branches in step order, or the branch's output_var is lost"
    recs = records(engine, body)
    assert [(r["step_name"], r["step_index"], r["status"]) for r in recs] == [
        ("A", 0, "completed"), ("B", 1, "completed"), ("C", 2, "completed"), ("join", 3, "completed"),
        ("after", 4, "completed")]
    assert engine.run_detail(body["run_id"])["steps_completed"] == 5


def test_a_collect_step_with_an_agent_is_stopped_with_its_run(engine, agents) -> None:
    agents.add("a")
    agents.add("c", blocking())
    wid = flow(engine, {"name": "f", "agent_name": "a", "mode": "fan_out"},
               {"name": "j", "agent_name": "c", "mode": "collect", "timeout_secs": 60})
    out: list[dict] = []
    runner = threading.Thread(target=lambda: out.append(engine.run(wid, "x")), daemon=True)
    runner.start()
    deadline = time.monotonic() + 10
    while len(agents.calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)   # the collect's attempt polls its stop events meanwhile
    engine.close()
    runner.join(10)
    assert out and out[0]["error"] == "step 2 ('j') failed: the daemon is shutting down", \
        "BUG: a collect step's agent run does not watch the run's cancel event"
    assert agents.calls[1] == ("c", "--- begin f ---\na(x)\n--- end f ---", 60)
    assert agents.cancels[1].is_set(), "BUG: the collect's agent run is left going"
    rec = records(engine, out[0])[1]
    assert (rec["step_name"], rec["status"], rec["error"], rec["agent_name"]) == (
        "j", "failed", "the daemon is shutting down", "c")


class Gated(Agents):
    """Looks agents up (on the coordinator thread of a fan-out branch) behind a barrier."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.gate = threading.Barrier(parties, timeout=20)
        self.threads: list[str] = []

    def by_name(self, name: str) -> SimpleNamespace | None:
        with self._lock:
            self.threads.append(threading.current_thread().name)
        self.gate.wait()
        return super().by_name(name)


def test_forty_branches_wait_at_once_on_named_coordinator_threads(pool) -> None:
    agents = Gated(40)
    agents.add("a")
    runner = StepRunner(agents, agents, pool, lambda *a: True, threading.Event())
    try:
        run = steps_mod.RunState(run_id="r", workflow={"steps": [step_def(f"f{i}", mode="fan_out")
                                                                 for i in range(40)]}, current="x")
        assert runner.drive(run) is None, "BUG: fan-out branches do not all run at once (a CPU-sized pool?)"
        assert [r["step_name"] for r in run.results] == [f"f{i}" for i in range(40)]
        assert len(set(agents.threads)) == 40
        assert all(re.fullmatch(r"agentd-wf_\d+", name) for name in agents.threads), \
            f"BUG: the coordinator threads are not named agentd-wf_N: {sorted(set(agents.threads))[:3]}"
    finally:
        runner.close()


def test_close_drops_branches_still_queued_for_a_coordinator(pool) -> None:
    looked_up: list[str] = []

    class Watched(Agents):
        def by_name(self, name: str) -> SimpleNamespace | None:
            looked_up.append(name)
            return super().by_name(name)

    agents = Watched()
    agents.add("a")
    closing = threading.Event()
    runner = StepRunner(agents, agents, pool, lambda *a: True, closing)
    release = threading.Event()
    busy = [runner._coordinators.submit(release.wait, 30) for _ in range(256)]   # every coordinator taken
    run = steps_mod.RunState(run_id="r", workflow={"steps": [step_def("s", mode="fan_out"),
                                                             step_def("t", mode="fan_out"), step_def("u")]},
                             current="x")
    out: list = []
    driver = threading.Thread(target=lambda: out.append(runner.drive(run)), daemon=True)
    driver.start()
    try:
        time.sleep(0.5)
        assert looked_up == [], "BUG: more than 256 fan-out branches wait at once"
        closing.set()          # what WorkflowEngine.close() does: stop the runs, then the pool
        run.cancel.set()
        runner.close()
        assert not busy[0].done(), "BUG: close() waits for the coordinators' work to end"
        driver.join(10)
        assert out == ["step 1 ('s') failed: the daemon is shutting down"], \
            "BUG: a run whose branches were dropped at shutdown does not end, or ends with another error"
        assert run.results == [] and run.steps_completed == 0 and run.fanout == []
    finally:
        release.set()
    for future in busy:
        future.result(10)
    time.sleep(0.3)
    assert looked_up == [] and agents.calls == [], "BUG: branches queued at shutdown still ran"


def test_a_retry_step_stopped_mid_attempt_is_not_retried(engine, agents) -> None:
    agents.add("b", blocking())
    wid = flow(engine, {"name": "s", "agent_name": "b", "error_mode": "retry", "max_retries": 3})
    out: list[dict] = []
    runner = threading.Thread(target=lambda: out.append(engine.run(wid, "x")), daemon=True)
    runner.start()
    deadline = time.monotonic() + 10
    while not agents.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)   # the attempt is polling its stop events
    engine.close()
    runner.join(10)
    assert out and out[0]["error"] == "step 1 ('s') failed: the daemon is shutting down", \
        "BUG: an attempt stopped by its run counts as retryable"
    rec = records(engine, out[0])[0]
    assert (rec["attempts"], rec["error"]) == (1, "the daemon is shutting down") and len(agents.calls) == 1


def test_a_retry_wait_ends_when_a_sibling_branch_fails(agents, pool, caplog) -> None:
    backing_off = threading.Event()

    class Backoff(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "retrying" in record.getMessage():
                backing_off.set()

    def after_the_first_retry_wait_began(prompt: str, cancel: threading.Event) -> str:
        assert backing_off.wait(10), "the retrying branch never backed off"
        raise AgentdError("nope", status=400)

    agents.add("r", flaky(5))
    agents.add("b", after_the_first_retry_wait_began)
    runner = StepRunner(agents, agents, pool, lambda *a: True, threading.Event(), backoff_base=10.0)   # an 8 s wait
    handler = Backoff()
    logger = logging.getLogger("agentd.workflows")
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="agentd.workflows"):
            run = steps_mod.RunState(run_id="r", current="x", workflow={"steps": [
                step_def("r", agent="r", mode="fan_out", error_mode="retry", max_retries=2),
                step_def("b", agent="b", mode="fan_out")]})
            assert runner.drive(run) == "step 2 ('b') failed: nope"
    finally:
        logger.removeHandler(handler)
        runner.close()
    assert [(r["step_name"], r["status"], r["attempts"], r["error"]) for r in run.results] == [
        ("r", "failed", 1, "flake 4; retry abandoned: cancelled because a parallel fan_out step failed"),
        ("b", "failed", 1, "nope")], "BUG: a branch waiting to retry does not stop when a sibling fails"
    assert [c[0] for c in agents.calls] == ["r", "b"]


def test_a_timed_out_attempt_is_retried(engine, agents) -> None:
    first = [True]

    def slow_once(prompt: str, cancel: threading.Event) -> str:
        if first[0]:
            first[0] = False
            return blocking(5.0)(prompt, cancel)
        return "second try"

    agents.add("s", slow_once)
    body = engine.run(flow(engine, {"name": "t", "agent_name": "s", "timeout_secs": 1, "error_mode": "retry",
                                    "max_retries": 1}), "x")
    assert (body["status"], body["output"]) == ("completed", "second try"), "BUG: a timeout is not retried"
    assert records(engine, body)[0]["attempts"] == 2 and len(agents.calls) == 2
    assert agents.cancels[0].is_set() and not agents.cancels[1].is_set()


# -- runs started without waiting: progress, cancel -------------------------------------------------

def test_a_started_run_reports_its_step_in_progress_and_is_cancelled(engine, agents) -> None:
    agents.add("slow", blocking())
    agents.add("after")
    wid = flow(engine, {"name": "wait", "agent_name": "slow"}, {"name": "next", "agent_name": "after"})
    started = engine.start(wid, "go")
    run_id = started["run_id"]
    assert started == {"run_id": run_id, "status": "running"}
    deadline = time.monotonic() + 5
    while engine.progress(run_id)[1] != [0] and time.monotonic() < deadline:
        engine.wait_change(0.1)
    record, running = engine.progress(run_id)
    assert running == [0] and record["state"]["status"] == "running" and record["step_results"] == []
    final = engine.cancel(run_id)
    assert final["state"]["status"] == "failed" and final["error"] == "step 1 ('wait') failed: run cancelled"
    assert [r["status"] for r in final["step_results"]] == ["failed"]
    assert engine.progress(run_id)[1] == []
    assert [c[0] for c in agents.calls] == ["slow"], "the step after a cancelled one never runs"
    with pytest.raises(Conflict, match=f"workflow run {run_id} is not in progress \\(it failed\\)"):
        engine.cancel(run_id)
    with pytest.raises(NotFound):
        engine.cancel(str(uuid.uuid4()))
    with pytest.raises(BadRequest):
        engine.cancel("not-a-run")


def test_a_run_another_daemon_drives_is_not_cancelled_here(store, agents, pool) -> None:
    agents.add("a")
    here = WorkflowEngine(store, agents, agents, pool, daemon_id="d1")
    try:
        wid = here.create({"name": "elsewhere", "steps": [{"agent_name": "a"}]})
        # A run record of daemon d2 that this daemon does not drive.
        run_id = here.db.create_run(here.get(wid), "x", "d2")
        assert here.db.start_run(run_id)
        with pytest.raises(Conflict, match=f"workflow run {run_id} is driven by daemon d2; cancel it there"):
            here.cancel(run_id)
        assert here.progress(run_id)[1] == []
    finally:
        here.close()
