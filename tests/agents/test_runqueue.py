"""Per-agent run queues in process: a real executor, real agent handles, runs that block
until the test lets them go. Order, the 429 at the queue limit, withdrawal, cancellation.

The daemon's side (429 `agent_busy` over HTTP, a stuck provider holding one worker) is in
tests/llm/test_faults.py; here every branch of agents/runqueue.py with exact values.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

import pytest

from agentd.agents.approvals import ApprovalQueue
from agentd.agents.handle import AgentHandle
from agentd.agents.loop import RunCancelled
from agentd.agents.manifest import parse_manifest
from agentd.agents.runqueue import Poller, QueuedRun, RunQueues
from agentd.errors import AgentdError, NotFound, TooManyRequests

WAIT = 10  # generous: the machine is shared


def handle(name: str = "worker") -> AgentHandle:
    now = datetime.now(timezone.utc)
    return AgentHandle(id="a-" + name, name=name, manifest=parse_manifest(f'name = "{name}"\n'), mode="Auto",
                       state="Running", created_at=now, last_active=now, session_id="s", provider="openai",
                       model="m", api_key_env="", base_url="")


class Runs:
    """The run function: records each run (text and thread) and blocks until released."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.threads: dict[str, int] = {}
        self.gates: dict[str, threading.Event] = {}
        self.began: dict[str, threading.Event] = {}
        self.fail: dict[str, BaseException] = {}
        self.lock = threading.Lock()

    def gate(self, text: str) -> threading.Event:
        with self.lock:
            self.began.setdefault(text, threading.Event())
            return self.gates.setdefault(text, threading.Event())

    def job(self, text: str, cancel: threading.Event | None = None) -> QueuedRun:
        """A run of `text` by this runner."""
        j = QueuedRun(lambda h: self(h, j), cancel or threading.Event())
        j.text = text  # type: ignore[attr-defined]
        return j

    def __call__(self, h: AgentHandle, j: QueuedRun) -> Any:
        gate = self.gate(j.text)
        with self.lock:
            self.started.append(j.text)
            self.threads[j.text] = threading.get_ident()
        self.began[j.text].set()
        assert gate.wait(WAIT)
        if j.text in self.fail:
            raise self.fail[j.text]
        return f"done {j.text} by {h.name}"


@pytest.fixture()
def pool():
    executor = ThreadPoolExecutor(max_workers=3)
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


def queues(pool: ThreadPoolExecutor, runs: Runs, limit: int = 5) -> RunQueues:
    return RunQueues(pool, lambda: limit)


def test_idle_agent_runs_at_once_and_is_idle_after(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    first = runs.job("one")
    fut = q.submit(h, first)
    assert fut is first.future and fut.agentd_job == (h, first)
    assert runs.gate("one") and runs.began["one"].wait(WAIT)
    assert h.busy is True and list(h.waiting) == []
    assert h.starting is first.cancel, "BUG: a stop cannot reach the run that started"
    runs.gate("one").set()
    assert fut.result(WAIT) == "done one by worker"
    assert _eventually(lambda: h.busy is False), "BUG: an agent stays busy after its last run"
    assert h.starting is None


def _eventually(check, timeout: float = WAIT) -> bool:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if check():
            return True
        done.wait(0.01)
    return check()


def test_busy_agent_queues_in_order_on_the_same_worker(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    futures = [q.submit(h, runs.job(t)) for t in ("a", "b", "c")]
    assert runs.gate("a") and runs.began["a"].wait(WAIT)
    assert [j.text for j in h.waiting] == ["b", "c"], "BUG: a busy agent's requests must wait in its queue"
    assert runs.started == ["a"]
    for t in ("a", "b", "c"):
        runs.gate(t).set()
    assert [f.result(WAIT) for f in futures] == ["done a by worker", "done b by worker", "done c by worker"]
    assert runs.started == ["a", "b", "c"]
    assert len(set(runs.threads.values())) == 1, "BUG: queued runs must be drained by the worker that ran the first"
    assert _eventually(lambda: h.busy is False) and list(h.waiting) == []


def test_other_agents_are_not_held_up(pool) -> None:
    runs, a, b = Runs(), handle("a"), handle("b")
    q = queues(pool, runs)
    q.submit(a, runs.job("stuck"))
    assert runs.gate("stuck") and runs.began["stuck"].wait(WAIT)
    runs.gate("free").set()
    assert q.submit(b, runs.job("free")).result(WAIT) == "done free by b"
    runs.gate("stuck").set()


def test_queue_limit_exact_message_and_boundary(pool) -> None:
    runs, h = Runs(), handle("busy one")
    q = queues(pool, runs, limit=2)
    q.submit(h, runs.job("run"))
    assert runs.gate("run") and runs.began["run"].wait(WAIT)
    q.submit(h, runs.job("w1"))
    q.submit(h, runs.job("w2"))  # exactly at the limit: still queued
    assert len(h.waiting) == 2
    with pytest.raises(TooManyRequests) as info:
        q.submit(h, runs.job("w3"))
    exc = info.value
    assert exc.message == ("agent busy one is busy: 2 requests are already waiting for it (max_queue 2); "
                           "try again later")
    assert (exc.status, exc.retry_after, exc.code) == (429, 2, "agent_busy")
    assert [j.text for j in h.waiting] == ["w1", "w2"], "BUG: a refused request must not be queued"
    for t in ("run", "w1", "w2"):
        runs.gate(t).set()


def test_queue_limit_zero_refuses_any_wait_but_not_an_idle_agent(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs, limit=0)
    first = q.submit(h, runs.job("x"))
    with pytest.raises(TooManyRequests, match=r"0 requests are already waiting for it \(max_queue 0\)"):
        q.submit(h, runs.job("y"))
    runs.gate("x").set()
    assert first.result(WAIT) == "done x by worker"


def test_killed_agent_is_not_found(pool) -> None:
    runs, h = Runs(), handle()
    h.killed = True
    with pytest.raises(NotFound) as info:
        queues(pool, runs).submit(h, runs.job("x"))
    assert info.value.message == "agent not found" and info.value.status == 404
    assert h.busy is False and runs.started == []


def test_shut_down_executor_is_503_and_leaves_the_agent_idle() -> None:
    executor = ThreadPoolExecutor(max_workers=1)
    executor.shutdown()
    h = handle()
    with pytest.raises(AgentdError) as info:
        RunQueues(executor, lambda: 5).submit(h, Runs().job("x"))
    assert (info.value.message, info.value.status) == ("the daemon is shutting down", 503)
    assert h.busy is False, "BUG: a refused submit leaves the agent busy forever"
    assert h.starting is None, "BUG: a stop of the idle agent would report a run"


def test_cancelled_or_killed_before_start_never_runs(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    q.submit(h, runs.job("first"))
    assert runs.gate("first") and runs.began["first"].wait(WAIT)
    cancelled = runs.job("cancelled")
    plain = runs.job("plain")
    q.submit(h, cancelled)
    q.submit(h, plain)
    cancelled.cancel.set()
    runs.gate("first").set()
    runs.gate("plain").set()
    with pytest.raises(RunCancelled, match="^run cancelled before it started$"):
        cancelled.future.result(WAIT)
    assert plain.future.result(WAIT) == "done plain by worker"
    assert runs.started == ["first", "plain"]
    # killed while queued
    q.submit(h, runs.job("again"))
    assert runs.gate("again") and runs.began["again"].wait(WAIT)
    late = runs.job("late")
    q.submit(h, late)
    h.killed = True
    runs.gate("again").set()
    with pytest.raises(RunCancelled, match="^run cancelled before it started$"):
        late.future.result(WAIT)
    assert "late" not in runs.started


def test_future_cancelled_by_its_owner_is_skipped(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    q.submit(h, runs.job("first"))
    assert runs.gate("first") and runs.began["first"].wait(WAIT)
    dropped, kept = runs.job("dropped"), runs.job("kept")
    q.submit(h, dropped)
    q.submit(h, kept)
    assert dropped.future.cancel()
    runs.gate("first").set()
    runs.gate("kept").set()
    assert kept.future.result(WAIT) == "done kept by worker"
    assert runs.started == ["first", "kept"] and dropped.future.cancelled()


def test_a_failing_run_hands_its_error_to_the_waiter_and_the_queue_goes_on(pool) -> None:
    class Stop(BaseException):
        pass

    runs, h = Runs(), handle()
    runs.fail["bad"] = Stop("boom")
    runs.fail["worse"] = ValueError("no")
    q = queues(pool, runs)
    bad = q.submit(h, runs.job("bad"))
    worse = q.submit(h, runs.job("worse"))
    after = q.submit(h, runs.job("after"))
    for t in ("bad", "worse", "after"):
        runs.gate(t).set()
    with pytest.raises(Stop, match="boom"):
        bad.result(WAIT)
    with pytest.raises(ValueError, match="no"):
        worse.result(WAIT)
    assert after.result(WAIT) == "done after by worker"


def test_withdraw_takes_a_queued_run_out(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    running = q.submit(h, runs.job("running"))
    assert runs.gate("running") and runs.began["running"].wait(WAIT)
    queued = runs.job("queued")
    fut = q.submit(h, queued)
    assert RunQueues.withdraw(fut) is True
    assert queued.cancel.is_set() and list(h.waiting) == []
    with pytest.raises(RunCancelled, match="^run withdrawn before it started$"):
        fut.result(0)
    assert RunQueues.withdraw(fut) is False, "BUG: a run withdrawn once is not queued any more"
    # A running run cannot be withdrawn, but is told to stop.
    assert RunQueues.withdraw(running) is False
    assert running.agentd_job[1].cancel.is_set()
    assert RunQueues.withdraw(Future()) is False
    runs.gate("running").set()
    assert running.result(WAIT) == "done running by worker"
    assert runs.started == ["running"]


def test_withdraw_of_an_owner_cancelled_future_sets_nothing(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    q.submit(h, runs.job("running"))
    assert runs.gate("running") and runs.began["running"].wait(WAIT)
    queued = runs.job("queued")
    q.submit(h, queued)
    queued.future.cancel()
    assert RunQueues.withdraw(queued.future) is True and queued.future.cancelled()
    runs.gate("running").set()


def test_cancel_queued_cancels_every_waiting_run(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    q.submit(h, runs.job("running"))
    assert runs.gate("running") and runs.began["running"].wait(WAIT)
    waiting = [runs.job("w1"), runs.job("w2"), runs.job("w3")]
    for j in waiting:
        q.submit(h, j)
    waiting[1].future.cancel()
    assert RunQueues.cancel_queued(h) == 3
    assert list(h.waiting) == [] and all(j.cancel.is_set() for j in waiting)
    for j in (waiting[0], waiting[2]):
        with pytest.raises(RunCancelled, match="^run cancelled before it started$"):
            j.future.result(0)
    assert waiting[1].future.cancelled()
    assert RunQueues.cancel_queued(h) == 0
    runs.gate("running").set()
    assert _eventually(lambda: h.busy is False)
    assert runs.started == ["running"], "BUG: a cancelled queued run started"


def test_wait_returns_the_result(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    runs.gate("x").set()
    fut = q.submit(h, runs.job("x"))
    assert q.wait(fut, threading.Event()) == "done x by worker"
    assert q.wait(fut, threading.Event(), lambda: True) == "done x by worker"


def test_wait_stops_when_cancelled(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    fut = q.submit(h, runs.job("x"))
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(RunCancelled, match="^run cancelled$"):
        q.wait(fut, cancel, lambda: True)
    runs.gate("x").set()


def test_wait_withdraws_a_queued_run_when_the_client_left(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    q.submit(h, runs.job("running"))
    assert runs.gate("running") and runs.began["running"].wait(WAIT)
    queued = runs.job("queued")
    fut = q.submit(h, queued)
    cancel = threading.Event()
    with pytest.raises(RunCancelled, match="^the client disconnected$"):
        q.wait(fut, cancel, lambda: True)
    assert list(h.waiting) == [] and queued.cancel.is_set()
    assert not cancel.is_set(), "a withdrawn run needs no cancel: it never started"
    runs.gate("running").set()


def test_wait_cancels_a_running_run_when_the_client_left(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    running = runs.job("running")
    fut = q.submit(h, running)
    assert runs.gate("running") and runs.began["running"].wait(WAIT)
    cancel = threading.Event()
    calls = []

    def gone() -> bool:
        calls.append(1)
        return len(calls) >= 2   # present at the first check, gone at the second

    with pytest.raises(RunCancelled, match="^the client disconnected$"):
        q.wait(fut, cancel, gone)
    assert cancel.is_set(), "BUG: a running run of a client that left must be cancelled"
    assert len(calls) == 2
    runs.gate("running").set()


def test_wait_without_a_disconnect_check_keeps_waiting(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    fut = q.submit(h, runs.job("slow"))
    assert runs.gate("slow") and runs.began["slow"].wait(WAIT)
    threading.Timer(0.35, runs.gate("slow").set).start()   # several polls pass first
    assert q.wait(fut, threading.Event(), None) == "done slow by worker"


def test_run_here_runs_with_the_handle_and_refuses_a_cancelled_job_exactly(pool) -> None:
    runs, h = Runs(), handle("here")
    q = queues(pool, runs)
    runs.gate("now").set()
    assert q.run_here(h, runs.job("now")) == "done now by here", "BUG: run_here must run with the agent's handle"
    assert h.busy is False
    cancelled = runs.job("never")
    cancelled.cancel.set()
    with pytest.raises(RunCancelled) as info:
        q.run_here(h, cancelled)
    assert info.value.message == "run cancelled before it started" and runs.started == ["now"]


def test_run_here_on_a_busy_agent_waits_with_the_jobs_cancel_and_disconnect_check(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    q.submit(h, runs.job("running"))
    assert runs.gate("running") and runs.began["running"].wait(WAIT)
    stopped = runs.job("stopped")
    stopped.cancel.set()
    with pytest.raises(RunCancelled, match="^run cancelled$"):
        q.run_here(h, stopped)
    with pytest.raises(RunCancelled, match="^the client disconnected$"):
        q.run_here(h, runs.job("left"), lambda: True)
    runs.gate("running").set()


def test_hand_on_after_shutdown_cancels_the_next_run_exactly() -> None:
    executor = ThreadPoolExecutor(max_workers=1)
    runs, h = Runs(), handle()
    q = RunQueues(executor, lambda: 5)
    h.busy = True
    nxt = runs.job("next")
    h.waiting.append(nxt)
    executor.shutdown()
    q._hand_on(h)
    with pytest.raises(RunCancelled) as info:
        nxt.future.result(0)
    assert info.value.message == "run cancelled before it started" and h.busy is False
    assert h.starting is None, "BUG: a stop of the idle agent would report a run"


@pytest.fixture()
def held():
    """A pool whose only worker is busy until the event is set: what it is given waits."""
    executor = ThreadPoolExecutor(max_workers=1)
    release = threading.Event()
    executor.submit(release.wait, WAIT)
    yield executor, release
    release.set()
    executor.shutdown(wait=False)


def _submitted_to(held, name: str) -> tuple[RunQueues, AgentHandle, QueuedRun, Runs]:
    """A run of a new agent submitted to the held pool: accepted, no worker has it yet."""
    runs, h = Runs(), handle(name)
    q = RunQueues(held[0], lambda: 5)
    job = runs.job(name)
    q.submit(h, job)
    return q, h, job, runs


def test_a_stop_reaches_a_run_no_worker_has_picked_up_yet(held) -> None:
    q, h, job, runs = _submitted_to(held, "unpicked")
    assert q.stop(h) is True, "BUG: a stop right after the request finds no run"
    held[1].set()
    with pytest.raises(RunCancelled, match="^run cancelled before it started$"):
        job.future.result(WAIT)
    assert runs.started == []
    assert _eventually(lambda: h.busy is False) and h.starting is None
    assert q.stop(h) is False


def test_a_stop_reaches_a_queued_run_handed_on_to_a_worker(held) -> None:
    executor, release = held
    runs, h = Runs(), handle("handed")
    q = RunQueues(executor, lambda: 5)
    h.busy = True  # a run on a server thread holds the agent
    nxt = runs.job("next")
    h.waiting.append(nxt)
    q._hand_on(h)
    assert q.stop(h) is True, "BUG: the run handed on to a worker is out of a stop's reach"
    release.set()
    with pytest.raises(RunCancelled, match="^run cancelled before it started$"):
        nxt.future.result(WAIT)
    assert runs.started == [] and _eventually(lambda: h.busy is False) and h.starting is None


class PausingCancel(threading.Event):
    """A run's cancel event that holds the first other thread to read it until `go` is set:
    the worker taking the run is stopped right there, where the test acts."""

    def __init__(self) -> None:
        super().__init__()
        self.reached, self.go = threading.Event(), threading.Event()
        self.owner = threading.get_ident()

    def is_set(self) -> bool:
        if threading.get_ident() != self.owner and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(WAIT)
        return super().is_set()


def test_a_stop_reaches_the_next_queued_run_as_the_worker_moves_on_to_it(pool) -> None:
    runs, h = Runs(), handle("moving-on")
    q = queues(pool, runs)
    first = runs.job("first")
    q.submit(h, first)
    assert runs.gate("first") and runs.began["first"].wait(WAIT)
    cancel = PausingCancel()
    nxt = runs.job("next", cancel)
    q.submit(h, nxt)
    runs.gate("first").set()
    assert first.future.result(WAIT) == "done first by moving-on"
    assert cancel.reached.wait(WAIT), "the worker takes the queued run"
    assert q.stop(h) is True, "BUG: a stop between two queued runs finds no run"
    cancel.go.set()
    with pytest.raises(RunCancelled, match="^run cancelled before it started$"):
        nxt.future.result(WAIT)
    assert runs.started == ["first"]
    assert _eventually(lambda: h.busy is False) and h.starting is None


def test_a_run_its_owner_dropped_before_a_worker_took_it_leaves_nothing_to_stop(held) -> None:
    q, h, job, runs = _submitted_to(held, "dropped")
    assert job.future.cancel()
    held[1].set()
    assert _eventually(lambda: h.busy is False)
    assert h.starting is None and q.stop(h) is False, "BUG: a stop reports a run that never ran"
    assert runs.started == []


def test_run_here_watches_a_client_only_while_it_runs(pool) -> None:
    runs, h = Runs(), handle()
    q = queues(pool, runs)
    seen: list[dict] = []

    class Watching(Runs):
        def __call__(self, hh, j):
            seen.append(dict(q.watch._watched))
            return super().__call__(hh, j)

    watching = Watching()
    watching.gate("plain").set()
    watching.gate("watched").set()
    assert q.run_here(h, watching.job("plain")) == "done plain by worker"
    watched = watching.job("watched")
    assert q.run_here(h, watched, lambda: False) == "done watched by worker"
    assert seen[0] == {}, "BUG: a run without a disconnect check is watched (the watcher would call None)"
    assert list(seen[1]) == [id(watched.cancel)]
    assert q.watch._watched == {}, "BUG: a finished run is still watched"


class StopRequests:
    """The cluster's stop requests to other daemons: agent ids asked, and how many runs each reached."""

    def __init__(self, reached: int) -> None:
        self.reached = reached
        self.asked: list[str] = []

    def request_stop(self, agent_id: str) -> int:
        self.asked.append(agent_id)
        return self.reached


def test_stop_sets_the_running_runs_cancel_and_cancels_the_agents_approvals(pool) -> None:
    approvals = ApprovalQueue()
    h, other = handle("stopped"), handle("other")
    waiting = approvals.request(h.id, h.name, "shell_exec", {})
    elsewhere = approvals.request(other.id, other.name, "shell_exec", {})
    q = RunQueues(pool, lambda: 5, approvals=approvals)
    assert q.stop(h) is False, "nothing running: nothing stopped"
    assert waiting.decision == "cancelled" and elsewhere.decision is None
    h.starting = threading.Event()  # a queued run just started, its cancel not handed over yet
    again = approvals.request(h.id, h.name, "shell_exec", {})
    assert q.stop(h) is True and h.starting.is_set()
    assert again.decision == "cancelled", "the stopped run's approvals end with it, at once"
    assert q.stop(h) is False, "an already cancelled run is not stopped twice"
    h.starting, h.cancel = None, threading.Event()
    assert q.stop(h) is True and h.cancel.is_set()


def test_stop_on_a_shared_database_asks_the_other_daemons_only_when_no_run_is_here(pool) -> None:
    h = handle("shared")
    cluster = StopRequests(reached=1)
    q = RunQueues(pool, lambda: 5, cluster=cluster, shared=True)
    h.cancel = threading.Event()
    assert q.stop(h) is True and h.cancel.is_set() and cluster.asked == []
    assert q.stop(h) is True and cluster.asked == [h.id], "already cancelled here: another daemon's run"
    h.cancel = None
    assert RunQueues(pool, lambda: 5, cluster=StopRequests(reached=0), shared=True).stop(h) is False
    # Not shared (one daemon): the cluster is never asked.
    lonely = StopRequests(reached=1)
    assert RunQueues(pool, lambda: 5, cluster=lonely).stop(h) is False and lonely.asked == []


def test_cancel_withdraws_the_queue_and_stops_the_running_run(pool) -> None:
    runs = Runs()
    q = queues(pool, runs)
    h = handle("cancelled")
    release = runs.gate("first")
    first = q.submit(h, runs.job("first"))
    assert runs.began["first"].wait(WAIT)
    queued = q.submit(h, runs.job("queued"))
    h.cancel = threading.Event()
    q.cancel(h)
    assert h.cancel.is_set()
    with pytest.raises(RunCancelled):
        queued.result(WAIT)
    release.set()
    first.result(WAIT)
    assert runs.started == ["first"]


def test_a_failing_check_is_dropped_and_the_others_go_on_being_polled(caplog) -> None:
    poller = Poller("agentd-test-poller", 60.0)
    calls: list[str] = []

    def broken() -> None:
        calls.append("broken")
        raise RuntimeError("no application context")

    poller.add_check(1, broken)
    poller.add_check(2, lambda: calls.append("fine"))
    with caplog.at_level("ERROR", logger="agentd.agents"):
        poller.poll()
        poller.poll()
    assert calls == ["broken", "fine", "fine"]
    assert [r.getMessage() for r in caplog.records] == ["agentd-test-poller: a check failed and was dropped"]
    assert str(caplog.records[0].exc_info[1]) == "no application context"
    poller.remove(2)
