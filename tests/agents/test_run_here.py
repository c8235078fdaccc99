"""RunQueues.run_here: a plain request runs its idle agent's message on its own thread.

In process, on the real RunQueues with a stand-in for the run itself (what a run does is
tested through the daemon elsewhere; here: which thread runs it, queueing behind it, the
hand-over of queued runs, stops and client disconnects)."""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from agentd.agents.loop import RunCancelled
from agentd.agents.runqueue import DisconnectWatch, QueuedRun, RunQueues
from agentd.errors import NotFound, TooManyRequests
from support import in_forked_child


def agent() -> SimpleNamespace:
    return SimpleNamespace(name="alpha", killed=False, waiting=collections.deque(), busy=False,
                           queue_lock=threading.Lock())


# Generous: on a loaded CI machine a thread can wait seconds for its first turn (a 5 s wait
# once ran out). Waits return as soon as the condition holds.
WAIT = 30.0

class Events(dict):
    """An event per name, made on first use by whichever thread asks first.

    (Not a `defaultdict(threading.Event)`: there the test thread and the run's thread could
    each make an event for the same name at once, one replacing the other, and the test then
    waited on the one nobody would set.)"""

    def __missing__(self, name: str) -> threading.Event:
        return self.setdefault(name, threading.Event())


class Recorder:
    """The run: records the thread and text of each call; `gate` holds runs whose text is in it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.gates: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = Events()

    def job(self, text: str, cancel: threading.Event | None = None) -> QueuedRun:
        """A run of `text` by this recorder."""
        j = QueuedRun(lambda handle: self(handle, j), cancel or threading.Event())
        j.text = text  # type: ignore[attr-defined]
        return j

    def __call__(self, handle, j: QueuedRun):
        self.calls.append((j.text, threading.current_thread().name))
        self.started[j.text].set()
        gate = self.gates.get(j.text)
        if gate is not None:
            while not gate.wait(0.01):
                if j.cancel.is_set():
                    raise RunCancelled("run cancelled")
        return f"answer to {j.text}"


@pytest.fixture()
def pool():
    executor = ThreadPoolExecutor(4, thread_name_prefix="run-worker")
    yield executor
    executor.shutdown(wait=True)


def test_an_idle_agent_runs_on_the_calling_thread_and_is_idle_after(pool) -> None:
    run = Recorder()
    queues = RunQueues(pool, lambda: 8)
    a = agent()
    seen: list = []
    here = run.job("hi")
    here.execute = lambda handle: (seen.append(handle.starting), run(handle, here))[1]
    assert queues.run_here(a, here) == "answer to hi"
    assert run.calls == [("hi", threading.current_thread().name)], "BUG: the run did not use the caller's thread"
    assert a.busy is False and not a.waiting
    assert seen == [here.cancel] and a.starting is None, "a stop reaches the run while it runs, and only then"


def test_a_busy_agent_queues_the_request_and_queued_runs_continue_on_a_worker(pool) -> None:
    run = Recorder()
    run.gates["first"] = threading.Event()
    queues = RunQueues(pool, lambda: 8)
    a = agent()
    results: dict[str, str] = {}
    first = threading.Thread(target=lambda: results.setdefault("first", queues.run_here(a, run.job("first"))),
                             name="request-1")
    first.start()
    assert run.started["first"].wait(WAIT)
    second = threading.Thread(target=lambda: results.setdefault("second", queues.run_here(a, run.job("second"))),
                              name="request-2")
    second.start()
    deadline = time.monotonic() + 5
    while len(a.waiting) != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(a.waiting) == 1 and a.busy is True
    run.gates["first"].set()
    first.join(WAIT)
    second.join(WAIT)
    assert results == {"first": "answer to first", "second": "answer to second"}
    assert run.calls[0] == ("first", "request-1")
    assert run.calls[1][0] == "second" and run.calls[1][1].startswith("run-worker"), \
        "BUG: a queued run did not go to a worker after the run on the request thread"
    assert a.busy is False and not a.waiting


def test_full_queue_and_killed_agent_are_refused(pool) -> None:
    run = Recorder()
    run.gates["first"] = threading.Event()
    queues = RunQueues(pool, lambda: 0)
    a = agent()
    t = threading.Thread(target=lambda: queues.run_here(a, run.job("first")))
    t.start()
    assert run.started["first"].wait(WAIT)
    with pytest.raises(TooManyRequests) as refused:
        queues.run_here(a, run.job("second"))
    assert refused.value.code == "agent_busy"
    run.gates["first"].set()
    t.join(WAIT)
    a.killed = True
    with pytest.raises(NotFound):
        queues.run_here(a, run.job("third"))
    assert [c[0] for c in run.calls] == ["first"]


def test_a_cancelled_request_never_starts(pool) -> None:
    run = Recorder()
    queues = RunQueues(pool, lambda: 8)
    a = agent()
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(RunCancelled, match="before it started"):
        queues.run_here(a, run.job("late", cancel))
    assert run.calls == [] and a.busy is False


def test_a_client_that_leaves_stops_its_running_run(pool) -> None:
    run = Recorder()
    run.gates["slow"] = threading.Event()
    queues = RunQueues(pool, lambda: 8)
    a = agent()
    gone = threading.Event()
    cancel = threading.Event()
    caught: list[BaseException] = []

    def request() -> None:
        try:
            queues.run_here(a, run.job("slow", cancel), disconnected=gone.is_set)
        except BaseException as exc:  # noqa: BLE001
            caught.append(exc)

    t = threading.Thread(target=request)
    t.start()
    assert run.started["slow"].wait(WAIT)
    time.sleep(0.3)
    assert not cancel.is_set(), "BUG: a run was stopped while its client was still there"
    gone.set()
    t.join(WAIT)
    assert not t.is_alive() and cancel.is_set(), "BUG: a client that left did not stop its run"
    assert len(caught) == 1 and isinstance(caught[0], RunCancelled)
    assert a.busy is False


def test_queued_runs_are_cancelled_when_the_pool_is_gone() -> None:
    executor = ThreadPoolExecutor(1)
    run = Recorder()
    run.gates["first"] = threading.Event()
    queues = RunQueues(executor, lambda: 8)
    a = agent()
    t = threading.Thread(target=lambda: queues.run_here(a, run.job("first")))
    t.start()
    assert run.started["first"].wait(WAIT)
    queued = [run.job("q1"), run.job("q2")]
    futures = [queues.submit(a, q) for q in queued]
    executor.shutdown(wait=False)  # the daemon is stopping
    run.gates["first"].set()
    t.join(WAIT)
    for f in futures:
        with pytest.raises(RunCancelled):
            f.result(timeout=5)
    assert a.busy is False and not a.waiting
    assert [c[0] for c in run.calls] == ["first"]


def test_the_watch_polls_only_what_it_watches_and_sleeps_when_empty() -> None:
    watch = DisconnectWatch()
    left, stays = threading.Event(), threading.Event()
    key_left = watch.add(left, lambda: True)
    key_stays = watch.add(stays, lambda: False)
    deadline = time.monotonic() + 5
    while not left.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert left.is_set() and not stays.is_set()
    watch.remove(key_left)
    watch.remove(key_stays)
    watch.poll()
    assert not watch._wake.is_set(), "BUG: the watch keeps polling with nothing to watch"
    after = threading.Event()
    watch.remove(watch.add(after, lambda: True))  # removed before a poll: never cancelled
    watch.poll()
    assert not after.is_set()


def test_a_forked_child_watches_its_own_clients_on_a_thread_of_its_own() -> None:
    watch = DisconnectWatch()
    asked: list[str] = []  # appended to without a lock: a fork may land at any moment
    key = watch.add(threading.Event(), lambda: asked.append("parent"))
    deadline = time.monotonic() + WAIT
    while not asked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert asked, "the parent's watch never polled"

    def child_watches_only_its_own() -> bool:
        del asked[:]
        left = threading.Event()
        watch.add(left, lambda: True)
        return left.wait(WAIT) and asked == []

    try:
        assert in_forked_child(child_watches_only_its_own), \
            "BUG: a forked child's watch has no thread, or polls its parent's clients"
    finally:
        watch.remove(key)


def test_the_watch_thread_is_a_named_daemon_thread_and_removal_is_idempotent() -> None:
    watch = DisconnectWatch()
    key = watch.add(threading.Event(), lambda: False)
    thread = watch._thread
    assert thread is not None and thread.is_alive()
    assert thread.daemon is True, "BUG: the disconnect watcher would keep a stopping daemon's process alive"
    assert thread.name == "agentd-client-watch"
    watch.remove(key)
    watch.remove(key)  # a run removed twice (or never watched) is not an error
    again = watch.add(threading.Event(), lambda: False)
    assert watch._thread is thread, "BUG: a second watcher thread was started"
    watch.remove(again)


# -- claim(): the place taken now, the run started later (streams written in place) -------------------------

def gated(pool, max_queue: int = 8) -> tuple[Recorder, RunQueues, SimpleNamespace]:
    """A run held at "first" until its gate opens, the queues over it, and an idle agent."""
    run = Recorder()
    run.gates["first"] = threading.Event()
    return run, RunQueues(pool, lambda: max_queue), agent()


def test_a_claim_of_an_idle_agent_holds_it_until_the_run_here_ends(pool) -> None:
    run = Recorder()
    queues = RunQueues(pool, lambda: 8)
    a = agent()
    claimed = queues.claim(a, run.job("mine"))
    assert claimed.here is True and a.busy is True, "BUG: a claimed idle agent is not held for the caller"
    assert run.calls == [], "BUG: the run started at the claim"
    assert claimed.result() == "answer to mine"
    assert run.calls == [("mine", threading.current_thread().name)]
    assert a.busy is False
    claimed.abandon()  # after result(): nothing
    assert a.busy is False and not a.waiting


def test_a_claim_of_a_busy_agent_queues_for_a_worker_and_waits(pool) -> None:
    run, queues, a = gated(pool)
    holder = queues.claim(a, run.job("first"))
    claimed = queues.claim(a, run.job("second"))
    assert claimed.here is False and len(a.waiting) == 1
    finishing = threading.Thread(target=holder.result, name="request-1")
    finishing.start()
    run.gates["first"].set()
    assert claimed.result() == "answer to second"
    finishing.join(WAIT)
    assert run.calls[1][0] == "second" and run.calls[1][1].startswith("run-worker")
    assert a.busy is False and not a.waiting


def test_a_claim_is_refused_when_the_queue_is_full_or_the_agent_killed(pool) -> None:
    run = Recorder()
    queues = RunQueues(pool, lambda: 0)
    a = agent()
    queues.claim(a, run.job("first"))
    with pytest.raises(TooManyRequests):
        queues.claim(a, run.job("second"))
    dead = agent()
    dead.killed = True
    with pytest.raises(NotFound):
        queues.claim(dead, run.job("late"))
    assert dead.busy is False


def test_abandoning_an_unstarted_claim_frees_the_agent_or_withdraws_the_run(pool) -> None:
    run, queues, a = gated(pool)
    holder = queues.claim(a, run.job("first"))
    queued_job = run.job("second")
    queued = queues.claim(a, queued_job)
    queued.abandon()
    assert not a.waiting, "BUG: an abandoned queued run is still waiting"
    assert queued_job.cancel.is_set()
    with pytest.raises(RunCancelled):
        queued_job.future.result(timeout=1)
    holder.abandon()
    assert a.busy is False, "BUG: an abandoned claim keeps the agent busy"
    assert run.calls == [], "an abandoned claim never runs"
    # Abandoned with a run queued behind it: the agent goes on to that run on a worker.
    b = agent()
    first = queues.claim(b, run.job("x"))
    behind = queues.claim(b, run.job("y"))
    first.abandon()
    assert behind.result() == "answer to y"
    assert [c[0] for c in run.calls] == ["y"]
    assert b.busy is False


def test_a_claim_acts_once_whatever_comes_after(pool) -> None:
    run, queues, a = gated(pool)
    run.gates["first"].set()
    done = queues.claim(a, run.job("first"))
    assert done.result() == "answer to first"
    holder = queues.claim(a, run.job("next"))  # the agent is someone else's now
    done.abandon()
    assert a.busy is True, "BUG: abandoning a finished claim freed an agent another caller holds"
    dropped = queues.claim(agent(), run.job("x"))
    b = dropped.handle
    dropped.abandon()
    again = queues.claim(b, run.job("y"))
    dropped.abandon()
    assert b.busy is True, "BUG: a second abandon freed the agent its next caller holds"
    holder.abandon()
    again.abandon()
    # A queued claim that finished: abandoning it afterwards cancels nothing.
    run2, queues2, c = gated(pool)
    first = queues2.claim(c, run.job("first"))
    queued = queues2.claim(c, run.job("second"))
    threading.Thread(target=first.result).start()
    run2.gates["first"].set()
    assert queued.result() == "answer to second"
    queued.abandon()
    assert not queued.job.cancel.is_set(), "BUG: abandoning a finished queued run flagged it cancelled"


def test_abandoning_a_queued_claim_its_worker_already_started_stops_it(pool) -> None:
    run, queues, a = gated(pool)
    run.gates["second"] = threading.Event()  # never opened: only a cancel ends it
    holder = queues.claim(a, run.job("first"))
    queued = queues.claim(a, run.job("second"))
    holder.abandon()  # the agent goes on to "second", on a worker
    assert run.started["second"].wait(WAIT)
    queued.abandon()
    assert queued.job.cancel.is_set(), "BUG: a started run whose client left was not stopped"
    with pytest.raises(RunCancelled):
        queued.job.future.result(timeout=5)
