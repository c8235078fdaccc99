"""Starting again an adapter whose platform could not be reached when it started.

A daemon that boots before its network is up, or while a platform is down for a moment,
would otherwise keep such a channel stopped until its configuration was saved again. Only
`Unreachable` failures are tried again; a refusal (a bad token, a service that is gone)
stays a failed start for a person to fix.
"""

from __future__ import annotations

import threading
from typing import Callable

FIRST_WAIT = 5.0
LONGEST_WAIT = 300.0


class StartRetries:
    """One pending start per channel, each wait twice the last (5 s up to 5 min)."""

    def __init__(self, start: Callable[[str], None]) -> None:
        self._start = start
        self._timers: dict[str, threading.Timer] = {}
        self._waits: dict[str, float] = {}
        self._lock = threading.Lock()
        self.closed = False

    def later(self, name: str) -> float:
        """Start `name` again after its next wait; returns that wait in seconds."""
        with self._lock:
            wait = self._waits.get(name, FIRST_WAIT)
            self._waits[name] = min(wait * 2, LONGEST_WAIT)
            old = self._timers.pop(name, None)
            timer = threading.Timer(wait, lambda: self._fire(name, timer))
            timer.daemon = True
            timer.name = f"channel-{name}-start"
            self._timers[name] = timer
            timer.start()
        if old is not None:
            old.cancel()
        return wait

    def _fire(self, name: str, timer: threading.Timer) -> None:
        with self._lock:
            if self._timers.get(name) is not timer:
                return  # forgotten or replaced meanwhile
            del self._timers[name]
        self._start(name)

    def pending(self, name: str) -> bool:
        """Whether `name` is waiting to be started again."""
        return name in self._timers

    def forget(self, name: str) -> None:
        """No pending start for `name`, and its next wait is the first again."""
        with self._lock:
            timer = self._timers.pop(name, None)
            self._waits.pop(name, None)
        if timer is not None:
            timer.cancel()

    def close(self) -> None:
        """No more starts: a timer already firing finds `closed` set."""
        self.closed = True
        for name in list(self._timers):
            self.forget(name)
