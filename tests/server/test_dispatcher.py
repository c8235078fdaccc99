"""The daemon's waitress dispatcher wakes the thread that went idle last (agentd/server/dispatcher.py).

Waitress's own dispatcher wakes the longest-idle thread, so every one of its threads takes
turns and keeps its own database connection and caches warm: RSS kept growing with the
thread count. These tests pin the order, that sequential requests stay on one thread, and
that the daemon's pool has the configured size.
"""

from __future__ import annotations

import collections
import threading
import time

import requests
import waitress
from waitress import wasyncore

from agentd.server.dispatcher import LifoCondition, LifoTaskDispatcher


def test_notify_wakes_the_thread_that_waited_last() -> None:
    cond = LifoCondition(threading.Lock())
    woke: list[int] = []
    threads = []
    for i in range(3):
        def wait(i: int = i) -> None:
            with cond:
                cond.wait()
                woke.append(i)
        t = threading.Thread(target=wait, daemon=True)  # (a broken condition must not hang the run)
        t.start()
        threads.append(t)
        while len(cond._waiters) != i + 1:  # noqa: SLF001 - wait until it really waits
            time.sleep(0.001)
    for expected in ([2], [2, 1]):
        with cond:
            cond.notify()
        while len(woke) != len(expected):
            time.sleep(0.001)
        assert woke == expected, "BUG: notify did not wake the most recent waiter"
    with cond:
        cond.notify(5)   # more than are waiting: wakes the one left, no error
    threads[0].join(5)
    assert woke == [2, 1, 0]
    with cond:
        cond.notify()    # nobody waits: a no-op
    try:
        cond.notify()
    except RuntimeError as exc:
        assert str(exc) == "cannot notify on un-acquired lock"
    else:
        raise AssertionError("BUG: notify without the lock was allowed")


def test_notify_all_wakes_everyone() -> None:
    cond = LifoCondition(threading.Lock())
    woke: list[int] = []
    threads = [threading.Thread(target=lambda i=i: (cond.acquire(), cond.wait(), woke.append(i), cond.release()),
                                daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    while len(cond._waiters) != 4:  # noqa: SLF001
        time.sleep(0.001)
    with cond:
        cond.notify_all()
    for t in threads:
        t.join(5)
    assert sorted(woke) == [0, 1, 2, 3]


def test_a_released_waiter_is_skipped_not_counted() -> None:
    cond = LifoCondition(threading.Lock())
    done = threading.Lock()
    done.acquire()
    stale = threading.Lock()   # a waiter lock already released (see CPython gh-92530)
    with cond:
        cond._waiters.append(done)   # noqa: SLF001 - the real waiter, first in line
        cond._waiters.append(stale)  # noqa: SLF001 - the stale one, last
        cond.notify()
        assert not cond._waiters, "both were taken off the list"  # noqa: SLF001
    assert not stale.locked() and not done.locked(), "BUG: the stale waiter counted as the one woken"


def test_sequential_requests_stay_on_one_thread() -> None:
    seen: list[int] = []

    def app(environ, start_response):
        seen.append(threading.get_ident())
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    dispatcher = LifoTaskDispatcher()
    server = waitress.create_server(app, host="127.0.0.1", port=0, _dispatcher=dispatcher)
    dispatcher.set_thread_count(8)
    stop = threading.Event()
    loop = threading.Thread(target=lambda: [wasyncore.loop(timeout=0.05, map=server._map, count=1)  # noqa: SLF001
                                            for _ in iter(stop.is_set, True)], daemon=True)
    loop.start()
    try:
        time.sleep(0.2)   # every thread parked
        s = requests.Session()
        for _ in range(30):
            assert s.get(f"http://127.0.0.1:{server.effective_port}/", timeout=5).text == "ok"
            # The serving thread is back among the idle ones before the next request: which
            # idle thread is woken is what this checks, not how fast one returns.
            time.sleep(0.005)
    finally:
        stop.set()
        loop.join(5)
        server.close()
    assert len(seen) == 30
    # A FIFO pool hands each request to the next of its 8 threads (about 4 each); LIFO keeps
    # the one warm thread, but a thread descheduled at the wrong moment may lose a turn.
    served = collections.Counter(seen).most_common(1)[0][1]
    assert served >= 26, f"BUG: {len(set(seen))} threads took turns serving one client"


class _Task:
    """A task that holds its thread until released, noting the thread that ran it."""

    def __init__(self, release: threading.Event, ran: list[int]) -> None:
        self.release = release
        self.ran = ran

    def service(self) -> None:
        self.ran.append(threading.get_ident())
        self.release.wait(10)

    def cancel(self) -> None:
        pass


def _wait_for(check, what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, f"BUG: {what}"
        time.sleep(0.002)


def test_threads_start_as_tasks_need_them_up_to_the_size() -> None:
    from agentd.server.dispatcher import INITIAL_THREADS

    assert INITIAL_THREADS == 4
    dispatcher = LifoTaskDispatcher()
    dispatcher.set_thread_count(7)
    try:
        assert dispatcher.limit == 7
        assert len(dispatcher.threads) == 4, "the pool starts with its first few threads only"
        _wait_for(lambda: dispatcher.active_count == 0, "the first threads never parked")
        release = threading.Event()
        ran: list[int] = []
        for n in range(1, 4):  # idle threads take these: nothing new starts
            dispatcher.add_task(_Task(release, ran))
            _wait_for(lambda n=n: len(ran) == n, "a task was not run")
            assert len(dispatcher.threads) == 4
        for n in range(4, 8):  # the fourth is the last idle thread; then one new thread each
            dispatcher.add_task(_Task(release, ran))
            _wait_for(lambda n=n: len(ran) == n, f"task {n} did not run at once (no thread started)")
            assert len(dispatcher.threads) == max(4, n), f"{len(dispatcher.threads)} threads for {n} busy tasks"
        dispatcher.add_task(_Task(release, ran))  # past the size: it waits in the queue
        time.sleep(0.05)
        assert len(dispatcher.threads) == 7 and len(ran) == 7 and len(dispatcher.queue) == 1
        release.set()
        _wait_for(lambda: len(ran) == 8, "the queued task never ran")
        assert len(set(ran)) == 7
        assert sorted(dispatcher.threads) == list(range(7)), "threads are numbered from 0 as waitress numbers them"
        _wait_for(lambda: dispatcher.active_count == 0, "the count of busy threads did not return to 0")
    finally:
        release.set()
        dispatcher.shutdown(timeout=5)
    assert not dispatcher.threads, "BUG: shutdown left threads running"


def test_a_pool_never_sized_starts_no_thread() -> None:
    dispatcher = LifoTaskDispatcher()
    assert dispatcher.limit == 0
    dispatcher.add_task(_Task(threading.Event(), []))
    assert not dispatcher.threads and len(dispatcher.queue) == 1


def test_a_small_pool_starts_whole_and_a_resize_keeps_started_threads() -> None:
    dispatcher = LifoTaskDispatcher()
    dispatcher.set_thread_count(2)
    try:
        assert len(dispatcher.threads) == 2 and dispatcher.limit == 2
        dispatcher.set_thread_count(10)
        assert len(dispatcher.threads) == 4 and dispatcher.limit == 10
        release = threading.Event()
        ran: list[int] = []
        _wait_for(lambda: dispatcher.active_count == 0, "the started threads never parked")
        for n in range(1, 7):  # (one at a time: a thread just started counts as busy until it parks)
            dispatcher.add_task(_Task(release, ran))
            _wait_for(lambda n=n: len(ran) == n, "a task did not run")
        assert len(dispatcher.threads) == 6
        dispatcher.set_thread_count(5)  # smaller than started: one thread is told to stop
        assert dispatcher.limit == 5 and dispatcher.stop_count == 1
        release.set()
        _wait_for(lambda: len(dispatcher.threads) == 5, "the pool did not shrink to its new size")
        _wait_for(lambda: dispatcher.active_count == 0, "the stopped thread is still counted busy or idle")
        assert dispatcher.stop_count == 0
        again = threading.Event()
        for n in range(7, 12):  # the five left take five tasks: no thread starts, none waits
            dispatcher.add_task(_Task(again, ran))
            _wait_for(lambda n=n: len(ran) == n, "a task did not run on the shrunk pool")
        assert len(dispatcher.threads) == 5 and not dispatcher.queue
        again.set()
    finally:
        release.set()
        dispatcher.shutdown(timeout=5)


def test_the_daemon_reports_its_pool_size_and_started_threads(shared_daemon) -> None:
    pool = shared_daemon.get("/api/health/detail").json()["thread_pool"]
    assert pool["threads"] == 128, "[api] threads default"
    assert 4 <= pool["started"] <= 128 and pool["busy"] >= 1 and pool["queued"] == 0


def test_a_thread_started_for_a_task_is_no_queue_warning_but_a_full_pool_warns(caplog) -> None:
    # waitress warns "Task queue depth is N" when tasks wait for a thread; a task that gets
    # a new thread does not wait.
    dispatcher = LifoTaskDispatcher()
    dispatcher.set_thread_count(5)
    release = threading.Event()
    ran: list[int] = []
    try:
        _wait_for(lambda: dispatcher.active_count == 0, "the first threads never parked")
        with caplog.at_level("WARNING", logger="waitress.queue"):
            for n in range(1, 6):
                dispatcher.add_task(_Task(release, ran))
                _wait_for(lambda n=n: len(ran) == n, "a task did not run")
            assert len(dispatcher.threads) == 5
            assert [r.getMessage() for r in caplog.records if r.name == "waitress.queue"] == []
            dispatcher.add_task(_Task(release, ran))
            dispatcher.add_task(_Task(release, ran))
            assert [r.getMessage() for r in caplog.records if r.name == "waitress.queue"] == \
                ["Task queue depth is 1", "Task queue depth is 2"]
        release.set()
        _wait_for(lambda: len(ran) == 7, "the queued tasks never ran")
    finally:
        release.set()
        dispatcher.shutdown(timeout=5)


def test_a_request_waits_while_enough_others_have_only_just_begun_then_runs_when_one_grows_old() -> None:
    # Fresh for a second: the check below that the third waits comes well inside it on a loaded host.
    dispatcher = LifoTaskDispatcher(fresh_limit=2, fresh_secs=1.0)
    dispatcher.set_thread_count(6)
    release = threading.Event()
    ran: list[int] = []
    try:
        _wait_for(lambda: dispatcher.active_count == 0, "the first threads never parked")
        began = time.monotonic()
        for _ in range(3):
            dispatcher.add_task(_Task(release, ran))
        _wait_for(lambda: len(ran) == 2, "the first two did not run at once")
        time.sleep(0.1)
        assert len(ran) == 2 and len(dispatcher.queue) == 1, "BUG: a third started beside two fresh ones"
        _wait_for(lambda: len(ran) == 3, "the held request never ran once the others grew old")
        assert 0.95 < time.monotonic() - began < 5.0
        assert len(set(ran)) == 3, "each request holds a thread of its own"
    finally:
        release.set()
        dispatcher.shutdown(timeout=5)
    assert not dispatcher.threads


def test_a_held_request_takes_the_thread_of_one_that_ends() -> None:
    dispatcher = LifoTaskDispatcher(fresh_limit=2, fresh_secs=30)
    dispatcher.set_thread_count(6)
    first, rest = threading.Event(), threading.Event()
    ran: list[int] = []
    try:
        _wait_for(lambda: dispatcher.active_count == 0, "the first threads never parked")
        dispatcher.add_task(_Task(first, ran))
        _wait_for(lambda: len(ran) == 1, "the first did not run")
        dispatcher.add_task(_Task(rest, ran))
        dispatcher.add_task(_Task(rest, ran))
        _wait_for(lambda: len(ran) == 2, "the second did not run")
        time.sleep(0.05)
        assert len(ran) == 2, "BUG: a third started beside two fresh ones"
        first.set()
        _wait_for(lambda: len(ran) == 3, "the held request did not run when a fresh one ended")
        assert ran[2] == ran[0], "the thread whose request ended takes the held one"
    finally:
        first.set()
        rest.set()
        dispatcher.shutdown(timeout=5)


def test_slow_requests_each_get_a_thread_soon() -> None:
    # (A model that takes seconds: every request waits on it, none on the GIL.)
    dispatcher = LifoTaskDispatcher(fresh_limit=1, fresh_secs=0.02)
    dispatcher.set_thread_count(12)
    release = threading.Event()
    ran: list[int] = []
    try:
        for _ in range(10):
            dispatcher.add_task(_Task(release, ran))
        _wait_for(lambda: len(ran) == 10, "slow requests were held back for good")
        assert len(set(ran)) == 10 and not dispatcher.queue
    finally:
        release.set()
        dispatcher.shutdown(timeout=5)
    assert not dispatcher.threads


def test_requests_held_back_together_all_start_once_the_first_grow_old() -> None:
    # (All threads busy when the first ones grow old: each admitted request must bring the
    # next one a thread, with no new request arriving to start one.)
    dispatcher = LifoTaskDispatcher(fresh_limit=4, fresh_secs=0.05)
    dispatcher.set_thread_count(16)
    release = threading.Event()
    ran: list[int] = []
    try:
        for _ in range(12):
            dispatcher.add_task(_Task(release, ran))
        _wait_for(lambda: len(ran) == 12, "requests held back together never all started")
        assert len(set(ran)) == 12 and not dispatcher.queue
    finally:
        release.set()
        dispatcher.shutdown(timeout=5)
    assert not dispatcher.threads


def test_how_long_a_request_is_held_counts_the_fresh_requests_only() -> None:
    dispatcher = LifoTaskDispatcher(fresh_limit=2, fresh_secs=1.0)   # (no thread started)
    began = dispatcher.began
    assert dispatcher.held_for(10.0) == 0.0
    began.update({1: 9.5})
    assert dispatcher.held_for(10.0) == 0.0, "fewer than the limit are running"
    began.clear()
    began.update({1: 0.0, 2: 9.5})
    assert dispatcher.held_for(10.0) == 0.0, "two running, one of them grown old"
    began.update({3: 9.75})
    assert dispatcher.held_for(10.0) == 0.5, "two fresh: held until the older of them grows old"
    began.clear()
    began.update({1: 0.0, 2: 1.0, 3: 9.5})
    assert dispatcher.held_for(10.0) == 0.0, "one of the three is fresh"
    began.clear()
    began.update({1: 9.0, 2: 9.5, 3: 9.75})
    assert dispatcher.held_for(10.0) == 0.5, "one that began a whole window ago is old"


def test_a_request_held_in_a_full_pool_starts_no_thread_past_its_size() -> None:
    dispatcher = LifoTaskDispatcher(fresh_limit=2, fresh_secs=30)
    dispatcher.set_thread_count(2)
    release = threading.Event()
    ran: list[int] = []
    try:
        _wait_for(lambda: dispatcher.active_count == 0, "the first threads never parked")
        for n in (1, 2):
            dispatcher.add_task(_Task(release, ran))
            _wait_for(lambda n=n: len(ran) == n, "a task did not run")
        dispatcher.add_task(_Task(release, ran))   # both busy, both fresh: it waits
        assert len(dispatcher.threads) == 2 and len(dispatcher.queue) == 1 and len(ran) == 2
        release.set()
        _wait_for(lambda: len(ran) == 3, "the held request never ran once a thread was free")
    finally:
        release.set()
        dispatcher.shutdown(timeout=5)


def test_requests_held_back_start_no_thread_while_an_idle_one_keeps_the_time() -> None:
    # (A window under a second, as the default's: long enough to look at the held queue.)
    window = 0.9
    for _attempt in range(3):   # a machine that stalls past the window spoils an attempt, not the test
        dispatcher = LifoTaskDispatcher(fresh_limit=2, fresh_secs=window)
        dispatcher.set_thread_count(8)
        release = threading.Event()
        ran: list[int] = []
        try:
            _wait_for(lambda: dispatcher.active_count == 0, "the first threads never parked")
            for n in (1, 2):
                dispatcher.add_task(_Task(release, ran))
                _wait_for(lambda n=n: len(ran) == n, "a task did not run")
            second = max(dispatcher.began.values())
            dispatcher.add_task(_Task(release, ran))
            _wait_for(lambda: dispatcher.keeper is not None, "no idle thread keeps the time")
            for _ in range(3):
                dispatcher.add_task(_Task(release, ran))
            threads, queued, started = len(dispatcher.threads), len(dispatcher.queue), len(ran)
            if time.monotonic() - second >= window:
                continue
            assert (threads, queued, started) == (4, 4, 2), "BUG: held requests started threads of their own"
            _wait_for(lambda: len(ran) == 6, "the held requests never ran")
            return
        finally:
            release.set()
            dispatcher.shutdown(timeout=5)
    raise AssertionError("the machine stalled past the window three times")


def test_a_failing_request_is_logged_and_its_thread_serves_the_next(caplog) -> None:
    class Failing(_Task):
        def service(self) -> None:
            self.ran.append(threading.get_ident())
            raise ValueError("broken handler")

        def __repr__(self) -> str:
            return "<failing task>"

    dispatcher = LifoTaskDispatcher()
    dispatcher.set_thread_count(1)
    release = threading.Event()
    ran: list[int] = []
    try:
        with caplog.at_level("ERROR", logger="waitress"):
            dispatcher.add_task(Failing(release, ran))
            _wait_for(lambda: len(ran) == 1, "the failing task did not run")
            release.set()
            dispatcher.add_task(_Task(release, ran))
            _wait_for(lambda: len(ran) == 2, "the thread was lost with the failing task")
        records = [r for r in caplog.records if r.name == "waitress"]
        assert [r.getMessage() for r in records] == ["Exception when servicing <failing task>"]
        assert records[0].exc_info[0] is ValueError and ran[0] == ran[1] and len(dispatcher.threads) == 1
    finally:
        release.set()
        dispatcher.shutdown(timeout=5)
