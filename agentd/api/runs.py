"""Starting a run whose events a transport consumes (SSE, OpenAI stream, WebSocket).

Every live transport follows the same steps: refuse early (quota, budget,
stream cap) while a plain JSON error can still be sent, start the run on the
kernel's executor with a queue as its sink, and always finish the queue and
free the stream slot, whatever happens.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Iterator

from agentd.agents.events import Event, QueueSink
from agentd.agents.loop import RunCancelled
from agentd.agents.manager import AgentHandle, RunOptions
from agentd.errors import AgentdError
from agentd.kernel import Kernel

HEARTBEAT_SECS = 15.0


class TooManyStreams(AgentdError):
    status = 503


@dataclass
class LiveRun:
    """A run in flight and the queue its events arrive on."""

    handle: AgentHandle
    sink: QueueSink
    future: Future
    cancel: threading.Event
    heartbeat: float = HEARTBEAT_SECS  # `[api] sse_keepalive_secs`

    def events(self, heartbeat: float | None = None) -> Iterator[Event | None]:
        """Events in order, None when it is time for a keep-alive, then a final
        `done`, `stopped` or `error` event."""
        yield from self.sink.events(heartbeat or self.heartbeat)

    def close(self) -> None:
        """The consumer left: stop delivering (the run itself goes on)."""
        self.sink.close()


def acquire_stream_slot(kernel: Kernel) -> None:
    """Long-lived connections are capped so plain HTTP always has threads."""
    if not kernel.stream_slots.acquire(blocking=False):
        raise TooManyStreams("too many concurrent streams; try again shortly", retry_after=1)


def start_live_run(kernel: Kernel, handle: AgentHandle, text: str, attachments: list,
                   options: RunOptions | None = None) -> LiveRun:
    """Precheck, then start the run; the caller must call `release` when done."""
    kernel.agents.precheck(handle)
    sink = QueueSink()
    cancel = threading.Event()
    # The stop endpoint cancels the run; the transport must end at once even if
    # the provider has not answered yet, so it watches the same event.
    watcher_done = threading.Event()

    def watch_cancel() -> None:
        while not watcher_done.is_set():
            if cancel.wait(0.1):
                sink(Event("stopped", {"message": "run stopped"}))
                sink.finish()
                return

    future = kernel.agents.submit(handle, text, attachments, emit=sink, options=options, cancel=cancel)

    def finished(f: Future) -> None:
        watcher_done.set()
        exc = f.exception()
        if exc is None:
            result = f.result()
            sink(Event("done", {"response": result.response, "input_tokens": result.usage.input_tokens,
                                "output_tokens": result.usage.output_tokens,
                                "iterations": result.iterations, "cost_usd": result.cost_usd,
                                "finish_reason": result.finish_reason, "tool_calls": result.tool_calls}))
        elif isinstance(exc, RunCancelled):
            sink(Event("stopped", {"message": "run stopped"}))
        else:
            message = exc.message if isinstance(exc, AgentdError) else f"internal error: {exc}"
            sink(Event("error", {"message": message, "status": getattr(exc, "status", 500)}))
        sink.finish()

    threading.Thread(target=watch_cancel, daemon=True, name="agentd-cancel-watch").start()
    future.add_done_callback(finished)
    return LiveRun(handle, sink, future, cancel, kernel.config.api.sse_keepalive_secs)
