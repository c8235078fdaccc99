"""The cap on requests that hold a server thread: streams, WebSockets and plain messages
waiting for their run (`[api] max_streams`).

Every such request holds one of waitress's threads for as long as its run lasts, so the
cap keeps threads free for everything else. A quarter of it is kept back for requests
that will run at once (their agent is idle): when many agents hang, the requests queued
behind them fill only the rest, and a message to a healthy agent still gets a slot."""

from __future__ import annotations

import threading


class Slots:
    """A counting cap like `threading.BoundedSemaphore`, with a share only non-waiting requests take."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.reserve = total // 4
        self._used = 0
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = False, *, waiting: bool = False) -> bool:
        """Take a slot if one is free (never blocks); a `waiting` request (its agent is busy)
        may not take the reserved share."""
        del blocking  # the signature of Semaphore.acquire; a slot is never waited for
        with self._lock:
            if self._used >= (self.total - self.reserve if waiting else self.total):
                return False
            self._used += 1
            return True

    def release(self) -> None:
        with self._lock:
            if self._used <= 0:
                raise ValueError("Slots released too many times")
            self._used -= 1

    @property
    def in_use(self) -> int:
        return self._used
