"""One run per session at a time across daemons, and the record of every run.

A run first takes the lease `run:<session id>` (the agent's own session, or a channel
conversation's), waiting while another daemon holds it, exactly as a run waits for the
agent's local run lock; then it writes its run record (`agent_runs`), admitted by the
budget gate. (A lone daemon with no budget limit has nothing to reserve and nobody to
tell: it writes the record once, complete, in the transaction that saves the run's
session.) The heartbeat (agentd/cluster/coordinator.py) renews the leases and records of
the runs here, closes the ones that ended while the database was out and applies stop
requests made on other daemons.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from pony import orm

from agentd import logs
from agentd.cluster.config import ClusterSettings
from agentd.errors import AgentdError, Conflict
from agentd.ids import time_ordered_uuid_str
from agentd.key_budgets import KeyOverBudget
from agentd.store import Store
from agentd.store.leases import Lease, Leases, RunLog, relaxed_commit
from agentd.store.outage import translate
from agentd.store.writer import PonyTx, Tx

if TYPE_CHECKING:
    from agentd.cluster.budget_gate import BudgetGate

log = logging.getLogger("agentd.cluster")

WAIT_STEP = 0.05  # first poll interval while another daemon holds a run lease (doubles to WAIT_MAX)
WAIT_MAX = 0.5


@dataclass
class LocalRun:
    """A run this daemon holds the lease of."""

    run_id: str
    agent_id: str
    lease: Lease
    cancel: threading.Event
    cost: list[float] = field(default_factory=list)
    closed: bool = False  # its record was closed in the caller's transaction (see RunLeases.run)
    # A lone daemon's run with no budget to reserve against: its record is written once,
    # complete, when it ends (see RunLeases._try_begin); until then it is listed from memory.
    deferred: bool = False
    session_id: str = ""
    started_at: float = 0.0


class RunLeases:
    """The runs of this daemon: their session leases and their records."""

    def __init__(self, store: Store, settings: ClusterSettings, shared: bool, leases: Leases, runs: RunLog,
                 budget: BudgetGate | None, leaving: threading.Event, stopping: threading.Event) -> None:
        self.store = store
        self.settings = settings
        self.id = settings.daemon_id
        self.shared = shared
        self.leases = leases
        self.runs = runs
        self.budget = budget
        self.leaving = leaving  # the daemon shuts down: its agents stop, others' are left alone
        self.stopping = stopping  # the heartbeat stopped: no run starts any more
        self.local: dict[str, LocalRun] = {}
        # A lone daemon's run leases live in memory: no other daemon can ask for them, and
        # writing a lease row twice per message is a transaction and a half of pure cost.
        self._sessions: set[str] = set()
        self._lock = threading.Lock()
        # Runs that ended while the database was out, closed by the next heartbeat.
        self._unclosed: list[tuple[LocalRun, str, str | None, float | None]] = []

    def run(self, handle: Any, cancel: threading.Event, lock_timeout: float | None,
            body: Callable[..., Any], *, completes: bool = False, session_id: str = "", key_id: str = "") -> Any:
        """Run `body` holding the session's lease and a run record (see the module doc); the
        session is `session_id` (a channel conversation's), else the agent's own; `key_id`
        names the scoped API key that pays for it (its budget is admitted like the daemon's).

        With `completes`, `body` gets `complete(tx, cost)`: called in the write transaction
        `tx` that saves the run's session, it closes the record as completed in that same
        transaction (one commit per message, not two); a run that does not call it, or fails
        after it, is closed here after."""
        local = self._begin(handle, session_id or handle.session_id, cancel, lock_timeout, key_id)
        status, error, result = "failed", None, None
        # The run's log lines name its record (the caller's context is restored by Runs).
        bound = logs.bind(run_id=local.run_id)

        def complete(tx: Tx, cost: float | None) -> None:
            self._close(local, "completed", None, cost, tx)

        try:
            result = body(complete) if completes else body()
            status = "completed"
            return result
        except BaseException as exc:
            from agentd.agents.loop import RunCancelled

            status = "cancelled" if isinstance(exc, RunCancelled) else "failed"
            known = (translate(exc) if isinstance(exc, Exception) else None) or exc
            error = (getattr(known, "message", None) or f"{type(exc).__name__}: {exc}")[:500]
            raise
        finally:
            cost = getattr(result, "cost_usd", None)
            with self._lock:
                self.local.pop(local.run_id, None)
            try:
                # A body that failed after complete() may have rolled the close back with its
                # transaction: close again (a no-op on a record already closed).
                if not local.closed or status != "completed":
                    self._close_now(local, status, error, cost)
            except Exception as exc:
                if translate(exc) is None:
                    raise
                # The database is out: the heartbeat closes the record and frees the lease
                # once it is back, rather than the reaper after the lease ran out.
                with self._lock:
                    self._unclosed.append((local, status, error, cost))
            finally:
                self._sessions.discard(local.lease.name)
                logs.unbind(bound)

    def _close_now(self, local: LocalRun, status: str, error: str | None, cost: float | None) -> None:
        with orm.db_session:
            relaxed_commit(self.store)
            self._close(local, status, error, cost)

    def _close(self, local: LocalRun, status: str, error: str | None, cost: float | None,
               tx: Tx | None = None) -> None:
        """Close the run record and hand its lease back: in the write transaction `tx`, or
        inside the caller's db_session."""
        tx = tx or PonyTx(self.store.db)
        if local.deferred:
            self.runs.record(local.run_id, local.agent_id, local.session_id, self.id, local.started_at,
                             status, error, cost, tx=tx)
        else:
            self.runs.finish(local.run_id, status, error, cost, tx=tx)
        if self.shared:
            self.leases.release(local.lease, tx=tx)
        local.closed = True

    def _begin(self, handle: Any, session_id: str, cancel: threading.Event, lock_timeout: float | None,
               key_id: str = "") -> LocalRun:
        from agentd.agents.loop import RunCancelled

        name = f"run:{session_id}"
        deadline = None if lock_timeout is None else time.monotonic() + lock_timeout
        step = WAIT_STEP
        while True:
            if cancel.is_set() or getattr(handle, "killed", False):
                raise RunCancelled("run cancelled before it started")
            local = self._try_begin(handle, session_id, name, cancel, key_id)
            if local is not None:
                return local
            if self.stopping.is_set():
                raise AgentdError("the daemon is shutting down", status=503)
            if deadline is not None and time.monotonic() >= deadline:
                raise Conflict(f"agent {handle.name} is busy with another run")
            cancel.wait(step)
            step = min(WAIT_MAX, step * 2)

    def _try_begin(self, handle: Any, session_id: str, name: str, cancel: threading.Event,
                   key_id: str = "") -> LocalRun | None:
        secs = self.settings.lease_secs
        run_id = time_ordered_uuid_str()
        if not self.shared:
            with self._lock:
                if name in self._sessions:
                    return None
                self._sessions.add(name)
            if self.budget is None or not self.budget.applies(key_id):
                # Nothing to reserve and no other daemon to tell: the record is written with
                # the run's end, in the transaction that saves its session (one commit per
                # message). A daemon killed meanwhile leaves no record of the run, as it
                # leaves none of its messages.
                return self._start_in_memory(LocalRun(run_id, handle.id, Lease(name, ""), cancel, deferred=True,
                                                      session_id=session_id, started_at=time.time()))
        try:
            with orm.db_session:
                relaxed_commit(self.store)
                return self._start_record(handle, session_id, name, cancel, run_id, secs, key_id)
        except BaseException as exc:
            self._sessions.discard(name)
            if isinstance(exc, KeyOverBudget):
                exc.record()  # now that the refused transaction is rolled back
            raise

    def _start_record(self, handle: Any, session_id: str, name: str, cancel: threading.Event, run_id: str,
                      secs: float, key_id: str = "") -> LocalRun | None:
        """Inside a db_session: take the run lease (shared database) and write the run record."""
        if self.shared:
            lease = self.leases.take(name, secs)
            if lease is None:
                return None
            # Taking an expired lease: the run that held it died with its daemon. (A lone
            # daemon on SQLite failed every leftover run when it started.)
            self.runs.reap(secs, session_id=session_id)
        else:
            lease = Lease(name, "")  # held in self._sessions
        reserve = self.budget.admit(handle.id, key_id) if self.budget is not None else 0.0
        self.runs.start(run_id, handle.id, session_id, self.id, time.time() + secs, reserve, key_id or None)
        return self._start_in_memory(LocalRun(run_id, handle.id, lease, cancel))

    def _start_in_memory(self, local: LocalRun) -> LocalRun:
        with self._lock:
            self.local[local.run_id] = local
        return local

    def count(self) -> int:
        with self._lock:
            return len(self.local)

    def list_runs(self, agent_id: str | None = None, status: str | None = None,
                  limit: int = 100) -> list[dict[str, Any]]:
        """GET /api/cluster/runs: the records, newest first, with this daemon's runs whose
        record is written only when they end (shown `running` meanwhile)."""
        rows = self.runs.list_rows(agent_id, status, limit)
        if status in (None, "", "running"):
            with self._lock:
                pending = [(r.run_id, r.agent_id, r.session_id, self.id, "running", r.started_at, None, None, None)
                           for r in self.local.values()
                           if r.deferred and not r.closed and (not agent_id or r.agent_id == agent_id)]
            if pending:
                rows = sorted(rows + pending, key=lambda r: r[5], reverse=True)[:limit]
        return [RunLog.view(r) for r in rows]

    def running_elsewhere(self, session_id: str) -> str | None:
        """The other daemon running this session now, or None (free, or running here)."""
        if not self.shared:
            return None
        owner = self.leases.holder(f"run:{session_id}")
        return owner if owner is not None and owner != self.id else None

    def check_stream(self, handle: Any) -> None:
        """409 when a stream request reached a daemon other than the one running the agent."""
        owner = self.running_elsewhere(handle.session_id)
        if owner is not None:
            raise Conflict(f"run is on daemon {owner}; route stream paths by agent id")

    def request_stop(self, agent_id: str) -> int:
        """Ask other daemons to stop this agent's runs (applied at their next heartbeat)."""
        if self.leaving.is_set():
            return 0
        return self.runs.request_stop(agent_id, self.id)

    # -- heartbeat -------------------------------------------------------------------------
    def close_unclosed(self) -> None:
        """Close the runs that ended while the database was out (it answers again)."""
        with self._lock:
            unclosed, self._unclosed = self._unclosed, []
        for i, (local, status, error, cost) in enumerate(unclosed):
            try:
                self._close_now(local, status, error, cost)
            except Exception:
                with self._lock:
                    self._unclosed[:0] = unclosed[i:]
                raise

    def renew(self) -> None:
        """Renew the leases and records of the runs here; a run that lost either is stopped."""
        secs = self.settings.lease_secs
        with self._lock:
            local = [run for run in self.local.values() if not run.closed and not run.deferred]
        for run in local:
            # A run that ended meanwhile handed its lease back and closed its record: nothing lost.
            if self.shared and not self.leases.renew(run.lease, secs) and not run.closed:
                log.warning("run %s lost its lease (this daemon was too slow); stopping it", run.run_id)
                run.cancel.set()
        lost = self.runs.renew(self.id, [r.run_id for r in local], time.time() + secs)
        for run in local:
            if run.run_id in lost and not run.closed:
                run.cancel.set()

    def apply_stop_requests(self) -> None:
        """Stop the runs here that another daemon was asked to stop."""
        for run_id in self.runs.stop_requests(self.id):
            with self._lock:
                run = self.local.get(run_id)
            if run is not None and not run.cancel.is_set():
                log.info("run %s stopped on request of another daemon", run_id)
                run.cancel.set()
