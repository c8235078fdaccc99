"""When to try again: exponential backoff with jitter, and the wait a `Retry-After` header
asks for. Shared by model calls, embeddings, workflow step retries and channel
connections and sends; only the standard library, so any layer may use it."""

from __future__ import annotations

import datetime
import email.utils
import math
import random
import threading
import time

# Each delay is spread over ±20 %: clients that failed together do not retry together.
JITTER = 0.2
# A Retry-After further out than this is read as this (a date years ahead is a broken
# clock or a broken server, not a plan).
RETRY_AFTER_LIMIT = 86400.0


def backoff_delay(attempt: int, initial: float, maximum: float, factor: float = 2.0,
                  jitter: float = JITTER) -> float:
    """Seconds before retry number `attempt` (0 for the first): `initial * factor**attempt`,
    at most `maximum`, then spread by ±`jitter` (a fraction)."""
    try:
        base = min(maximum, initial * factor ** attempt)
    except OverflowError:  # a very long outage: the exponent left float range
        base = maximum
    return max(0.0, base * (1 + random.uniform(-jitter, jitter)))


class Backoff:
    """Successive backoff delays (`next_delay`), restarted by `reset` after a success."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0, factor: float = 2.0,
                 jitter: float = JITTER) -> None:
        self.initial, self.maximum, self.factor, self.jitter = initial, maximum, factor, jitter
        self.attempt = 0

    def next_delay(self) -> float:
        delay = backoff_delay(self.attempt, self.initial, self.maximum, self.factor, self.jitter)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0

    def wait(self, stop: threading.Event) -> bool:
        """Sleep the next delay; True when `stop` was set meanwhile."""
        return stop.wait(self.next_delay())


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a `Retry-After` value asks for: delta-seconds (`120`, leniently `1.5`) or an
    HTTP date (`Wed, 21 Oct 2015 07:28:00 GMT`; one in the past is 0). None when absent or
    not one of the two forms (negative, not finite, garbage): the caller's own backoff
    applies then. At most RETRY_AFTER_LIMIT."""
    if not value or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT; "-0000" parses as naive
            when = when.replace(tzinfo=datetime.timezone.utc)
        seconds = max(0.0, when.timestamp() - (time.time() if now is None else now))
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, RETRY_AFTER_LIMIT)
