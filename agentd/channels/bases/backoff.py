"""Exponential backoff with jitter, interruptible by a stop event."""

from __future__ import annotations

import random
import threading


class Backoff:
    """Delays initial, initial*factor, ... up to maximum, each +-jitter (a fraction)."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0, factor: float = 2.0,
                 jitter: float = 0.2) -> None:
        self.initial, self.maximum, self.factor, self.jitter = initial, maximum, factor, jitter
        self.attempt = 0

    def next_delay(self) -> float:
        base = min(self.maximum, self.initial * self.factor ** self.attempt)
        self.attempt += 1
        return max(0.0, base * (1 + random.uniform(-self.jitter, self.jitter)))

    def reset(self) -> None:
        self.attempt = 0

    def wait(self, stop: threading.Event) -> bool:
        """Sleep the next delay; True when `stop` was set meanwhile."""
        return stop.wait(self.next_delay())
