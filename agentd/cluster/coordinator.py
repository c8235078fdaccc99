"""The `Cluster` every daemon has (the package's docstring says what it does): the
heartbeat, the reaper, and one entry point to run leases, held leases and members.

Not in the package's __init__: this imports Pony and the store, and every command of the
command line reads the `[cluster]` table (agentd/cluster/config.py) without needing them.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from pony import orm

from agentd.cluster.config import ClusterSettings
from agentd.cluster.held_leases import HeldLeases
from agentd.cluster.members import Members
from agentd.cluster.run_leases import RunLeases
from agentd.store import Store
from agentd.store.leases import Leases, RunLog
from agentd.store.outage import OUTAGE, log_failure

if TYPE_CHECKING:
    from agentd.cluster.budget_gate import BudgetGate

log = logging.getLogger("agentd.cluster")

RUN_RETENTION_SECS = 7 * 86400
DECIDED_RETENTION_SECS = 86400  # approvals decided for runs that died with their daemon
PRUNE_EVERY_SECS = 3600


class Cluster:
    """Coordination of this daemon with the others on the same database."""

    def __init__(self, store: Store, settings: ClusterSettings, listen: str, shared: bool | None = None,
                 budget: BudgetGate | None = None, audit: Callable[[str, str, dict[str, Any]], None] | None = None,
                 leaving: threading.Event | None = None) -> None:
        self.store = store
        self.settings = settings
        self.id = settings.daemon_id
        # Whether other daemons use this database (PostgreSQL). `shared=True` on SQLite lets
        # tests run two clusters on one file, which a daemon's lock on SQLite never allows.
        self.shared = store.shared if shared is None else shared
        self.leases = Leases(store, self.id)
        self.runs = RunLog(store)
        self.on_tick: list[Callable[[], None]] = []  # channel leaders, ... (called every heartbeat)
        # The kernel's audit trail (AuditLog.record): runs failed by the reaper are recorded there.
        self.audit = audit
        # Set when this daemon shuts down (the kernel's `stopping`): stopping its own agents
        # then must not ask other daemons to stop theirs.
        self.leaving = leaving or threading.Event()
        self._stop = threading.Event()
        self.members = Members(store, settings, listen)
        self.held = HeldLeases(self.leases, settings)  # other leases (channels) renewed with the runs
        # `budget`: admission of runs against the monthly budget (reservations on a shared database).
        self.run_leases = RunLeases(store, settings, self.shared, self.leases, self.runs, budget, self.leaving,
                                    self._stop)
        self._thread: threading.Thread | None = None
        self._last_prune = -float(PRUNE_EVERY_SECS)  # monotonic: the first heartbeat prunes

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Register this daemon, clean up after its previous life, start the heartbeat."""
        # A run this daemon id left running belongs to a process that no longer exists.
        failed = self.runs.fail_owner(self.id, f"daemon {self.id} restarted while the run was in flight")
        self.leases.drop_owner(self.id)
        if not self.shared:
            # SQLite: one daemon per database, so whatever is still `running` is dead.
            with orm.db_session:
                failed += self.store.db.execute(
                    "UPDATE agent_runs SET status = 'failed', ended_at = $now, reserve_usd = 0, "
                    "error = 'the daemon stopped while the run was in flight' WHERE status = 'running'",
                    {"now": time.time()}).rowcount
                self.store.db.execute("DELETE FROM cluster_leases")
        if failed:
            log.warning("marked %d run(s) left running by a previous daemon failed", failed)
        self.members.beat(started=True)
        self._thread = threading.Thread(target=self._heartbeat, name="agentd-cluster", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the heartbeat and hand every lease back at once (others take over now)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.held.release_all()
        try:
            self.members.leave()
        except Exception:  # noqa: BLE001
            pass

    # -- runs (agentd/cluster/run_leases.py) -------------------------------------------
    def run(self, handle: Any, cancel: threading.Event, lock_timeout: float | None,
            body: Callable[..., Any], *, completes: bool = False, session_id: str = "", key_id: str = "") -> Any:
        return self.run_leases.run(handle, cancel, lock_timeout, body, completes=completes, session_id=session_id,
                                   key_id=key_id)

    def list_runs(self, agent_id: str | None = None, status: str | None = None,
                  limit: int = 100) -> list[dict[str, Any]]:
        return self.run_leases.list_runs(agent_id, status, limit)

    def running_elsewhere(self, session_id: str) -> str | None:
        return self.run_leases.running_elsewhere(session_id)

    def check_stream(self, handle: Any) -> None:
        self.run_leases.check_stream(handle)

    def request_stop(self, agent_id: str) -> int:
        return self.run_leases.request_stop(agent_id)

    # -- other leases (channel leaders: agentd/cluster/held_leases.py) -----------------
    def claim(self, name: str) -> bool:
        return self.held.claim(name)

    def holds(self, name: str) -> bool:
        return self.held.holds(name)

    def release(self, name: str) -> None:
        self.held.release(name)

    def holder(self, name: str) -> str | None:
        return self.held.holder(name)

    # -- members (agentd/cluster/members.py) -------------------------------------------
    def daemons(self) -> list[dict[str, Any]]:
        return self.members.daemons()

    def member_url(self, daemon_id: str) -> str | None:
        return self.members.member_url(daemon_id)

    def peer_secret(self) -> bytes:
        return self.members.peer_secret()

    # -- heartbeat ---------------------------------------------------------------------
    def _heartbeat(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_secs):
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - a database hiccup must not end the heartbeat
                log_failure(log, exc, "cluster heartbeat failed")

    def tick(self) -> None:
        """One heartbeat (also called directly by tests)."""
        self.members.beat()
        OUTAGE.cleared(wrote=True)
        self.run_leases.close_unclosed()
        self.run_leases.renew()
        self.held.renew()
        self._reap()
        self.run_leases.apply_stop_requests()
        for hook in list(self.on_tick):
            hook()
        if time.monotonic() - self._last_prune > PRUNE_EVERY_SECS:
            self._last_prune = time.monotonic()
            self._prune()

    def _reap(self) -> None:
        """Fail the runs (and workflow runs) of daemons that stopped renewing their leases."""
        for run_id, agent_id, daemon in self.runs.reap(self.settings.lease_secs):
            log.warning("run %s of agent %s failed: daemon %s stopped renewing its lease", run_id, agent_id, daemon)
            self._cancel_approvals_of(daemon)
            self._audit("agent.run_failed", agent_id, {"run_id": run_id, "daemon_id": daemon})
        for run_id, daemon, error in self.runs.reap_workflow_runs(self.id, self.settings.lease_secs):
            log.warning("workflow run %s failed: daemon %s stopped while it was in progress", run_id, daemon)
            self._audit("workflow.run_failed", run_id, {"daemon_id": daemon, "error": error})

    def _prune(self) -> None:
        self.runs.prune(time.time() - RUN_RETENTION_SECS)
        with orm.db_session:
            self.members.prune()
            # Approvals decided for runs that died with their daemon (others delete their own).
            self.store.db.execute("DELETE FROM cluster_approvals WHERE decided_at < $t",
                                  {"t": time.time() - DECIDED_RETENTION_SECS})

    def _audit(self, event: str, subject: str, detail: dict[str, Any]) -> None:
        if self.audit is not None:
            self.audit(event, subject, detail)

    def _cancel_approvals_of(self, daemon: str) -> None:
        with orm.db_session:
            self.store.db.execute("UPDATE cluster_approvals SET decision = 'cancelled', decided_at = $now "
                                  "WHERE daemon_id = $d AND decision IS NULL", {"now": time.time(), "d": daemon})

    # -- views -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """GET /api/cluster."""
        return {"daemon_id": self.id, "shared_database": self.shared, "lease_secs": self.settings.lease_secs,
                "runs_here": self.run_leases.count(), "leases_held": self.held.names(), "daemons": self.daemons()}
