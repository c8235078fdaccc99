"""Waitress's task dispatcher, handing each request to the thread that went idle last.

Waitress wakes its idle threads in FIFO order (`threading.Condition.notify` takes the
longest waiter), so under any load every one of the `[api] threads` (128 by default)
serves requests in turn. Each thread that touches the database keeps its own SQLite
connection (Pony holds one per thread) with its page and statement caches, and its own
malloc arena: with 128 threads taking turns, RSS grew by ~10 MB per 10,000 messages long
after the sessions stopped growing, until every thread's caches were full. Waking the
most recently idle thread instead keeps the work on as few threads as the concurrency
needs (and their caches warm); the others stay parked for bursts and streams.

The threads themselves start as they are needed, up to `[api] threads`: a parked thread
still holds a stack and Python's per-thread state (about 14 KB each, 1.8 MB of an idle
daemon's 49 MB for the default 128), and most daemons never run more than a handful of
requests at once. A task that finds no idle thread starts one; threads are not stopped
again (a burst that needed them is likely to come back).

And only a few requests start together: while `FRESH_LIMIT` requests have begun within the
last `FRESH_SECS`, the next waits in the queue until one of them ends or grows old. Every
thread with work wants the GIL, and each call that lets it go (a socket read or write, a
lock) hands it to another thread, a pair of context switches; with a thread per
connection, many connections at once cost the daemon several times the switches (and CPU)
per request that a handful do. A request that has run that long waits on something (a
model, a stream, a client) rather than the GIL, and no longer counts: a slow model still
gets every thread it needs, each after at most `FRESH_SECS`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from waitress.task import ThreadedTaskDispatcher


class LifoCondition(threading.Condition):
    """A condition whose `notify` wakes the threads that started waiting last."""

    def notify(self, n: int = 1) -> None:
        if not self._is_owned():  # type: ignore[attr-defined]
            raise RuntimeError("cannot notify on un-acquired lock")
        waiters = self._waiters  # type: ignore[attr-defined]
        while waiters and n > 0:
            waiter = waiters.pop()
            try:
                waiter.release()
            except RuntimeError:  # already released (see CPython's notify, gh-92530)
                continue
            n -= 1


#: Threads started with the pool (the rest start on demand): enough for a few requests at
#: once without a thread start on the way.
INITIAL_THREADS = 4

#: How many requests begun within the last `FRESH_SECS` may run at once (see the module doc).
FRESH_LIMIT = 8
FRESH_SECS = 0.025


class LifoTaskDispatcher(ThreadedTaskDispatcher):
    """`ThreadedTaskDispatcher` waking its most recently idle thread for each task, and
    starting its threads as the tasks need them."""

    def __init__(self, fresh_limit: int = FRESH_LIMIT, fresh_secs: float = FRESH_SECS) -> None:
        super().__init__()
        self.queue_cv = LifoCondition(self.lock)
        self.limit = 0  # the pool's size: threads started so far are `len(self.threads)`
        self.fresh_limit = fresh_limit
        self.fresh_secs = fresh_secs
        # When the request of each busy thread began, oldest first (insertion order).
        self.began: dict[int, float] = {}
        # The idle thread waiting for the oldest fresh request to grow old, while tasks are
        # held back (None: no one).
        self.keeper: int | None = None

    def set_thread_count(self, count: int) -> None:
        """Size the pool at `count` threads; start the first few (0 stops them all)."""
        with self.lock:
            self.limit = count
        super().set_thread_count(min(count, max(INITIAL_THREADS, len(self.threads) - self.stop_count)))

    def held_for(self, now: float) -> float:
        """Seconds until a queued task may start (0: at once); under the lock."""
        began = self.began
        if len(began) < self.fresh_limit:
            return 0.0
        old = now - self.fresh_secs
        fresh = len(began)
        for start in began.values():
            if start > old:
                # The oldest fresh one: the first to grow old, if it does not end first.
                return start - old if fresh >= self.fresh_limit else 0.0
            fresh -= 1
        return 0.0

    def add_task(self, task: Any) -> None:
        # waitress's add_task, starting a thread where it would warn of a queue: the warning
        # ("Task queue depth is N") stays for a pool that has started all its threads.
        with self.lock:
            self.queue.append(task)
            if self.held_for(time.monotonic()) > 0:
                self._keep_time()
            else:
                self._wake()

    def _wake(self) -> None:
        """A thread for the first queued task: an idle one, else a new one while the pool
        has room; under the lock."""
        self.queue_cv.notify()
        running = len(self.threads) - self.stop_count
        waiting = len(self.queue) - (running - self.active_count)
        if waiting > 0:
            if running < self.limit:
                self._start_one()
            else:
                self.queue_logger.warning("Task queue depth is %d", waiting)

    def _keep_time(self) -> None:
        """Tasks are held back: make sure an idle thread will take one when the oldest fresh
        request grows old (a busy thread takes one when its request ends)."""
        if self.keeper is not None:
            return
        running = len(self.threads) - self.stop_count
        if running > self.active_count:
            self.queue_cv.notify()  # an idle thread: it finds the task held and keeps the time
        elif running < self.limit:
            self._start_one()

    def handler_thread(self, thread_no: int) -> None:
        # waitress's handler_thread, noting when each task began and leaving queued tasks
        # while enough others have only just begun.
        began = self.began
        while True:
            with self.lock:
                began.pop(thread_no, None)
                while True:
                    if self.stop_count > 0:
                        self.active_count -= 1
                        self.stop_count -= 1
                        self.threads.discard(thread_no)
                        self.thread_exit_cv.notify()
                        return
                    timeout = None
                    if self.queue:
                        now = time.monotonic()
                        held = self.held_for(now)
                        if held <= 0:
                            break
                        if self.keeper in (None, thread_no):
                            self.keeper, timeout = thread_no, held
                    self.active_count -= 1
                    self.queue_cv.wait(timeout)
                    self.active_count += 1
                    if self.keeper == thread_no:
                        self.keeper = None
                task = self.queue.popleft()
                began[thread_no] = now
                if self.queue:
                    # More are queued (held back until now): a thread for the next one, or
                    # one to keep the time.
                    if self.held_for(now) > 0:
                        self._keep_time()
                    else:
                        self._wake()
            try:
                task.service()
            except BaseException:
                self.logger.exception("Exception when servicing %r", task)

    def _start_one(self) -> None:
        # As waitress's set_thread_count starts one (under the lock; the thread counts as
        # active until it first waits).
        number = 0
        while number in self.threads:
            number += 1
        self.threads.add(number)
        self.active_count += 1
        self.start_new_thread(self.handler_thread, number)
