"""Per-agent run queues and stops: a request waiting for a busy agent holds no run-pool worker.

An agent runs one message at a time. The first request for an idle agent gets a worker
of the kernel's executor; requests that arrive while it is busy wait in the agent's own
queue (bounded: beyond `max_queue` they are refused with 429), and the worker that
finishes a run takes the agent's next one. So a stuck provider occupies one worker per
agent, never the whole pool, and other agents keep answering.

A queued run can be withdrawn (its client went away) and then never starts. `stop`
cancels an agent's current run; `cancel` also empties its queue (kill, shutdown).

A plain request that finds its agent idle runs on its own server thread (`run_here`):
it would only wait for a worker otherwise, and handing the run over and back costs two
thread switches per message. A watcher thread polls the clients of such runs and stops
the run of one that went away.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

from agentd.agents.loop import RunCancelled, RunResult
from agentd.errors import AgentdError, NotFound, TooManyRequests
from agentd.store.outage import log_failure, unless_unavailable

log = logging.getLogger("agentd.agents")

if TYPE_CHECKING:
    from agentd.agents.approvals import ApprovalQueue
    from agentd.cluster.coordinator import Cluster

BUSY_RETRY_AFTER = 2  # seconds a client refused for a busy agent is told to wait
WAIT_POLL = 0.1  # how often a waiting request checks for stop and client disconnects


class QueuedRun:
    """A run waiting for its agent (or running): `execute(handle)` runs it to completion for
    the agent whose queue it is in; its result goes to `future`."""

    def __init__(self, execute: Callable[[Any], RunResult], cancel: threading.Event) -> None:
        self.execute = execute
        self.cancel = cancel
        self._future: Future | None = None

    @property
    def future(self) -> Future:
        """Made on first use: a run its caller claimed runs on the caller's thread and never
        needs one. A queued run's is made before it is queued, on the submitting thread."""
        future = self._future
        if future is None:
            future = self._future = Future()
        return future


class Poller:
    """One daemon thread calling every registered check each `interval` seconds.

    It sleeps while nothing is registered; registering does not wake it while it is
    already polling, so a busy daemon pays at most one wake-up per interval, not one per
    message."""

    def __init__(self, name: str, interval: float) -> None:
        self.name = name
        self.interval = interval
        self._watched: dict[int, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        _POLLERS.add(self)

    def add_check(self, key: int, check: Callable[[], None]) -> int:
        """Call `check()` on every pass until `remove(key)`."""
        with self._lock:
            self._watched[key] = check
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        if not self._wake.is_set():  # (a busy daemon's poller is awake already: no lock taken)
            self._wake.set()
        return key

    def remove(self, key: int) -> None:
        with self._lock:
            self._watched.pop(key, None)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(self.interval)
            self.poll()

    def poll(self) -> None:
        """One pass over the checks; sleep again when none is registered."""
        with self._lock:
            checks = list(self._watched.values())
            if not checks:
                self._wake.clear()
        for check in checks:
            try:
                check()
            except Exception as exc:  # noqa: BLE001 - one failing check must not end the others' polling
                log_failure(log, exc, "%s: a check failed and was dropped", self.name)
                with self._lock:
                    for key, registered in list(self._watched.items()):
                        if registered is check:
                            del self._watched[key]


_POLLERS: "weakref.WeakSet[Poller]" = weakref.WeakSet()


def _forget_polling() -> None:
    # A forked child has none of its parent's threads, and the checks registered are the
    # parent's streams and clients, not the child's: each poller starts afresh there.
    for poller in list(_POLLERS):
        poller._watched, poller._lock, poller._wake, poller._thread = {}, threading.Lock(), threading.Event(), None


os.register_at_fork(after_in_child=_forget_polling)


class DisconnectWatch(Poller):
    """Stops runs whose client went away, polled every WAIT_POLL seconds."""

    def __init__(self) -> None:
        super().__init__("agentd-client-watch", WAIT_POLL)

    def add(self, cancel: threading.Event, disconnected: Callable[[], bool]) -> int:
        """Watch until `remove`; sets `cancel` once `disconnected()` is true."""
        def check() -> None:
            if not cancel.is_set() and disconnected():
                cancel.set()
        return self.add_check(id(cancel), check)

    @contextmanager
    def watching(self, cancel: threading.Event, disconnected: Callable[[], bool] | None) -> Iterator[None]:
        """`add` for the block's duration (`disconnected` None: a caller with no client to lose)."""
        key = self.add(cancel, disconnected) if disconnected is not None else None
        try:
            yield
        finally:
            if key is not None:
                self.remove(key)


class RunQueues:
    """The queues of every agent, and stopping their runs.

    The handle carries its own queue state (`waiting`, `busy`, `queue_lock`), so a killed
    agent's queue goes with it. On a shared database (`shared`) a stop that finds no run
    here asks the other daemons (`cluster.request_stop`).
    """

    def __init__(self, executor: ThreadPoolExecutor, max_queue: Callable[[], int],
                 approvals: ApprovalQueue | None = None, cluster: Cluster | None = None,
                 shared: bool = False) -> None:
        self.executor = executor
        self.max_queue = max_queue
        self.approvals = approvals
        self.cluster = cluster
        self.shared = shared
        self.watch = DisconnectWatch()

    def stop(self, handle: Any) -> bool:
        """Cancel the agent's current run; True when one was running.

        A run of this daemon stops without the database (its approval waits end with it),
        so a stop works while the database is out; only asking other daemons needs it."""
        cancel = handle.cancel or handle.starting
        if cancel is not None and not cancel.is_set():
            cancel.set()
            if self.approvals is not None:
                unless_unavailable(lambda: self.approvals.cancel_agent(handle.id))()
            return True
        if self.approvals is not None:
            self.approvals.cancel_agent(handle.id)
        if self.cluster is not None and self.shared:
            return self.cluster.request_stop(handle.id) > 0
        return False

    def cancel(self, handle: Any) -> None:
        """Cancel every queued run of the agent and stop its current one (kill, shutdown)."""
        self.cancel_queued(handle)
        self.stop(handle)

    def run_here(self, handle: Any, job: QueuedRun,
                 disconnected: Callable[[], bool] | None = None) -> RunResult:
        """Run `job` on the calling thread if the agent is idle, else queue it and wait.

        Either way the result (or the run's exception) is returned, stops and client
        disconnects end it promptly, and the agent's queued runs continue afterwards."""
        return self.claim(handle, job).result(disconnected)

    def claim(self, handle: Any, job: QueuedRun) -> "ClaimedRun":
        """Take an idle agent for the calling thread, or queue `job` behind its current run.

        Refusals (a killed agent, a full queue) are raised here, before the caller has
        answered anything; the run itself starts with `ClaimedRun.result`."""
        with handle.queue_lock:
            idle = not handle.busy and not handle.killed
            if idle:
                handle.busy = True
        if not idle:
            self.submit(handle, job)
        return ClaimedRun(self, handle, job, idle)

    def _run_claimed(self, handle: Any, job: QueuedRun,
                     disconnected: Callable[[], bool] | None) -> RunResult:
        """Run `job` for an agent this thread has claimed, then hand the agent on."""
        try:
            with self.watch.watching(job.cancel, disconnected):
                if job.cancel.is_set() or handle.killed:
                    raise RunCancelled("run cancelled before it started")
                return self._start(handle, job)
        finally:
            self._hand_on(handle)

    def _start(self, handle: Any, job: QueuedRun) -> RunResult:
        """Run `job`; until it ends, a stop of the agent sets its cancel event."""
        handle.starting = job.cancel
        try:
            return job.execute(handle)
        finally:
            handle.starting = None

    def _hand_on(self, handle: Any) -> None:
        """After a run on a server thread: the agent's next queued run goes to a worker."""
        with handle.queue_lock:
            job = handle.waiting.popleft() if handle.waiting else None
            if job is None:
                handle.busy = False
                return
            handle.starting = job.cancel
        try:
            self.executor.submit(self._drain, handle, job)
        except RuntimeError:  # shutting down: nobody will run the rest
            self.cancel_queued(handle)
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(RunCancelled("run cancelled before it started"))
            with handle.queue_lock:
                handle.busy = False
                handle.starting = None

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
            # A stop that comes before a worker picks the run up still reaches it.
            handle.starting = job.cancel
        try:
            self.executor.submit(self._drain, handle, job)
        except RuntimeError:  # the executor is shut down: the daemon is stopping
            with handle.queue_lock:
                handle.busy = False
                handle.starting = None
            raise AgentdError("the daemon is shutting down", status=503) from None
        return job.future

    def _drain(self, handle: Any, job: QueuedRun | None) -> None:
        """Run `job`, then the agent's queued requests in order, on this one worker."""
        while job is not None:
            self._run_job(handle, job)
            with handle.queue_lock:
                job = handle.waiting.popleft() if handle.waiting else None
                handle.starting = None if job is None else job.cancel
                if job is None:
                    handle.busy = False

    def _run_job(self, handle: Any, job: QueuedRun) -> None:
        if not job.future.set_running_or_notify_cancel():
            return
        if job.cancel.is_set() or handle.killed:
            job.future.set_exception(RunCancelled("run cancelled before it started"))
            return
        try:
            result = self._start(handle, job)
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


class ClaimedRun:
    """A run whose place is taken (`RunQueues.claim`): on the claiming thread when the agent
    was idle, else in the agent's queue for a worker. Exactly one of `result` and `abandon`
    takes effect."""

    def __init__(self, queues: RunQueues, handle: Any, job: QueuedRun, here: bool) -> None:
        self.queues = queues
        self.handle = handle
        self.job = job
        self.here = here
        self._taken = False

    def result(self, disconnected: Callable[[], bool] | None = None) -> RunResult:
        """Run it here (or wait for the worker running it) and return its result."""
        self._taken = True
        if self.here:
            return self.queues._run_claimed(self.handle, self.job, disconnected)
        return self.queues.wait(self.job.future, self.job.cancel, disconnected)

    def abandon(self) -> None:
        """The caller will not wait for it (its client left first): free the agent, or
        withdraw the queued run. Nothing once `result` was called."""
        if self._taken:
            return
        self._taken = True
        if self.here:
            self.queues._hand_on(self.handle)
        else:
            self.queues.withdraw(self.job.future)  # and a run that already started is cancelled
