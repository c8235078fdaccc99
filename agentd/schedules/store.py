"""Cron jobs and their runs in the database (entities in agentd/store/entities.py).

The ticker's reads are two indexed queries (`next_due`): the earliest due time, and the
jobs due now. A daemon claims a due time with one conditional UPDATE that moves `next_due`
from the value it read to the next one; on several daemons sharing PostgreSQL exactly one
of them changes the row, and only that one runs the job.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone
from typing import Any

from pony import orm

from agentd.errors import Conflict, NotFound
from agentd.schedules.spec import iso_seconds
from agentd.store import Store

RUN_RETENTION = 200  # run records kept per job


class CronStore:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.e = store.e

    # -- jobs ------------------------------------------------------------------------
    def create(self, fields: dict[str, Any], max_per_agent: int) -> dict[str, Any]:
        """The new job; an agent's job is counted against `max_per_agent` with the agent's row
        locked, as its deletion locks it first, so creates at once never pass the cap together
        and none outlives the agent."""
        job_id = str(uuid.uuid4())
        with orm.db_session(optimistic=False):
            if fields["agent_id"]:
                if self.e.AgentRow.get_for_update(id=fields["agent_id"]) is None:
                    raise NotFound("agent not found")
                if self.count(fields["agent_id"]) >= max_per_agent:
                    raise Conflict(f"the agent has {max_per_agent} cron jobs already (max_jobs_per_agent)")
            self.e.CronJobRow(id=job_id, created_at=datetime.now(timezone.utc), **fields)
        job = self.get(job_id)
        if job is None:  # the agent was deleted since the commit, and its jobs with it
            raise NotFound("agent not found")
        return job

    def get(self, job_id: str) -> dict[str, Any] | None:
        with orm.db_session:
            row = self.e.CronJobRow.get(id=job_id)
            return None if row is None else _job(row)

    def list(self, agent_id: str | None = None) -> list[dict[str, Any]]:
        with orm.db_session:
            query = self.e.CronJobRow.select()
            if agent_id is not None:
                query = query.filter(lambda j: j.agent_id == agent_id)
            return [_job(r) for r in query.order_by(lambda j: (j.created_at, j.id))]

    def count(self, agent_id: str) -> int:
        with orm.db_session:
            return orm.count(j for j in self.e.CronJobRow if j.agent_id == agent_id)

    def update(self, job_id: str, **changes: Any) -> dict[str, Any] | None:
        with orm.db_session(optimistic=False):
            row = self.e.CronJobRow.get_for_update(id=job_id)
            if row is None:
                return None
            row.set(**changes)
            return _job(row)

    def delete(self, job_id: str) -> bool:
        """True for the one caller that deleted the job (of two at once, the other gets False)."""
        with orm.db_session:
            if self.store.db.execute("DELETE FROM cron_jobs WHERE id = $j", {"j": job_id}).rowcount != 1:
                return False
            self.store.db.execute("DELETE FROM cron_runs WHERE job_id = $j", {"j": job_id})
        return True

    def agent_jobs(self, agent_id: str) -> list[str]:
        with orm.db_session:
            return list(orm.select(j.id for j in self.e.CronJobRow if j.agent_id == agent_id))

    # -- the ticker --------------------------------------------------------------------
    def earliest(self) -> float | None:
        with orm.db_session:
            rows = self.store.db.select("SELECT MIN(next_due) FROM cron_jobs WHERE next_due IS NOT NULL")
        return rows[0] if rows and rows[0] is not None else None

    def due(self, now: float, limit: int = 200) -> list[tuple[str, float]]:
        with orm.db_session:
            rows = self.store.db.select("SELECT id, next_due FROM cron_jobs WHERE next_due <= $now "
                                        "ORDER BY next_due LIMIT $lim", {"now": now, "lim": limit})
        return [(r[0], r[1]) for r in rows]

    def claim(self, job_id: str, due: float, following: float | None) -> bool:
        """Move `next_due` from `due` to `following`; True for the one daemon that did."""
        with orm.db_session:
            return self.store.db.execute("UPDATE cron_jobs SET next_due = $n WHERE id = $i AND next_due = $d",
                                         {"n": following, "i": job_id, "d": due}).rowcount == 1

    def rewind_intervals(self, now: float) -> list[str]:
        """After the wall clock went back to `now`: interval jobs due more than one interval
        ahead become due one interval from now; the ids moved."""
        moved = []
        for job in self.list():
            schedule, due = job["schedule"], job["next_due"]
            if schedule.get("kind") == "every" and due is not None and due - now > schedule["every_secs"]:
                if self.claim(job["id"], due, now + schedule["every_secs"]):
                    moved.append(job["id"])
        return moved

    # -- runs --------------------------------------------------------------------------
    def running(self, job_id: str) -> bool:
        with orm.db_session:
            return bool(self.store.db.select("SELECT id FROM cron_runs WHERE job_id = $j AND status = 'running' "
                                             "LIMIT 1", {"j": job_id}))

    def start_run(self, job_id: str, daemon_id: str, due: float | None, reason: str) -> str | None:
        """A `running` run record, or None when the job has one running already. The job's
        row is locked first, so of two starts at once (run now beside the ticker, or two
        daemons) exactly one gets its run."""
        run_id = str(uuid.uuid4())
        with orm.db_session(optimistic=False):
            if self.e.CronJobRow.get_for_update(id=job_id) is None:
                return None
            if self.store.db.select("SELECT id FROM cron_runs WHERE job_id = $j AND status = 'running' LIMIT 1",
                                    {"j": job_id}):
                return None
            self.e.CronRunRow(id=run_id, job_id=job_id, daemon_id=daemon_id, due_at=due, started_at=time.time(),
                              finished_at=None, status="running", reason=reason, error=None)
        return run_id

    def add_run(self, job_id: str, daemon_id: str, due: float | None, status: str, reason: str = "",
                error: str | None = None) -> str:
        run_id = str(uuid.uuid4())
        now = time.time()
        with orm.db_session:
            self.e.CronRunRow(id=run_id, job_id=job_id, daemon_id=daemon_id, due_at=due, started_at=now,
                              finished_at=None if status == "running" else now, status=status, reason=reason,
                              error=error)
        if status != "running":
            self._last_run(job_id, run_id)
        return run_id

    def finish_run(self, run_id: str, status: str, output: str | None, error: str | None,
                   cost: float | None, delivery: dict[str, Any] | None, finished_at: float | None = None) -> None:
        """Close a run (at `finished_at`, Unix seconds; default now)."""
        # The job's last run changes in the same transaction: nobody reads the run finished
        # while its job still shows it running.
        with orm.db_session(optimistic=False):
            row = self.e.CronRunRow.get(id=run_id)
            if row is None:
                return
            if row.status == "running":  # not already failed by the reaper
                row.set(status=status, output=output, error=error, cost_usd=cost,
                        finished_at=time.time() if finished_at is None else finished_at)
            row.delivery = delivery
            self._set_last_run(row.job_id, row)

    def set_delivery(self, run_id: str, delivery: dict[str, Any]) -> None:
        """The run's delivery state, and the job's `last_run` while it is that run."""
        with orm.db_session(optimistic=False):
            row = self.e.CronRunRow.get(id=run_id)
            if row is None:
                return
            row.delivery = delivery
            job = self.e.CronJobRow.get(id=row.job_id)
            if job is not None and job.last_run and job.last_run.get("run_id") == run_id:
                job.last_run = {**job.last_run, "delivery": delivery}

    def unfinished_deliveries(self) -> list[tuple[str, str]]:
        """(run_id, daemon_id) of the runs whose delivery is `pending` or `retrying`."""
        with orm.db_session:
            return list(orm.select((r.id, r.daemon_id) for r in self.e.CronRunRow if r.status == "ok" and (
                r.delivery["status"] == "pending" or r.delivery["status"] == "retrying")))

    def take_run(self, run_id: str, owner: str, daemon_id: str) -> bool:
        """Move the run from daemon `owner` to `daemon_id`; True for the one daemon that did."""
        with orm.db_session:
            return self.store.db.execute("UPDATE cron_runs SET daemon_id = $d WHERE id = $i AND daemon_id = $o",
                                         {"d": daemon_id, "i": run_id, "o": owner}).rowcount == 1

    def _last_run(self, job_id: str, run_id: str) -> None:
        with orm.db_session(optimistic=False):
            run = self.e.CronRunRow.get(id=run_id)
            if run is not None:
                self._set_last_run(job_id, run)

    def _set_last_run(self, job_id: str, run: Any) -> None:
        """Inside a db_session: the job's `last_run` from `run`; older runs past the kept
        history dropped."""
        job = self.e.CronJobRow.get(id=job_id)
        if job is not None:
            job.last_run = {"run_id": run.id, "status": run.status, "started_at": iso_seconds(run.started_at),
                            "finished_at": iso_seconds(run.finished_at), "reason": run.reason or "",
                            "error": run.error, "delivery": None if run.delivery is None else dict(run.delivery)}
            self.store.db.execute(
                "DELETE FROM cron_runs WHERE job_id = $j AND id NOT IN (SELECT id FROM cron_runs WHERE job_id = $j "
                "ORDER BY started_at DESC LIMIT $n)", {"j": job_id, "n": RUN_RETENTION})

    def _whole(self, query: Any) -> Any:
        """`query` reading the output and error in the same query: they are lazy, and a second
        query for them finds nothing once a concurrent delete of the job removed the run."""
        runs = self.e.CronRunRow
        return query.prefetch(runs.output, runs.error)

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        with orm.db_session:
            found = self._whole(orm.select(r for r in self.e.CronRunRow if r.id == run_id))[:1]
            return _run(found[0]) if found else None

    def runs(self, job_id: str, limit: int = 100) -> list[dict[str, Any]]:
        with orm.db_session:
            rows = self._whole(self.e.CronRunRow.select(lambda r: r.job_id == job_id).order_by(
                lambda r: orm.desc(r.started_at)))[:limit]
            return [_run(r) for r in rows]

    def today(self, job_id: str, since: float) -> tuple[int, float]:
        """Runs (not skipped) since `since`, and what they cost."""
        with orm.db_session:
            rows = self.store.db.select(
                "SELECT COUNT(*), SUM(cost_usd) FROM cron_runs WHERE job_id = $j AND started_at >= $s "
                "AND status <> 'skipped'", {"j": job_id, "s": since})
        count, cost = rows[0]
        return int(count or 0), float(cost or 0.0)

    def fail_running(self, reason: str, daemon_id: str | None = None, except_live: set[str] | None = None,
                     ) -> list[tuple[str, str]]:
        """Mark running runs failed: those of `daemon_id`, or those whose daemon is not in
        `except_live`; [(run_id, job_id)]."""
        with orm.db_session(optimistic=False):
            rows = self.store.db.select("SELECT id, job_id, daemon_id FROM cron_runs WHERE status = 'running'")
            failed = []
            for run_id, job_id, owner in rows:
                if daemon_id is not None and owner != daemon_id:
                    continue
                if except_live is not None and owner in except_live:
                    continue
                self.store.db.execute("UPDATE cron_runs SET status = 'failed', error = $e, finished_at = $now "
                                      "WHERE id = $i AND status = 'running'",
                                      {"e": reason.format(daemon=owner), "now": time.time(), "i": run_id})
                failed.append((run_id, job_id))
        for run_id, job_id in failed:
            self._last_run(job_id, run_id)
        return failed


def _job(row: Any) -> dict[str, Any]:
    return {"id": row.id, "name": row.name, "agent_id": row.agent_id, "schedule": dict(row.schedule),
            "action": dict(row.action), "delivery": dict(row.delivery), "enabled": row.enabled,
            "one_shot": row.one_shot, "catch_up": row.catch_up, "max_runs_per_day": row.max_runs_per_day,
            "max_cost_usd_per_day": row.max_cost_usd_per_day, "next_due": row.next_due,
            "next_run_at": iso_seconds(row.next_due), "last_run": dict(row.last_run) if row.last_run else None,
            "paused_reason": row.paused_reason, "origin": row.origin, "failures": row.failures,
            "backoff_until": row.backoff_until, "key_id": row.key_id,
            "created_at": row.created_at.isoformat().replace("+00:00", "Z")}


def _run(row: Any) -> dict[str, Any]:
    return {"id": row.id, "job_id": row.job_id, "daemon_id": row.daemon_id, "due_at": iso_seconds(row.due_at),
            "started_at": iso_seconds(row.started_at), "finished_at": iso_seconds(row.finished_at),
            "status": row.status, "reason": row.reason or "", "cost_usd": row.cost_usd, "output": row.output,
            "error": row.error, "delivery": dict(row.delivery) if row.delivery else None}
