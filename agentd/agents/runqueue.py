"""Per-agent run queues: a request waiting for a busy agent holds no run-pool worker.

An agent runs one message at a time. The first request for an idle agent gets a worker
of the kernel's executor; requests that arrive while it is busy wait in the agent's own
queue (bounded: beyond `max_queue` they are refused with 429), and the worker that
finishes a run takes the agent's next one. So a stuck provider occupies one worker per
agent, never the whole pool, and other agents keep answering.

A queued run can be withdrawn (its client went away) and then never starts.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Callable

from agentd.agents.events import Sink
from agentd.agents.loop import RunCancelled, RunResult
from agentd.errors import AgentdError, NotFound, TooManyRequests

BUSY_RETRY_AFTER = 2  # seconds a client refused for a busy agent is told to wait
WAIT_POLL = 0.1  # how often a waiting request checks for stop and client disconnects


@dataclass
class QueuedRun:
    """A message waiting for its agent (or running): what to run and where the result goes."""

    text: str
    attachments: list[dict[str, Any]] | None
    emit: Sink | None
    options: Any
    cancel: threading.Event
    future: Future


class RunQueues:
    """The queues of every agent. `run(handle, job)` runs one job to completion.

    The handle carries its own queue state (`waiting`, `busy`, `queue_lock`), so a killed
    agent's queue goes with it.
    """

    def __init__(self, executor: ThreadPoolExecutor, max_queue: Callable[[], int],
                 run: Callable[[Any, QueuedRun], RunResult]) -> None:
        self.executor = executor
        self.max_queue = max_queue
        self.run = run

    def submit(self, handle: Any, job: QueuedRun) -> Future:
        """Start `job` now if the agent is idle, else queue it; 429 when the queue is full."""
        job.future.agentd_job = (handle, job)  # type: ignore[attr-defined]
        with handle.queue_lock:
            if handle.killed:
                raise NotFound("agent not found")
            if handle.busy:
                limit = self.max_queue()
                if len(handle.waiting) >= limit:
                    raise TooManyRequests(
                        f"agent {handle.name} is busy: {len(handle.waiting)} requests are already waiting "
                        f"for it (max_queue {limit}); try again later", retry_after=BUSY_RETRY_AFTER,
                        code="agent_busy")
                handle.waiting.append(job)
                return job.future
            handle.busy = True
        try:
            self.executor.submit(self._drain, handle, job)
        except RuntimeError:  # the executor is shut down: the daemon is stopping
            with handle.queue_lock:
                handle.busy = False
            raise AgentdError("the daemon is shutting down", status=503) from None
        return job.future

    def _drain(self, handle: Any, job: QueuedRun | None) -> None:
        """Run `job`, then the agent's queued requests in order, on this one worker."""
        while job is not None:
            self._run_job(handle, job)
            with handle.queue_lock:
                job = handle.waiting.popleft() if handle.waiting else None
                if job is None:
                    handle.busy = False

    def _run_job(self, handle: Any, job: QueuedRun) -> None:
        if not job.future.set_running_or_notify_cancel():
            return
        if job.cancel.is_set() or handle.killed:
            job.future.set_exception(RunCancelled("run cancelled before it started"))
            return
        try:
            result = self.run(handle, job)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)

    @staticmethod
    def withdraw(future: Future) -> bool:
        """Take a run that has not started out of its agent's queue; True if it was queued.

        Its cancel event is set either way, so a run that already started stops too."""
        handle, job = getattr(future, "agentd_job", (None, None))
        if handle is None:
            return False
        job.cancel.set()
        with handle.queue_lock:
            try:
                handle.waiting.remove(job)
            except ValueError:
                return False
        if job.future.set_running_or_notify_cancel():
            job.future.set_exception(RunCancelled("run withdrawn before it started"))
        return True

    @staticmethod
    def cancel_queued(handle: Any) -> int:
        """Cancel every run waiting for `handle` (kill, shutdown); how many there were."""
        with handle.queue_lock:
            jobs = list(handle.waiting)
            handle.waiting.clear()
        for job in jobs:
            job.cancel.set()
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(RunCancelled("run cancelled before it started"))
        return len(jobs)

    def wait(self, future: Future, cancel: threading.Event,
             disconnected: Callable[[], bool] | None = None) -> RunResult:
        """Wait for a submitted run; returns promptly (RunCancelled) once it is stopped.

        `disconnected` tells whether the client went away: a queued run is then withdrawn
        (never started) and a running one cancelled.
        """
        while True:
            try:
                return future.result(timeout=WAIT_POLL)
            except FutureTimeout:
                if cancel.is_set():
                    raise RunCancelled("run cancelled") from None
                if disconnected is not None and disconnected():
                    if not self.withdraw(future):
                        cancel.set()
                    raise RunCancelled("the client disconnected") from None
