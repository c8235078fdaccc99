"""Waitress's task dispatcher, handing each request to the thread that went idle last.

Waitress wakes its idle threads in FIFO order (`threading.Condition.notify` takes the
longest waiter), so under any load every one of the `[api] threads` (128 by default)
serves requests in turn. Each thread that touches the database keeps its own SQLite
connection (Pony holds one per thread) with its page and statement caches, and its own
malloc arena: with 128 threads taking turns, RSS grew by ~10 MB per 10,000 messages long
after the sessions stopped growing, until every thread's caches were full. Waking the
most recently idle thread instead keeps the work on as few threads as the concurrency
needs (and their caches warm); the others stay parked for bursts and streams.
"""

from __future__ import annotations

import threading

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


class LifoTaskDispatcher(ThreadedTaskDispatcher):
    """`ThreadedTaskDispatcher` waking its most recently idle thread for each task."""

    def __init__(self) -> None:
        super().__init__()
        self.queue_cv = LifoCondition(self.lock)
