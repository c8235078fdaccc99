"""Leases and run records in the shared database: what lets N daemons act like one.

A *lease* is a named row (`run:<session id>`, `channel:<adapter>`) with an owner (a
daemon id), a token and an expiry. Taking one is a single atomic statement (an upsert
that only overwrites an expired row), so two daemons can never both hold it; the owner
renews it while it works and deletes it when done. A daemon that dies stops renewing,
and after `lease_secs` any other daemon may take the name over.

A *run record* (`agent_runs`) is one agent run: which daemon runs it, its status
(`running`, `completed`, `failed`, `cancelled`) and its own lease expiry, renewed by
the owner's heartbeat. A surviving daemon marks a run whose lease expired `failed`, so
no run stays `running` after its daemon is gone.

Workflow runs (`workflow_runs`, a Pony entity) name the daemon driving them; the reaper
fails those whose daemon's own lease (its `cluster_daemons` heartbeat) expired.

The tables are plain SQL valid on SQLite and PostgreSQL alike (`INSERT ... ON CONFLICT`),
created by the versioned schema migrations (agentd/store/migrate.py, schema 3). Times are
Unix seconds (floats) from each daemon's clock: daemons sharing a database need
synchronised clocks (NTP).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pony import orm

from agentd.store import Store
from agentd.store.outage import OUTAGE
from agentd.store.writer import Tx

RUN_STATUSES = ("running", "completed", "failed", "cancelled")


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for `pg_advisory_xact_lock` from a name."""
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "big", signed=True)


def global_lock(store: Store, name: str) -> None:
    """Inside a db_session: hold a database-wide lock named `name` until it commits.

    PostgreSQL: a transaction-level advisory lock. SQLite: the write transaction that
    Pony opens for a raw statement already excludes every other writer."""
    if store.shared:
        store.db.execute("SELECT pg_advisory_xact_lock($k)", {"k": lock_key(name)})
    else:
        store.db.execute("UPDATE cluster_leases SET owner = owner WHERE 1 = 0")


def relaxed_commit(store: Store) -> None:
    """Inside a db_session on PostgreSQL: do not wait for this transaction's WAL flush.

    Leases and run records are coordination state, renewed every heartbeat: if the server
    crashed right after the commit, the worst case is a lease that expires anyway. Waiting for
    the disk would add a flush (tens of ms on a busy disk) to every run, twice."""
    if store.shared:
        store.db.execute("SET LOCAL synchronous_commit TO OFF")


def _execute(store: Store, tx: Tx | None, sql: str, params: dict[str, Any]) -> int:
    """One statement in `tx`, or in a db_session of its own; the rows it changed."""
    if tx is not None:
        return tx.execute(sql, params)
    with orm.db_session:
        return store.db.execute(sql, params).rowcount


@dataclass
class Lease:
    name: str
    token: str


class Leases:
    """Named leases owned by one daemon (`owner`)."""

    def __init__(self, store: Store, owner: str) -> None:
        self.store = store
        self.owner = owner

    def take(self, name: str, secs: float) -> Lease | None:
        """Inside a db_session: take `name` when free or expired; None when someone holds it.

        Just after a database outage, a lease that ran out during it is still held
        (`Outage.lease_cutoff`)."""
        now = time.time()
        token = uuid.uuid4().hex
        cursor = self.store.db.execute(
            "INSERT INTO cluster_leases (name, owner, token, expires_at) VALUES ($n, $o, $t, $x) "
            "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = excluded.token, "
            "expires_at = excluded.expires_at WHERE cluster_leases.expires_at < $cutoff",
            {"n": name, "o": self.owner, "t": token, "x": now + secs, "cutoff": OUTAGE.lease_cutoff(now, secs)})
        return Lease(name, token) if cursor.rowcount == 1 else None

    def acquire(self, name: str, secs: float) -> Lease | None:
        """take() in its own transaction."""
        with orm.db_session:
            return self.take(name, secs)

    def renew(self, lease: Lease, secs: float) -> bool:
        """Push the expiry out; False when the lease was lost (expired and taken over)."""
        with orm.db_session:
            cursor = self.store.db.execute(
                "UPDATE cluster_leases SET expires_at = $x WHERE name = $n AND token = $t",
                {"x": time.time() + secs, "n": lease.name, "t": lease.token})
            return cursor.rowcount == 1

    def release(self, lease: Lease, tx: Tx | None = None) -> None:
        """Give `lease` up (in the write transaction `tx`, else in a transaction of its own)."""
        _execute(self.store, tx, "DELETE FROM cluster_leases WHERE name = $n AND token = $t",
                 {"n": lease.name, "t": lease.token})

    def holder(self, name: str) -> str | None:
        """The daemon holding an unexpired lease on `name`, or None."""
        with orm.db_session:
            rows = self.store.db.select(
                "SELECT owner FROM cluster_leases WHERE name = $n AND expires_at >= $now",
                {"n": name, "now": time.time()})
        return rows[0] if rows else None

    def drop_owner(self, owner: str) -> int:
        """Delete every lease of a daemon known to be gone (this one's previous life)."""
        with orm.db_session:
            return self.store.db.execute("DELETE FROM cluster_leases WHERE owner = $o", {"o": owner}).rowcount


class RunLog:
    """The `agent_runs` records."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def start(self, run_id: str, agent_id: str, session_id: str, daemon_id: str, lease_expires: float,
              reserve_usd: float = 0.0, key_id: str | None = None) -> None:
        """Inside a db_session (the one that took the run's lease); `key_id`: the scoped API
        key paying for the run, whose budget counts its reservation."""
        self.store.db.execute(
            "INSERT INTO agent_runs (id, agent_id, session_id, daemon_id, status, started_at, lease_expires, "
            "reserve_usd, key_id) VALUES ($i, $a, $s, $d, 'running', $now, $x, $r, $k)",
            {"i": run_id, "a": agent_id, "s": session_id, "d": daemon_id, "now": time.time(),
             "x": lease_expires, "r": reserve_usd, "k": key_id})

    def record(self, run_id: str, agent_id: str, session_id: str, daemon_id: str, started_at: float,
               status: str, error: str | None = None, cost_usd: float | None = None,
               tx: Tx | None = None) -> bool:
        """A run's whole record, written when it ended (Cluster's deferred runs); False when
        it was written already (a second close after a committed first one). In the write
        transaction `tx`, else in a transaction of its own."""
        return _execute(
            self.store, tx,
            "INSERT INTO agent_runs (id, agent_id, session_id, daemon_id, status, started_at, ended_at, "
            "lease_expires, error, cost_usd, reserve_usd) VALUES ($i, $a, $s, $d, $st, $t, $now, $now, $e, $c, 0) "
            "ON CONFLICT (id) DO NOTHING",
            {"i": run_id, "a": agent_id, "s": session_id, "d": daemon_id, "st": status, "t": started_at,
             "now": time.time(), "e": error, "c": cost_usd}) == 1

    def finish(self, run_id: str, status: str, error: str | None = None, cost_usd: float | None = None,
               tx: Tx | None = None) -> bool:
        """Close a run; False when someone else already closed it (it was reaped)."""
        return _execute(
            self.store, tx,
            "UPDATE agent_runs SET status = $st, ended_at = $now, error = $e, cost_usd = $c, reserve_usd = 0 "
            "WHERE id = $i AND status = 'running'",
            {"st": status, "now": time.time(), "e": error, "c": cost_usd, "i": run_id}) == 1

    def renew(self, daemon_id: str, run_ids: list[str], lease_expires: float) -> set[str]:
        """Extend the lease of this daemon's runs; returns the ids no longer running here."""
        if not run_ids:
            return set()
        with orm.db_session:
            params: dict[str, Any] = {"x": lease_expires, "d": daemon_id}
            names = _in_list(params, run_ids)
            self.store.db.execute(f"UPDATE agent_runs SET lease_expires = $x WHERE daemon_id = $d "
                                  f"AND status = 'running' AND id IN ({names})", params)
            alive = set(self.store.db.select(f"SELECT id FROM agent_runs WHERE daemon_id = $d "
                                             f"AND status = 'running' AND id IN ({names})", params))
        return set(run_ids) - alive

    def reap(self, lease_secs: float, now: float | None = None,
             session_id: str | None = None) -> list[tuple[str, str, str]]:
        """Mark runs whose lease (of `lease_secs`) expired `failed`: [(run_id, agent_id, daemon_id)].

        Inside or outside a db_session; with `session_id` only that session's runs. Just
        after a database outage, a lease that ran out during it has not expired
        (`Outage.lease_cutoff`)."""
        now = time.time() if now is None else now
        params: dict[str, Any] = {"now": now, "cutoff": OUTAGE.lease_cutoff(now, lease_secs)}
        where = "status = 'running' AND lease_expires < $cutoff"
        if session_id is not None:
            where += " AND session_id = $s"
            params["s"] = session_id
        with orm.db_session:
            rows = self.store.db.select(f"SELECT id, agent_id, daemon_id FROM agent_runs WHERE {where}", params)
            for run_id, _agent, daemon in rows:
                self.store.db.execute(
                    "UPDATE agent_runs SET status = 'failed', ended_at = $now, reserve_usd = 0, "
                    "error = $e WHERE id = $i AND status = 'running'",
                    {"now": now, "i": run_id,
                     "e": f"daemon {daemon} stopped renewing the run's lease (it died or lost the database)"})
        return [tuple(r) for r in rows]  # type: ignore[misc]

    def reap_workflow_runs(self, self_id: str, lease_secs: float) -> list[tuple[str, str, str]]:
        """Fail the pending/running workflow runs of daemons whose lease expired (no heartbeat
        for `lease_secs`, or no daemon row at all; just after a database outage, not for
        a heartbeat that ran out during it): [(run_id, daemon_id, error)].

        Runs of this daemon (`self_id`) and runs without an owner are not touched: this
        daemon's are alive, ownerless ones are failed by the next daemon start. The steps
        in flight are agent runs with records of their own, failed by `reap`."""
        now = time.time()
        runs = self.store.e.WorkflowRunRow
        reaped: list[tuple[str, str, str]] = []
        with orm.db_session(optimistic=False):
            live = set(self.store.db.select("SELECT id FROM cluster_daemons WHERE heartbeat_at >= $t",
                                            {"t": OUTAGE.lease_cutoff(now, lease_secs) - lease_secs}))
            candidates = orm.select((r.id, r.daemon_id) for r in runs if r.status in ("pending", "running")
                                    and r.daemon_id is not None and r.daemon_id != self_id)[:]
            ended = datetime.fromtimestamp(now, timezone.utc)
            for run_id, owner in candidates:
                if owner in live:
                    continue  # the common case: nothing locked, nothing written
                # Row-locked: the owner's own last write (finish_run) waits, then sees it failed.
                row = runs.get_for_update(id=run_id)
                if row is None or row.status not in ("pending", "running"):
                    continue
                error = (f"daemon {owner} stopped while the run was in progress "
                         f"(its lease expired; marked failed by daemon {self_id})")
                row.status, row.error, row.completed_at = "failed", error, ended
                row.output = row.output or ""
                if row.started_at is None:
                    row.started_at = ended
                reaped.append((run_id, owner, error))
        return reaped

    def fail_owner(self, daemon_id: str, reason: str) -> int:
        """Fail every run a daemon left running (the same daemon id starting again)."""
        with orm.db_session:
            return self.store.db.execute(
                "UPDATE agent_runs SET status = 'failed', ended_at = $now, reserve_usd = 0, error = $e "
                "WHERE daemon_id = $d AND status = 'running'",
                {"now": time.time(), "e": reason, "d": daemon_id}).rowcount

    def request_stop(self, agent_id: str, except_daemon: str) -> int:
        """Ask the daemons running this agent (other than `except_daemon`) to stop it."""
        with orm.db_session:
            return self.store.db.execute(
                "UPDATE agent_runs SET stop_requested = 1 WHERE agent_id = $a AND status = 'running' "
                "AND daemon_id <> $d", {"a": agent_id, "d": except_daemon}).rowcount

    def stop_requests(self, daemon_id: str) -> list[str]:
        with orm.db_session:
            return list(self.store.db.select(
                "SELECT id FROM agent_runs WHERE daemon_id = $d AND status = 'running' AND stop_requested = 1",
                {"d": daemon_id}))

    def list(self, agent_id: str | None = None, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Newest first."""
        return [self.view(r) for r in self.list_rows(agent_id, status, limit)]

    def list_rows(self, agent_id: str | None = None, status: str | None = None, limit: int = 100) -> list[tuple]:
        """Newest first, as (id, agent_id, session_id, daemon_id, status, started_at, ended_at,
        error, cost_usd) tuples."""
        clauses, params = [], {"lim": int(limit)}
        if agent_id:
            clauses.append("agent_id = $a")
            params["a"] = agent_id
        if status:
            clauses.append("status = $st")
            params["st"] = status
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with orm.db_session:
            rows = self.store.db.select(
                "SELECT id, agent_id, session_id, daemon_id, status, started_at, ended_at, error, cost_usd "
                f"FROM agent_runs {where} ORDER BY started_at DESC LIMIT $lim", params)
        return [tuple(r) for r in rows]

    @staticmethod
    def view(r: tuple) -> dict[str, Any]:
        """One list_rows() tuple as the API shows it."""
        return {"id": r[0], "agent_id": r[1], "session_id": r[2], "daemon_id": r[3], "status": r[4],
                "started_at": _iso(r[5]), "ended_at": _iso(r[6]), "error": r[7], "cost_usd": r[8]}

    def prune(self, older_than: float) -> int:
        """Forget finished runs that ended before `older_than` (retention)."""
        with orm.db_session:
            return self.store.db.execute("DELETE FROM agent_runs WHERE status <> 'running' AND ended_at < $t",
                                         {"t": older_than}).rowcount


def _in_list(params: dict[str, Any], values: list[str]) -> str:
    params.update({f"v{n}": v for n, v in enumerate(values)})
    return ", ".join(f"$v{n}" for n in range(len(values)))


def _iso(value: float | None) -> str | None:
    if value is None:
        return None
    return datetime.fromtimestamp(float(value), timezone.utc).isoformat().replace("+00:00", "Z")


__all__ = ["Lease", "Leases", "RunLog", "global_lock", "lock_key"]
