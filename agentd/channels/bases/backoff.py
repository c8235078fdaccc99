"""Exponential backoff with jitter, interruptible by a stop event."""

from __future__ import annotations

import random
import threading
from typing import Any


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


class Reconnects:
    """The failure state of an adapter's connection loop. The first failure of a run is
    audited (`connection_error`) and logged with `warning` (a %s format), the first
    success after it is audited (`reconnected`) and resets the backoff; the retries in
    between are quiet, so a platform down for an hour costs two audit rows, not hundreds."""

    def __init__(self, ctx: Any, backoff: Backoff, warning: str) -> None:
        self.ctx, self.backoff, self.warning = ctx, backoff, warning
        self.failing = False

    def up(self) -> None:
        """The connection (or a poll) works again."""
        if self.failing:
            self.ctx.audit("reconnected")
        self.failing = False
        self.backoff.reset()

    def down(self, error: Any) -> None:
        """The connection failed with `error`; the caller backs off before the next try."""
        if not self.failing:
            self.ctx.audit("connection_error", error=str(error)[:300])
            self.ctx.log.warning(self.warning, error)
        self.failing = True
