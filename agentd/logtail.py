"""The last lines of the daemon's log, kept in memory for the dashboard's log page.

A logging handler on the root logger: it formats each record as the daemon's log does
and keeps the newest `size` lines, numbered, so a reader can wait for the lines after the
last one it has.
"""

from __future__ import annotations

import collections
import logging
import threading

from agentd.logs import TEXT_FORMAT

KEEP = 1000


class LogTail(logging.Handler):
    """Numbered recent log lines; `since(n)` waits for lines after number `n`."""

    def __init__(self, size: int = KEEP) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(TEXT_FORMAT))
        self._lines: collections.deque[tuple[int, str]] = collections.deque(maxlen=size)
        self._count = 0
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # noqa: BLE001 - a bad record must not break the code that logged it
            self.handleError(record)
            return
        with self._changed:
            for line in text.splitlines() or [""]:
                self._count += 1
                self._lines.append((self._count, line))
            self._changed.notify_all()

    def last(self, n: int) -> list[tuple[int, str]]:
        """The newest `n` lines, oldest first, as (number, text)."""
        with self._changed:
            return list(self._lines)[-n:] if n > 0 else []

    def since(self, number: int, timeout: float) -> list[tuple[int, str]]:
        """The lines after `number`, waiting up to `timeout` seconds for one."""
        with self._changed:
            self._changed.wait_for(lambda: self._count > number, timeout)
            return [item for item in self._lines if item[0] > number]
