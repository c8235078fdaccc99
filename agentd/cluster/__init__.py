"""Several daemons on one database: run leases, the heartbeat, the reaper, leaders.

Every daemon has a `Cluster`, also a lone daemon on SQLite, where the same code runs
and never meets a competitor. What it does:

- **One run per session at a time across daemons.** A run first takes the lease
  `run:<session id>` (the agent's own session, or a channel conversation's), waiting
  while another daemon holds it, exactly as a run waits for the agent's local run lock;
  then it writes its run record (`agent_runs`), admitted by the budget gate. (A lone
  daemon with no budget limit has nothing to reserve and nobody to tell: it writes the
  record once, complete, in the transaction that saves the run's session.)
- **Heartbeat.** Every `lease_secs / 3` the daemon renews its leases and run records,
  marks runs whose lease expired `failed` (their daemon died), applies stop requests
  made on other daemons, keeps its agent registry in step with the database and lets
  standby channel adapters try to become leader.
- **Leaders.** A channel adapter runs only on the daemon holding `channel:<name>`.

Settings (`agentd/cluster/config.py`): `[cluster] daemon_id` (default `<hostname>:<port>`,
unique per daemon), `lease_secs` (default 10) and `advertise_url` (the URL the other daemons
reach this one at, recorded in `cluster_daemons`: webhooks are relayed there,
agentd/cluster/relay.py).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from pony import orm

from agentd import logs
from agentd.cluster.config import ClusterSettings
from agentd.errors import AgentdError, Conflict
from agentd.ids import time_ordered_uuid
from agentd.store import Store
from agentd.store.leases import Lease, Leases, RunLog, is_shared, relaxed_commit
from agentd.store.writer import PonyTx, Tx
from agentd.store.outage import OUTAGE, log_failure, translate

if TYPE_CHECKING:
    from agentd.cluster.budget_gate import BudgetGate

log = logging.getLogger("agentd.cluster")

WAIT_STEP = 0.05  # first poll interval while another daemon holds a run lease (doubles to WAIT_MAX)
WAIT_MAX = 0.5
RUN_RETENTION_SECS = 7 * 86400
PEER_SECRET = "cluster_peer_secret"  # the settings row holding the daemons' shared key


@dataclass
class LocalRun:
    """A run this daemon holds the lease of."""

    run_id: str
    agent_id: str
    lease: Lease
    cancel: threading.Event
    cost: list[float] = field(default_factory=list)
    closed: bool = False  # its record was closed in the caller's transaction (see Cluster.run)
    # A lone daemon's run with no budget to reserve against: its record is written once,
    # complete, when it ends (see Cluster._try_begin); until then it is listed from memory.
    deferred: bool = False
    session_id: str = ""
    started_at: float = 0.0


class Cluster:
    """Coordination of this daemon with the others on the same database."""

    def __init__(self, store: Store, settings: ClusterSettings, listen: str, shared: bool | None = None,
                 budget: BudgetGate | None = None, audit: Callable[[str, str, dict[str, Any]], None] | None = None,
                 leaving: threading.Event | None = None) -> None:
        self.store = store
        self.settings = settings
        self.id = settings.daemon_id
        self.listen = listen
        # Whether other daemons use this database (PostgreSQL). `shared=True` on SQLite lets
        # tests run two clusters on one file, which a daemon's lock on SQLite never allows.
        self.shared = is_shared(store) if shared is None else shared
        self.leases = Leases(store, self.id)
        self.runs = RunLog(store)
        # Admission of runs against the monthly budget (reservations on a shared database).
        self.budget = budget
        self.on_tick: list[Callable[[], None]] = []  # channel leaders, ... (called every heartbeat)
        # The kernel's audit trail (AuditLog.record): runs failed by the reaper are recorded there.
        self.audit = audit
        # Set when this daemon shuts down (the kernel's `stopping`): stopping its own agents
        # then must not ask other daemons to stop theirs.
        self.leaving = leaving or threading.Event()
        self._local: dict[str, LocalRun] = {}
        # A lone daemon's run leases live in memory: no other daemon can ask for them, and
        # writing a lease row twice per message is a transaction and a half of pure cost.
        self._sessions: set[str] = set()
        self._held: dict[str, Lease] = {}  # other leases (channels) renewed with the runs
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_prune = -3600.0  # monotonic: the first heartbeat prunes
        # Runs that ended while the database was out, closed by the next heartbeat.
        self._unclosed: list[tuple[LocalRun, str, str | None, float | None]] = []
        self._peer_secret: bytes | None = None

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
        self._beat_daemon(started=True)
        self._thread = threading.Thread(target=self._heartbeat, name="agentd-cluster", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the heartbeat and hand every lease back at once (others take over now)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            held = list(self._held.values())
            self._held.clear()
        for lease in held:
            try:
                self.leases.release(lease)
            except Exception:  # noqa: BLE001 - best effort on the way out
                log.debug("lease %s not released", lease.name)
        try:
            with orm.db_session:
                self.store.db.execute("DELETE FROM cluster_daemons WHERE id = $d", {"d": self.id})
        except Exception:  # noqa: BLE001
            pass

    # -- runs --------------------------------------------------------------------------
    def run(self, handle: Any, cancel: threading.Event, lock_timeout: float | None,
            body: Callable[..., Any], *, completes: bool = False, session_id: str = "") -> Any:
        """Run `body` holding the session's lease and a run record (see the module doc); the
        session is `session_id` (a channel conversation's), else the agent's own.

        With `completes`, `body` gets `complete(tx, cost)`: called in the write transaction
        `tx` that saves the run's session, it closes the record as completed in that same
        transaction (one commit per message, not two); a run that does not call it, or fails
        after it, is closed here after."""
        local = self._begin(handle, session_id or handle.session_id, cancel, lock_timeout)
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
                self._local.pop(local.run_id, None)
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

    def _begin(self, handle: Any, session_id: str, cancel: threading.Event, lock_timeout: float | None) -> LocalRun:
        from agentd.agents.loop import RunCancelled

        name = f"run:{session_id}"
        deadline = None if lock_timeout is None else time.monotonic() + lock_timeout
        step = WAIT_STEP
        while True:
            if cancel.is_set() or getattr(handle, "killed", False):
                raise RunCancelled("run cancelled before it started")
            local = self._try_begin(handle, session_id, name, cancel)
            if local is not None:
                return local
            if self._stop.is_set():
                raise AgentdError("the daemon is shutting down", status=503)
            if deadline is not None and time.monotonic() >= deadline:
                raise Conflict(f"agent {handle.name} is busy with another run")
            cancel.wait(step)
            step = min(WAIT_MAX, step * 2)

    def _try_begin(self, handle: Any, session_id: str, name: str, cancel: threading.Event) -> LocalRun | None:
        secs = self.settings.lease_secs
        run_id = str(time_ordered_uuid())
        if not self.shared:
            with self._lock:
                if name in self._sessions:
                    return None
                self._sessions.add(name)
            if self.budget is None or self.budget.metering.limit_usd <= 0:
                # Nothing to reserve and no other daemon to tell: the record is written with
                # the run's end, in the transaction that saves its session (one commit per
                # message). A daemon killed meanwhile leaves no record of the run, as it
                # leaves none of its messages.
                return self._start_in_memory(LocalRun(run_id, handle.id, Lease(name, ""), cancel, deferred=True,
                                                      session_id=session_id, started_at=time.time()))
        try:
            with orm.db_session:
                relaxed_commit(self.store)
                return self._start_record(handle, session_id, name, cancel, run_id, secs)
        except BaseException:
            self._sessions.discard(name)
            raise

    def _start_record(self, handle: Any, session_id: str, name: str, cancel: threading.Event, run_id: str,
                      secs: float) -> LocalRun | None:
        """Inside a db_session: take the run lease (shared database) and write the run record."""
        if self.shared:
            lease = self.leases.take(name, secs)
            if lease is None:
                return None
            # Taking an expired lease: the run that held it died with its daemon. (A lone
            # daemon on SQLite failed every leftover run when it started.)
            self.runs.reap(session_id=session_id)
        else:
            lease = Lease(name, "")  # held in self._sessions
        reserve = self.budget.admit(handle.id) if self.budget is not None else 0.0
        self.runs.start(run_id, handle.id, session_id, self.id, time.time() + secs, reserve)
        return self._start_in_memory(LocalRun(run_id, handle.id, lease, cancel))

    def _start_in_memory(self, local: LocalRun) -> LocalRun:
        with self._lock:
            self._local[local.run_id] = local
        return local

    def list_runs(self, agent_id: str | None = None, status: str | None = None,
                  limit: int = 100) -> list[dict[str, Any]]:
        """GET /api/cluster/runs: the records, newest first, with this daemon's runs whose
        record is written only when they end (shown `running` meanwhile)."""
        rows = self.runs.list_rows(agent_id, status, limit)
        if status in (None, "", "running"):
            with self._lock:
                pending = [(r.run_id, r.agent_id, r.session_id, self.id, "running", r.started_at, None, None, None)
                           for r in self._local.values()
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

    # -- other leases (channel leaders) ------------------------------------------------
    def claim(self, name: str) -> bool:
        """Take (or keep) a lease renewed by the heartbeat; True when this daemon holds it."""
        with self._lock:
            if name in self._held:
                return True
        lease = self.leases.acquire(name, self.settings.lease_secs)
        if lease is None:
            return False
        with self._lock:
            self._held[name] = lease
        return True

    def holds(self, name: str) -> bool:
        with self._lock:
            return name in self._held

    def release(self, name: str) -> None:
        with self._lock:
            lease = self._held.pop(name, None)
        if lease is not None:
            self.leases.release(lease)

    def holder(self, name: str) -> str | None:
        return self.leases.holder(name)

    # -- heartbeat ---------------------------------------------------------------------
    def _heartbeat(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_secs):
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - a database hiccup must not end the heartbeat
                log_failure(log, exc, "cluster heartbeat failed")

    def tick(self) -> None:
        """One heartbeat (also called directly by tests)."""
        secs = self.settings.lease_secs
        self._beat_daemon()
        OUTAGE.cleared(wrote=True)
        with self._lock:
            unclosed, self._unclosed = self._unclosed, []
        for i, (local, status, error, cost) in enumerate(unclosed):
            try:
                self._close_now(local, status, error, cost)
            except Exception:
                with self._lock:
                    self._unclosed[:0] = unclosed[i:]
                raise
        with self._lock:
            local = [run for run in self._local.values() if not run.closed and not run.deferred]
            held = list(self._held.items())
        for run in local:
            if self.shared and not self.leases.renew(run.lease, secs):
                log.warning("run %s lost its lease (this daemon was too slow); stopping it", run.run_id)
                run.cancel.set()
        lost = self.runs.renew(self.id, [r.run_id for r in local], time.time() + secs)
        for run in local:
            if run.run_id in lost:
                run.cancel.set()
        for name, lease in held:
            if not self.leases.renew(lease, secs):
                log.warning("lease %s lost", name)
                with self._lock:
                    self._held.pop(name, None)
        for run_id, agent_id, daemon in self.runs.reap():
            log.warning("run %s of agent %s failed: daemon %s stopped renewing its lease", run_id, agent_id, daemon)
            self._cancel_approvals_of(daemon)
            self._audit("agent.run_failed", agent_id, {"run_id": run_id, "daemon_id": daemon})
        for run_id, daemon, error in self.runs.reap_workflow_runs(self.id, secs):
            log.warning("workflow run %s failed: daemon %s stopped while it was in progress", run_id, daemon)
            self._audit("workflow.run_failed", run_id, {"daemon_id": daemon, "error": error})
        for run_id in self.runs.stop_requests(self.id):
            with self._lock:
                run = self._local.get(run_id)
            if run is not None and not run.cancel.is_set():
                log.info("run %s stopped on request of another daemon", run_id)
                run.cancel.set()
        for hook in list(self.on_tick):
            hook()
        if time.monotonic() - self._last_prune > 3600:
            self._last_prune = time.monotonic()
            self.runs.prune(time.time() - RUN_RETENTION_SECS)
            with orm.db_session:
                self.store.db.execute("DELETE FROM cluster_daemons WHERE heartbeat_at < $t",
                                      {"t": time.time() - 86400})
                # Approvals decided for runs that died with their daemon (others delete their own).
                self.store.db.execute("DELETE FROM cluster_approvals WHERE decided_at < $t",
                                      {"t": time.time() - 86400})

    def _audit(self, event: str, subject: str, detail: dict[str, Any]) -> None:
        if self.audit is not None:
            self.audit(event, subject, detail)

    def _beat_daemon(self, started: bool = False) -> None:
        now = time.time()
        with orm.db_session:
            self.store.db.execute(
                "INSERT INTO cluster_daemons (id, listen, pid, started_at, heartbeat_at, url) "
                "VALUES ($d, $l, $p, $now, $now, $u) "
                "ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at"
                + (", listen = excluded.listen, pid = excluded.pid, started_at = excluded.started_at, "
                   "url = excluded.url" if started else ""),
                {"d": self.id, "l": self.listen, "p": os.getpid(), "now": now, "u": self.settings.advertise_url})

    def _cancel_approvals_of(self, daemon: str) -> None:
        with orm.db_session:
            self.store.db.execute("UPDATE cluster_approvals SET decision = 'cancelled', decided_at = $now "
                                  "WHERE daemon_id = $d AND decision IS NULL", {"now": time.time(), "d": daemon})

    # -- views -------------------------------------------------------------------------
    def daemons(self) -> list[dict[str, Any]]:
        """Daemons that sent a heartbeat within the last lease period."""
        from agentd.store.leases import _iso

        with orm.db_session:
            rows = self.store.db.select("SELECT id, listen, pid, started_at, heartbeat_at, url FROM cluster_daemons "
                                        "WHERE heartbeat_at >= $t ORDER BY started_at",
                                        {"t": time.time() - self.settings.lease_secs})
        return [{"id": r[0], "listen": r[1], "url": r[5] or "", "pid": r[2], "started_at": _iso(r[3]),
                 "heartbeat_at": _iso(r[4]), "self": r[0] == self.id} for r in rows]

    def member_url(self, daemon_id: str) -> str | None:
        """The advertised URL of a live daemon (a heartbeat within one lease period), or None."""
        with orm.db_session:
            rows = self.store.db.select("SELECT url FROM cluster_daemons WHERE id = $d AND heartbeat_at >= $t",
                                        {"d": daemon_id, "t": time.time() - self.settings.lease_secs})
        return rows[0] if rows and rows[0] else None

    def peer_secret(self) -> bytes:
        """The key daemons sign their requests to each other with: random, made by the first
        daemon that needs it and kept in the database every member reads (never in a file
        or a log), so only a daemon of this cluster knows it."""
        if self._peer_secret is None:
            secret = self.store.get_setting(PEER_SECRET)
            if not secret:
                try:
                    with orm.db_session:
                        if self.store.e.Setting.get(key=PEER_SECRET) is None:
                            self.store.e.Setting(key=PEER_SECRET, value=secrets.token_hex(32))
                except (orm.TransactionIntegrityError, orm.CommitException):
                    pass  # another daemon made it meanwhile: read theirs
                secret = self.store.get_setting(PEER_SECRET)
            self._peer_secret = str(secret).encode("ascii")
        return self._peer_secret

    def status(self) -> dict[str, Any]:
        """GET /api/cluster."""
        with self._lock:
            running = len(self._local)
            held = sorted(self._held)
        return {"daemon_id": self.id, "shared_database": self.shared, "lease_secs": self.settings.lease_secs,
                "runs_here": running, "leases_held": held, "daemons": self.daemons()}
