"""Writes a thread holds back until it is about to wait, so that what it produces back to
back leaves in one write.

A streamed run written in place (agentd/api/streaming.py) sent every event as it came, each
in a chunk and a socket write of its own (35-39 µs of CPU timed around each write in the
daemon; on loopback a send also does the receiver's TCP work). The deltas parsed from one
read of the provider's stream, or a phase change just before the model call, come
microseconds apart; they are now held and written together when the thread next waits for
something: before it sends a model request and before it blocks reading the provider's
answer (the drivers call `before_wait`), or when the run's next event may not wait. So an
event is never held while its thread waits, and the stream's keeper writes anything a
thread has held for a poll interval (it never waited after holding it).

Only the thread that held a write runs it here; `hold` and `before_wait` touch nothing
shared.
"""

from __future__ import annotations

import threading
from typing import Callable

_local = threading.local()


def hold(flush: Callable[[], None]) -> None:
    """Have `flush` run when this thread is next about to wait (`before_wait`); once, however
    often it is held meanwhile."""
    held = _local.__dict__.setdefault("held", [])
    if flush not in held:  # (a bound method equals another of the same object and function)
        held.append(flush)


def before_wait() -> None:
    """This thread is about to wait (on the network): run the flushes it holds, in order."""
    held = _local.__dict__.get("held")
    if held:
        _local.held = []
        for flush in held:
            flush()
