"""A run streamed to its client, written the same way for every SSE transport.

A transport (the native SSE route, OpenAI chunks) only says how its stream looks: what
opens it, how each event reads, what a keep-alive is and what closes it (`StreamShape`).

`stream_run` writes the run as it goes, under any WSGI server: the response takes PEP
3333's `write` callable from `start_response` (waitress's task.write in the daemon,
agentd/server/task.py; the test client's buffer under Flask's test client). The run
executes on the request's own thread and each event goes to the socket as the run emits
it: no queue and no thread hand-off per event, which on a busy daemon is most of what a
streamed message costs above a plain one. A busy agent's run waits in its queue and the
worker that runs it writes into the same stream. One keeper thread sends the keep-alives
of quiet streams and ends the stream of a stopped run at once.

Only this layer decides when bytes leave: an event is written when it is delivered,
except the two it knows are followed at once -- the opening of a run that starts on this
thread (its first event follows) and the `done` phase (the final event follows) -- which
leave with what follows them. The keeper writes anything held for a poll interval. A
model's deltas leave one write each: whether its next read would wait is the model
layer's to know, and it tells nobody.

Refusals (quota, budget, stream cap, a full agent queue) are raised before the response
starts, so they stay plain JSON errors.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from flask import Response, stream_with_context

from agentd.agents.events import Event
from agentd.agents.manager import AgentHandle, RunOptions
from agentd.agents.run_request import CALLER, RunRequest, RunTicket
from agentd.agents.runqueue import Poller
from agentd.api.runs import (POLL_SECS, acquire_stream_slot, client_disconnected, failure_event, result_event,
                             stopped_event, stream_slots)
from agentd.api.sse import comment
from agentd.kernel import Kernel
from agentd.server.task import LAST_WRITE_KEY, ClientGone

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
               options: RunOptions | None, shape: StreamShape, origin: str = "sse",
               run: dict[str, str] | None = None) -> Response:
    """Start streaming `text` to `handle` as Server-Sent Events; refusals are raised here."""
    acquire_stream_slot(handle=handle)
    slots = stream_slots()
    try:
        stream = WrittenStream(shape, kernel.config.api.sse_keepalive_secs)
        claimed = kernel.runs.start(RunRequest(handle, text, attachments, options, emit=stream.deliver,
                                               cancel=stream.cancel, on=CALLER, origin=origin, **(run or {})))
    except BaseException:
        slots.release()
        raise
    released = threading.Lock()

    def closed() -> None:
        if released.acquire(blocking=False):  # once: at the body's end, or when closed unstarted
            claimed.abandon()  # a response closed before its run began: free the agent
            slots.release()

    response = WrittenResponse(stream, _written(stream, claimed, client_disconnected(), closed))
    response.call_on_close(closed)
    return response


class WrittenResponse(Response):
    """An event stream whose bytes `stream` writes with the server's `write` callable; the
    body iterator runs the stream and yields nothing."""

    def __init__(self, stream: "WrittenStream", body: Iterator[str]) -> None:
        super().__init__(stream_with_context(body), mimetype="text/event-stream")
        self.stream = stream
        self.headers["Cache-Control"] = "no-cache"
        # Reverse proxies (nginx) buffer responses unless told not to.
        self.headers["X-Accel-Buffering"] = "no"

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        app_iter, status, headers = self.get_wsgi_response(environ)
        write = start_response(status, headers)
        # The daemon's server also offers a write of the answer's last bytes, which leave
        # with the end of the answer; elsewhere they go through `write`.
        self.stream.attach(write, environ.get(LAST_WRITE_KEY))
        return app_iter


def _written(stream: "WrittenStream", claimed: RunTicket, disconnected: Callable[[], bool] | None,
             closed: Callable[[], None]) -> Iterator[str]:
    """Run on this thread, writing as it goes; yields nothing (every byte is written)."""
    # A run on this thread starts at once: its opening goes out with its first event
    # (a queued run's stream opens now).
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

    def __init__(self, shape: StreamShape, heartbeat: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._write: Callable[[bytes], Any] | None = None
        self._write_last: Callable[[bytes], Any] | None = None
        self.shape = shape
        self.heartbeat = heartbeat
        self.cancel = threading.Event()  # the run's: set when its client is gone
        self._lock = threading.Lock()  # one write at a time (run, worker and keeper threads)
        self._last = clock()
        # Until `open`, rendered events wait here: a queued run's worker may start before
        # the response does, and nothing may reach the socket ahead of the opening.
        self._pending: list[str] | None = []
        # Chunks that leave with the next event (the keeper's after STALE_HOLD), and since when.
        self._held: list[str] = []
        self._held_at = 0.0
        self._ended = False  # the final event was written (or the client left)
        self._finished = False  # the request is over: nothing may be written any more

    def attach(self, write: Callable[[bytes], Any], write_last: Callable[[bytes], Any] | None = None) -> None:
        """The server's `write` callable, and its write of an answer's last bytes if it has one."""
        self._write = write
        self._write_last = write_last or write

    def open(self, hold: bool = False) -> None:
        """Write the opening comment, the transport's opening and what the run already
        emitted; with `hold` (the run starts on this thread), with the run's next event."""
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

    def finish(self) -> None:
        with self._lock:
            self._finished = True

    def tick(self) -> None:
        """The keeper's pass: what was held for a poll interval, a keep-alive after
        `heartbeat` seconds of silence, and the end of the stream as soon as the run is
        stopped (the run itself ends moments later)."""
        if not self._lock.acquire(blocking=False):
            return  # a write is under way: the stream is not quiet
        try:
            if self._ended or self._finished or self._pending is not None:
                return
            if self._held and self._clock() - self._held_at >= STALE_HOLD:
                self._send([])  # what follows is late: the held chunks go alone
            if self.cancel.is_set():
                self._deliver(stopped_event())
            elif self._clock() - self._last >= self.heartbeat:
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
            # An event this transport does not show; the run has begun: a held opening
            # goes now (a model call may follow).
            self._send([])
            return
        elif self._pending is None and _followed_at_once(event):
            self._hold(chunks)
            return
        self._send(chunks, final)

    def _hold(self, chunks: list[str]) -> None:
        """Keep `chunks` to leave with the next write (nothing is held before the opening)."""
        if not self._held:
            self._held_at = self._clock()
        self._held.extend(chunks)

    def _send(self, chunks: tuple[str, ...] | list[str], final: bool = False) -> None:
        if self._pending is not None:
            self._pending.extend(chunks)
            return
        if self._held:
            chunks, self._held = [*self._held, *chunks], []
        if self._finished or not chunks:
            return
        write = self._write_last if final else self._write
        assert write is not None, "a stream is written only once its response was started"
        try:
            write("".join(chunks).encode("utf-8"))
        except (ClientGone, OSError):
            # The client left: stop the run (its provider call is interrupted) and write no more.
            self._ended = self._finished = True
            self.cancel.set()
        else:
            self._last = self._clock()


def _followed_at_once(event: Event) -> bool:
    """Whether the run's next event follows `event` with no wait in between, so it is held
    and written with it: only the `done` phase, which the run's end follows. (A model's
    deltas are written as they come: whether its next read waits is the model's to know.)"""
    return event.type == "phase" and event.data.get("phase") == "done"


#: How long the keeper leaves held chunks before writing them itself: what follows them
#: comes within microseconds; the keeper only catches a run that is slow to go on, and
#: must not race one that is about to (a stream's opening and first event would leave in
#: two writes, not one).
STALE_HOLD = POLL_SECS

#: Keep-alives and stops for every written stream of this process.
KEEPER = Poller("agentd-stream-keeper", POLL_SECS)
