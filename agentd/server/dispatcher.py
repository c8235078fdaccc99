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
"""

from __future__ import annotations

import threading
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


class LifoTaskDispatcher(ThreadedTaskDispatcher):
    """`ThreadedTaskDispatcher` waking its most recently idle thread for each task, and
    starting its threads as the tasks need them."""

    def __init__(self) -> None:
        super().__init__()
        self.queue_cv = LifoCondition(self.lock)
        self.limit = 0  # the pool's size: threads started so far are `len(self.threads)`

    def set_thread_count(self, count: int) -> None:
        """Size the pool at `count` threads; start the first few (0 stops them all)."""
        with self.lock:
            self.limit = count
        super().set_thread_count(min(count, max(INITIAL_THREADS, len(self.threads) - self.stop_count)))

    def add_task(self, task: Any) -> None:
        # waitress's add_task, starting a thread where it would warn of a queue: the warning
        # ("Task queue depth is N") stays for a pool that has started all its threads.
        with self.lock:
            self.queue.append(task)
            self.queue_cv.notify()
            running = len(self.threads) - self.stop_count
            waiting = len(self.queue) - (running - self.active_count)
            if waiting > 0:
                if running < self.limit:
                    self._start_one()
                else:
                    self.queue_logger.warning("Task queue depth is %d", waiting)

    def _start_one(self) -> None:
        # As waitress's set_thread_count starts one (under the lock; the thread counts as
        # active until it first waits).
        number = 0
        while number in self.threads:
            number += 1
        self.threads.add(number)
        self.active_count += 1
        self.start_new_thread(self.handler_thread, number)
