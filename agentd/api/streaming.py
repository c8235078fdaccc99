"""A run streamed to its client, written the same way for every SSE transport.

A transport (the native SSE route, OpenAI chunks) only says how its stream looks: what
opens it, how each event reads, what a keep-alive is and what closes it (`StreamShape`).
`stream_run` delivers the run in one of two ways, with the same bytes either way:

* **Written in place** -- in the daemon, whose waitress task puts its `write` in the
  environ (`DIRECT_WRITE_KEY`, agentd/api/ws_transport.py). The run executes on the
  request's own thread and each event goes to the socket as the run emits it: no queue and
  no thread hand-off per event, which on a busy daemon is most of what a streamed message
  costs above a plain one. A busy agent's run waits in its queue and the worker that runs
  it writes into the same stream. One keeper thread sends the keep-alives of quiet streams
  and ends the stream of a stopped run at once.
* **Pulled** -- under any other WSGI server (and Flask's test client): the run goes to a
  worker and its events reach the response iterator through a queue (runs.LiveRun).

Refusals (quota, budget, stream cap, a full agent queue) are raised before the response
starts, so they stay plain JSON errors in both.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from flask import Response, request
from waitress.channel import ClientDisconnected

from agentd import held_writes
from agentd.agents.events import Event
from agentd.agents.manager import AgentHandle, RunOptions
from agentd.agents.runqueue import Poller
from agentd.agents.runs import CALLER, RunRequest, RunTicket
from agentd.api.runs import (POLL_SECS, LiveRun, acquire_stream_slot, client_disconnected, failure_event,
                             result_event, start_live_run)
from agentd.api.sse import comment, sse_response
from agentd.api.ws_transport import DIRECT_WRITE_KEY, LAST_WRITE_KEY
from agentd.kernel import Kernel

Render = Callable[[Event], tuple[list[str], bool]]


@dataclass(frozen=True)
class StreamShape:
    """How one transport writes a run: `render(event)` gives the event's chunks and whether
    it ends the stream; `closing` follows the final event."""

    opening: tuple[str, ...]
    render: Render
    keep_alive: str
    closing: tuple[str, ...] = ()


def stream_run(kernel: Kernel, handle: AgentHandle, text: str, attachments: list,
               options: RunOptions | None, shape: StreamShape) -> Response:
    """Start streaming `text` to `handle` as Server-Sent Events; refusals are raised here."""
    acquire_stream_slot(kernel, handle=handle)
    write = request.environ.get(DIRECT_WRITE_KEY)
    try:
        if write is None:
            run = start_live_run(kernel, handle, text, attachments, options)
        else:
            stream = WrittenStream(write, shape, kernel.config.api.sse_keepalive_secs,
                                   write_last=request.environ.get(LAST_WRITE_KEY))
            claimed = kernel.runs.start(RunRequest(handle, text, attachments, options, emit=stream.deliver,
                                                   cancel=stream.cancel, on=CALLER))
    except BaseException:
        kernel.stream_slots.release()
        raise
    if write is None:
        def pulled_closed() -> None:
            run.close()
            kernel.stream_slots.release()

        return sse_response(_pulled(run, shape), on_close=pulled_closed, ready=run.sink.pending)

    released = threading.Lock()

    def written_closed() -> None:
        if released.acquire(blocking=False):  # once: at the body's end, or when closed unstarted
            claimed.abandon()  # a response closed before its run began: free the agent
            kernel.stream_slots.release()

    response = sse_response(_written(stream, claimed, client_disconnected(), written_closed), opening=False)
    response.call_on_close(written_closed)
    return response


def _pulled(run: LiveRun, shape: StreamShape) -> Iterator[str]:
    yield from shape.opening
    for event in run.events():
        if event is None:
            yield shape.keep_alive
            continue
        chunks, final = shape.render(event)
        yield from chunks
        if final:
            break
    yield from shape.closing


def _written(stream: "WrittenStream", claimed: RunTicket, disconnected: Callable[[], bool] | None,
             closed: Callable[[], None]) -> Iterator[str]:
    """Run on this thread, writing as it goes; yields nothing (every byte is written)."""
    # A run on this thread starts at once: its opening goes out with its first events,
    # when the run first waits (a queued run's stream opens now).
    stream.open(hold=claimed.here)
    key = KEEPER.add_check(id(stream), stream.tick)
    try:
        try:
            final = result_event(claimed.result(disconnected))
        except Exception as exc:  # noqa: BLE001 - every failure ends the stream with an event
            final = failure_event(exc)
        stream.deliver(final)
    finally:
        KEEPER.remove(key)
        stream.finish()
        closed()
    yield from ()


class WrittenStream:
    """One run's events written straight to its client; any thread may deliver."""

    def __init__(self, write: Callable[[bytes], Any], shape: StreamShape, heartbeat: float,
                 write_last: Callable[[bytes], Any] | None = None) -> None:
        self._write = write
        # For the final event: sent with the end of the answer (ws_transport.LAST_WRITE_KEY).
        self._write_last = write_last or write
        self.shape = shape
        self.heartbeat = heartbeat
        self.cancel = threading.Event()  # the run's: set when its client is gone
        self._lock = threading.Lock()  # one write at a time (run, worker and keeper threads)
        self._last = time.monotonic()
        # Until `open`, rendered events wait here: a queued run's worker may start before
        # the response does, and nothing may reach the socket ahead of the opening.
        self._pending: list[str] | None = []
        # Chunks held until the delivering thread waits (agentd/held_writes.py), and since when.
        self._held: list[str] = []
        self._held_at = 0.0
        self._ended = False  # the final event was written (or the client left)
        self._finished = False  # the request is over: nothing may be written any more

    def open(self, hold: bool = False) -> None:
        """Write the opening comment, the transport's opening and what the run already
        emitted; with `hold`, when this thread is next about to wait."""
        with self._lock:
            pending, self._pending = self._pending or [], None
            opening = [comment("stream open"), *self.shape.opening, *pending]
            if hold:
                self._hold(opening)
            else:
                self._send(opening)

    def deliver(self, event: Event) -> None:
        """The run's sink: write `event` as the transport renders it."""
        with self._lock:
            self._deliver(event)

    def flush(self) -> None:
        """Write what is held."""
        with self._lock:
            self._send([])

    def finish(self) -> None:
        with self._lock:
            self._finished = True
            self._held = []

    def tick(self) -> None:
        """The keeper's pass: a keep-alive after `heartbeat` seconds of silence, and the end
        of the stream as soon as the run is stopped (the run itself ends moments later)."""
        if not self._lock.acquire(blocking=False):
            return  # a write is under way: the stream is not quiet
        try:
            if self._ended or self._finished or self._pending is not None:
                return
            if self._held and time.monotonic() - self._held_at >= STALE_HOLD:
                self._send([])  # what a thread held and has not written since (it should have)
            if self.cancel.is_set():
                self._deliver(Event("stopped", {"message": "run stopped"}))
            elif time.monotonic() - self._last >= self.heartbeat:
                self._send([self.shape.keep_alive])
        finally:
            self._lock.release()

    def _deliver(self, event: Event) -> None:
        if self._ended:
            return
        chunks, final = self.shape.render(event)
        if final:
            self._ended = True
            chunks = [*chunks, *self.shape.closing]
        elif not chunks:
            return  # (an event this transport does not show)
        elif self._pending is None and _followed_at_once(event):
            self._hold(chunks)
            return
        self._send(chunks, final)

    def _hold(self, chunks: list[str]) -> None:
        """Keep `chunks` for this thread's next wait (nothing is held before the opening)."""
        if not self._held:
            self._held_at = time.monotonic()
        self._held.extend(chunks)
        held_writes.hold(self.flush)

    def _send(self, chunks: tuple[str, ...] | list[str], final: bool = False) -> None:
        if self._pending is not None:
            self._pending.extend(chunks)
            return
        if self._held:
            chunks, self._held = [*self._held, *chunks], []
        if self._finished or not chunks:
            return
        try:
            (self._write_last if final else self._write)("".join(chunks).encode("utf-8"))
        except (ClientDisconnected, OSError):
            # The client left: stop the run (its provider call is interrupted) and write no more.
            self._ended = self._finished = True
            self.cancel.set()
        else:
            self._last = time.monotonic()


#: Phases the run goes on from at once: the model call (streaming, thinking) or the final
#: event (done). A tool's phase comes before the tool runs, which can take any time.
_PHASES_FOLLOWED_AT_ONCE = frozenset({"streaming", "thinking", "done"})


def _followed_at_once(event: Event) -> bool:
    """Whether more of the run follows `event` before its thread waits for anything, so it
    may be held and written with what follows (agentd/held_writes.py)."""
    if event.type == "phase":
        return event.data.get("phase") in _PHASES_FOLLOWED_AT_ONCE
    # Parsed from the model's stream: the next read, or the end of the call, follows.
    return event.type in ("text_delta", "tool_use", "tool_args_delta", "tool_input")


#: How long the keeper leaves chunks a thread holds before writing them itself: a thread
#: writes what it holds within microseconds, when it next waits; the keeper only catches a
#: thread that never does, and must not race one that is about to (a stream's opening and
#: first events would leave in two writes, not one).
STALE_HOLD = POLL_SECS

#: Keep-alives and stops for every written stream of this process.
KEEPER = Poller("agentd-stream-keeper", POLL_SECS)
