"""Typed events a run emits; every transport is a sink of the same stream.

Event types and their data:
  text_delta  {content}
  tool_use    {id, tool, index}               the model started a tool call (index: its place
                                              among the run's tool calls, across turns)
  tool_args_delta {index, arguments}          a fragment of the call's JSON arguments
  tool_input  {id, tool, input, index}        the call's arguments are complete
  tool_result {id, tool, input, result, is_error}
  phase       {phase, detail}                 streaming, thinking, tool_use, awaiting_approval, done, cancelled
  done        {input_tokens, output_tokens, iterations, cost_usd, finish_reason, tool_calls}
  error       {message, status}
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

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
