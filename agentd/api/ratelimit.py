"""GCRA (generic cell rate algorithm) rate limiter keyed by client IP.

GCRA keeps one number per client, the theoretical arrival time (TAT), which
makes it exact for bursts and cheap enough to run on every request.
"""

from __future__ import annotations

import math
import threading
import time
from typing import NamedTuple


_SLACK = 1e-6         # seconds
_SLACK_CELLS = 1e-6   # fraction of one request


class Decision(NamedTuple):
    """Outcome of one request: allowed or not, plus the headers' values (a tuple: made
    on every request, for a quarter of a frozen dataclass's cost)."""

    allowed: bool
    remaining: int
    reset_after: float     # seconds until the bucket is full again
    retry_after: float     # seconds until one request would be allowed (0 if allowed)


class GcraLimiter:
    """`rate` requests per second with up to `burst` at once, per key."""

    # Forget idle clients so the table cannot grow without bound.
    _SWEEP_EVERY = 4096

    def __init__(self, rate: float, burst: int, clock=time.monotonic) -> None:
        self.interval = 1.0 / rate
        self.burst = burst
        self.tolerance = self.interval * burst
        self._clock = clock
        self._tat: dict[str, float] = {}
        self._lock = threading.Lock()
        self._calls = 0

    def hit(self, key: str) -> Decision:
        """Account one request for `key` and say whether it may proceed."""
        now = self._clock()
        with self._lock:
            self._calls += 1
            if self._calls % self._SWEEP_EVERY == 0:
                self._sweep(now)
            tat = max(self._tat.get(key, now), now)
            new_tat = tat + self.interval
            allow_at = new_tat - self.tolerance
            # A microsecond of slack: TAT accumulates `interval` by float addition, and
            # without it the last request of a full burst can be refused (rate 10, burst 5).
            if now < allow_at - _SLACK:
                remaining = 0
                return Decision(False, remaining, tat - now, allow_at - now)
            self._tat[key] = new_tat
            remaining = int(math.floor((now - (new_tat - self.tolerance)) / self.interval + _SLACK_CELLS))
            return Decision(True, max(0, remaining), new_tat - now, 0.0)

    def _sweep(self, now: float) -> None:
        for key in [k for k, tat in self._tat.items() if tat <= now]:
            del self._tat[key]
