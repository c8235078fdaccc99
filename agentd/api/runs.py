"""Running a message for a request, and the events that end a stream.

Every live transport refuses early (quota, budget, stream cap, a busy agent's full
queue) while a plain JSON error can still be sent, and always frees its stream slot,
whatever happens. A client that goes away stops its run (or withdraws it, if it was
still queued).
"""

from __future__ import annotations

from typing import Callable

from flask import current_app, request

from agentd.agents.events import Event
from agentd.agents.loop import RunCancelled, RunResult
from agentd.agents.manager import AgentHandle, RunOptions
from agentd.agents.run_request import CALLER, RunRequest
from agentd.errors import AgentdError
from agentd.kernel import Kernel
from agentd.server.slots import Slots


class TooManyStreams(AgentdError):
    status = 503


POLL_SECS = 0.1  # how often a live transport checks for stop and client disconnects


def client_disconnected() -> Callable[[], bool] | None:
    """waitress's check for the current request's client having gone away (None elsewhere)."""
    return request._get_current_object().environ.get("waitress.client_disconnected")


def stream_slots() -> Slots:
    """The app's cap on requests that hold a server thread (`[api] max_streams`)."""
    return current_app._get_current_object().extensions["agentd.stream_slots"]


def acquire_stream_slot(message: str = "too many concurrent streams; try again shortly",
                        handle: AgentHandle | None = None) -> None:
    """Long-lived connections are capped so plain HTTP always has threads; one that would
    wait behind its agent's current run cannot take the share kept for runs that start now."""
    if not stream_slots().acquire(waiting=handle is not None and handle.busy):
        raise TooManyStreams(message, retry_after=1)


def run_blocking(kernel: Kernel, handle: AgentHandle, text: str, attachments: list,
                 options: RunOptions | None = None, origin: str = "api",
                 run: dict[str, str] | None = None) -> RunResult:
    """Run a message for a plain (non-streaming) request and wait for its result.

    The wait holds a server thread, so it takes one of the capped long-lived slots; a
    client that disconnects meanwhile withdraws its queued run or stops its running one.
    """
    waiting = handle.busy  # (before the run takes its place)
    ticket = kernel.runs.start(RunRequest(handle, text, attachments, options, on=CALLER, origin=origin,
                                          **(run or {})))
    try:
        acquire_stream_slot("server busy: too many requests are waiting for agents; try again shortly",
                            handle if waiting else None)
    except BaseException:
        ticket.abandon()
        raise
    try:
        return ticket.result(client_disconnected())
    finally:
        stream_slots().release()


def result_event(result: RunResult) -> Event:
    """The `done` event that ends a stream whose run finished."""
    return Event("done", {"input_tokens": result.usage.input_tokens,
                          "output_tokens": result.usage.output_tokens,
                          "iterations": result.iterations, "cost_usd": result.cost_usd,
                          "finish_reason": result.finish_reason, "tool_calls": result.tool_calls})


def stopped_event() -> Event:
    """The event that ends the stream of a stopped run."""
    return Event("stopped", {"message": "run stopped"})


def failure_event(exc: BaseException) -> Event:
    """The `stopped` or `error` event that ends a stream whose run did not finish."""
    if isinstance(exc, RunCancelled):
        return stopped_event()
    message = exc.message if isinstance(exc, AgentdError) else f"internal error: {exc}"
    return Event("error", {"message": message, "status": getattr(exc, "status", 500),
                           "retry_after": getattr(exc, "retry_after", None),
                           "code": getattr(exc, "code", None),
                           "retryable": bool(getattr(exc, "retryable", False)),
                           "kind": getattr(exc, "kind", None)})
