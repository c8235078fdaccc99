"""Hand freed heap memory back to the system after embedding work.

A model run allocates and frees several megabytes of scratch tensors, on whichever thread
ran it (the memory worker, request threads recalling). glibc keeps freed blocks in each
thread's arena for reuse, so without this RSS keeps the high-water mark of every arena and
creeps up with traffic. `malloc_trim` returns the free pages of all arenas; at most once a
second, it costs well under a millisecond. A call that comes too soon after the previous one
is made up a second later, so the last batch of a burst is handed back too and an idle
daemon does not keep a burst's high-water mark.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

EVERY_SECS = 1.0


def _loader() -> Callable[[int], int] | None:
    import ctypes

    try:
        # The running process's own symbols: no library search (find_library runs programs).
        return ctypes.CDLL(None).malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


class Trimmer:
    """Calls malloc_trim(0) when asked, at most every `EVERY_SECS`, and once more `EVERY_SECS`
    after a call that came too soon (a no-op off glibc)."""

    def __init__(self, every: float = EVERY_SECS) -> None:
        self.every = every
        self._trim: Callable[[int], int] | None = None  # found on first use
        self._found = False
        self._last = 0.0
        self._later: threading.Timer | None = None
        self._lock = threading.Lock()

    def __call__(self) -> None:
        if not self._found:
            self._trim, self._found = self._trim or _loader(), True
        if self._trim is None:
            return
        now = time.monotonic()
        with self._lock:
            wait = self._last + self.every - now
            if wait > 0:
                if self._later is None:
                    self._later = threading.Timer(wait, self._deferred)
                    self._later.daemon = True
                    self._later.start()
                return
            self._last = now
        self._trim(0)

    def _deferred(self) -> None:
        with self._lock:
            self._later = None
            self._last = time.monotonic()
        if self._trim is not None:
            self._trim(0)
