"""Starting a run whose events a transport consumes (SSE, OpenAI stream, WebSocket).

Every live transport follows the same steps: refuse early (quota, budget,
stream cap, a busy agent's full queue) while a plain JSON error can still be
sent, start the run (`Runs.start`) on the kernel's executor with a queue as its
sink, and always finish the queue and free the stream slot, whatever happens. A
client that goes away stops its run (or withdraws it, if it was still queued).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Iterator

from flask import request

from agentd.agents.events import Event, QueueSink
from agentd.agents.loop import RunCancelled, RunResult
from agentd.agents.manager import AgentHandle, RunOptions
from agentd.agents.runs import CALLER, WORKER, RunRequest, RunTicket
from agentd.errors import AgentdError
from agentd.kernel import Kernel

HEARTBEAT_SECS = 15.0


class TooManyStreams(AgentdError):
    status = 503


POLL_SECS = 0.1  # how often a live transport checks for stop and client disconnects


def client_disconnected() -> Callable[[], bool] | None:
    """waitress's check for the current request's client having gone away (None elsewhere)."""
    return request.environ.get("waitress.client_disconnected")


@dataclass
class LiveRun:
    """A run in flight and the queue its events arrive on."""

    sink: QueueSink
    ticket: RunTicket
    disconnected: Callable[[], bool] | None = None
    heartbeat_secs: float = HEARTBEAT_SECS  # `[api] sse_keepalive_secs`

    @property
    def future(self) -> Future:
        return self.ticket.future

    @property
    def cancel(self) -> threading.Event:
        return self.ticket.request.cancel

    def events(self, heartbeat: float | None = None) -> Iterator[Event | None]:
        """Events in order, None when it is time for a keep-alive, then a final
        `done`, `stopped` or `error` event. Ends early, stopping the run, when the client
        disconnects."""
        heartbeat = heartbeat or self.heartbeat_secs
        quiet_since = time.monotonic()
        for event in self.sink.events(POLL_SECS):
            if self.disconnected is not None and self.disconnected():
                self.stop_run()
                return
            if event is not None:
                quiet_since = time.monotonic()
                yield event
                continue
            if self.cancel.is_set() and not self.future.done():
                # POST /stop: end the stream now; the run itself ends within moments.
                yield Event("stopped", {"message": "run stopped"})
                return
            if time.monotonic() - quiet_since >= heartbeat:
                quiet_since = time.monotonic()
                yield None

    def stop_run(self) -> None:
        """Withdraw the run if it is still queued, else cancel it."""
        self.ticket.stop()

    def close(self) -> None:
        """The consumer left: stop delivering and stop the run (a stream nobody reads is not
        worth a provider call)."""
        self.sink.close()
        self.stop_run()


def acquire_stream_slot(kernel: Kernel, message: str = "too many concurrent streams; try again shortly",
                        handle: AgentHandle | None = None) -> None:
    """Long-lived connections are capped so plain HTTP always has threads; one that would
    wait behind its agent's current run cannot take the share kept for runs that start now."""
    if not kernel.stream_slots.acquire(blocking=False, waiting=handle is not None and handle.busy):
        raise TooManyStreams(message, retry_after=1)


def run_blocking(kernel: Kernel, handle: AgentHandle, text: str, attachments: list,
                 options: RunOptions | None = None) -> RunResult:
    """Run a message for a plain (non-streaming) request and wait for its result.

    The wait holds a server thread, so it takes one of the capped long-lived slots; a
    client that disconnects meanwhile withdraws its queued run or stops its running one.
    """
    waiting = handle.busy  # (before the run takes its place)
    ticket = kernel.runs.start(RunRequest(handle, text, attachments, options, on=CALLER))
    try:
        acquire_stream_slot(kernel, "server busy: too many requests are waiting for agents; try again shortly",
                            handle if waiting else None)
    except BaseException:
        ticket.abandon()
        raise
    try:
        return ticket.result(client_disconnected())
    finally:
        kernel.stream_slots.release()


def start_live_run(kernel: Kernel, handle: AgentHandle, text: str, attachments: list,
                   options: RunOptions | None = None) -> LiveRun:
    """Start the run on a worker (refusals are raised here); the caller must call `close`
    when done."""
    sink = QueueSink()
    ticket = kernel.runs.start(RunRequest(handle, text, attachments, options, emit=sink, on=WORKER))

    def finished(f: Future) -> None:
        exc = f.exception()
        sink(result_event(f.result()) if exc is None else failure_event(exc))
        sink.finish()

    ticket.future.add_done_callback(finished)
    return LiveRun(sink, ticket, client_disconnected(), kernel.config.api.sse_keepalive_secs)


def result_event(result: RunResult) -> Event:
    """The `done` event that ends a stream whose run finished."""
    return Event("done", {"response": result.response, "input_tokens": result.usage.input_tokens,
                          "output_tokens": result.usage.output_tokens,
                          "iterations": result.iterations, "cost_usd": result.cost_usd,
                          "finish_reason": result.finish_reason, "tool_calls": result.tool_calls})


def failure_event(exc: BaseException) -> Event:
    """The `stopped` or `error` event that ends a stream whose run did not finish."""
    if isinstance(exc, RunCancelled):
        return Event("stopped", {"message": "run stopped"})
    message = exc.message if isinstance(exc, AgentdError) else f"internal error: {exc}"
    return Event("error", {"message": message, "status": getattr(exc, "status", 500),
                           "retry_after": getattr(exc, "retry_after", None),
                           "code": getattr(exc, "code", None),
                           "retryable": bool(getattr(exc, "retryable", False)),
                           "kind": getattr(exc, "kind", None)})
