"""Typed events a run emits; every transport is a sink of the same stream.

Event types and their data:
  text_delta  {content}
  tool_use    {id, tool}                      the model started a tool call
  tool_input  {id, tool, input}               the call's arguments are complete
  tool_result {id, tool, input, result, is_error}
  phase       {phase, detail}                 streaming, thinking, tool_use, awaiting_approval, done, cancelled
  done        {response, input_tokens, output_tokens, iterations, cost_usd, finish_reason, tool_calls}
  error       {message, status}
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

log = logging.getLogger("agentd.events")


@dataclass(frozen=True)
class Event:
    type: str
    data: dict[str, Any] = field(default_factory=dict)


Sink = Callable[[Event], None]


class Fanout:
    """Delivers each event to every sink; a failing sink is dropped, the run goes on."""

    def __init__(self, sinks: list[Sink] | None = None) -> None:
        self._sinks: list[Sink] = list(sinks or [])
        self._lock = threading.Lock()

    def add(self, sink: Sink) -> None:
        with self._lock:
            self._sinks.append(sink)

    def remove(self, sink: Sink) -> None:
        with self._lock:
            if sink in self._sinks:
                self._sinks.remove(sink)

    def __call__(self, event: Event) -> None:
        with self._lock:
            sinks = list(self._sinks)
        for sink in sinks:
            try:
                sink(event)
            except Exception:  # noqa: BLE001 - one broken client must not end the run
                log.warning("event sink failed; dropping it", exc_info=True)
                self.remove(sink)


class QueueSink:
    """A sink a transport reads from: events in order, then end of stream.

    `close()` marks the consumer gone, after which events are discarded instead of
    piling up (a client that disconnected stops its delivery, not the run).
    """

    _END = object()

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self.closed = False

    def __call__(self, event: Event) -> None:
        if not self.closed:
            self._queue.put(event)

    def finish(self) -> None:
        """No more events will come."""
        self._queue.put(self._END)

    def close(self) -> None:
        self.closed = True

    def pending(self) -> bool:
        """Whether an event (or the end) is already waiting to be read."""
        return not self._queue.empty()

    def events(self, heartbeat: float) -> Iterator[Event | None]:
        """Yield events; None every `heartbeat` seconds of silence (time to send a keep-alive)."""
        while True:
            try:
                item = self._queue.get(timeout=heartbeat)
            except queue.Empty:
                yield None
                continue
            if item is self._END:
                return
            yield item
