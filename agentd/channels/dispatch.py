"""Per-conversation ordered queues on a bounded worker pool.

One conversation's messages are handled strictly in order; different conversations
run in parallel up to the pool size. `submit()` never blocks: a full queue drops the
message with a logged warning (the adapter's reader must keep reading).
"""

from __future__ import annotations

import collections
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

log = logging.getLogger("agentd.channels.dispatch")


class Dispatcher:
    """`submit(key, job)` runs `job()` after every earlier job with the same key."""

    def __init__(self, workers: int = 8, queue_limit: int = 32) -> None:
        self.queue_limit = queue_limit
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="channel-worker")
        self._queues: dict[str, collections.deque[Callable[[], None]]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, key: str, job: Callable[[], None]) -> bool:
        """Queue `job` behind `key`'s earlier jobs; False (and a warning) when full or closed."""
        with self._lock:
            if self._closed:
                return False
            queue = self._queues.get(key)
            if queue is not None and len(queue) >= self.queue_limit:
                log.warning("conversation %s: queue full (%d), message dropped", key, self.queue_limit)
                return False
            if queue is None:
                # No drainer for this key yet: this job starts one.
                self._queues[key] = collections.deque([job])
                self._pool.submit(self._drain, key)
            else:
                queue.append(job)
            return True

    def _drain(self, key: str) -> None:
        while True:
            with self._lock:
                queue = self._queues.get(key)
                if not queue:
                    self._queues.pop(key, None)
                    return
                job = queue[0]
            try:
                job()
            except Exception:  # noqa: BLE001 - one bad message must not stop the conversation
                log.exception("conversation %s: job failed", key)
            with self._lock:
                queue.popleft()

    def pending(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._queues.values())

    def close(self) -> None:
        """Drop queued work; running jobs finish on their own."""
        with self._lock:
            self._closed = True
            self._queues.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
