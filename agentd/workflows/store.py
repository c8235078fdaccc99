"""Persistence of workflows and their runs (Pony entities in agentd/store/db.py).

Run records are written when created, when they start, after every step result
and when they end, so a crash loses at most the step in flight. Retention keeps
at most `RUN_RETENTION` runs, evicting the oldest finished ones, never an active one.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

from pony import orm

from agentd.errors import Conflict, NotFound
from agentd.timestamps import iso, utcnow
from agentd.store import Store
from agentd.workflows.definition import WorkflowDef

RUN_RETENTION = 200
# Each run record has one writer (the thread driving the run), so Pony's optimistic
# checks add nothing.
_write = orm.db_session(optimistic=False)
ACTIVE = ("pending", "running")
FINISHED = ("completed", "failed")


class WorkflowStore:
    """CRUD for workflow definitions and run records."""

    def __init__(self, store: Store, retention: int = RUN_RETENTION) -> None:
        self.store = store
        self.retention = retention
        # Run creation + eviction must not interleave, or two creators could both
        # see 200 runs and each evict (or neither evict) the same oldest record.
        self._run_lock = threading.Lock()

    # -- workflows ------------------------------------------------------------
    def create(self, definition: WorkflowDef) -> str:
        workflow_id = str(uuid.uuid4())
        now = utcnow()
        with orm.db_session:
            self.store.e.WorkflowRow(id=workflow_id, name=definition.name, description=definition.description,
                                     steps=definition.steps, created_at=now, updated_at=now)
        return workflow_id

    def update(self, workflow_id: str, definition: WorkflowDef) -> bool:
        """Replace the definition; last writer wins (the row locked, not Pony's optimistic
        check, which fails a writer that raced another or the deletion)."""
        with _write:
            row = self.store.e.WorkflowRow.get_for_update(id=workflow_id)
            if row is None:
                return False
            row.name, row.description = definition.name, definition.description
            row.steps, row.updated_at = definition.steps, utcnow()
            return True

    def delete(self, workflow_id: str) -> bool:
        """Delete a workflow and its run records; Conflict while a run is in progress. The
        workflow's row is locked first, as a new run locks it first, so no run starts between
        the count and the deletion."""
        with _write:
            row = self.store.e.WorkflowRow.get_for_update(id=workflow_id)
            if row is None:
                return False
            active = self.active_run_count(workflow_id)
            if active:
                raise Conflict(f"workflow has {active} run(s) in progress; delete it when they end")
            orm.delete(r for r in self.store.e.WorkflowRunRow if r.workflow_id == workflow_id)
            row.delete()
            return True

    def get(self, workflow_id: str) -> dict[str, Any] | None:
        """The full definition (steps as plain dicts), or None."""
        with orm.db_session:
            row = self.store.e.WorkflowRow.get(id=workflow_id)
            if row is None:
                return None
            # Copy out of Pony's tracked Json wrapper: the engine reads steps from many threads.
            steps = json.loads(json.dumps(row.steps))
            return {"id": row.id, "name": row.name, "description": row.description,
                    "steps": steps, "created_at": iso(row.created_at), "updated_at": iso(row.updated_at)}

    def list(self) -> list[dict[str, Any]]:
        """List items, oldest first, with the step count instead of the steps."""
        with orm.db_session:
            rows = self.store.e.WorkflowRow.select().order_by(lambda w: w.created_at)
            return [{"id": r.id, "name": r.name, "description": r.description, "steps": len(r.steps),
                     "created_at": iso(r.created_at)} for r in rows]

    # -- runs -------------------------------------------------------------------
    def create_run(self, workflow: dict[str, Any], text: str, owner: str | None = None) -> str:
        """A new `pending` run driven by daemon `owner`; evicts the oldest finished runs
        above the retention limit."""
        run_id = str(uuid.uuid4())
        with self._run_lock, _write:
            if self.store.e.WorkflowRow.get_for_update(id=workflow["id"]) is None:
                raise NotFound("workflow not found")
            runs = self.store.e.WorkflowRunRow
            runs(id=run_id, workflow_id=workflow["id"], workflow_name=workflow["name"], status="pending",
                 input=text, created_at=utcnow(), daemon_id=owner)
            excess = orm.count(r for r in runs) - self.retention
            if excess > 0:
                oldest = orm.select(r for r in runs if r.status in FINISHED).order_by(
                    lambda r: r.created_at)[:excess]
                for row in oldest:
                    row.delete()
        return run_id

    def start_run(self, run_id: str) -> bool:
        """`pending` -> `running`; False when the run is not pending (e.g. already failed by
        another daemon's reaper), and then nothing is written."""
        with _write:
            row = self.store.e.WorkflowRunRow.get_for_update(id=run_id)
            if row is None or row.status != "pending":
                return False
            row.status, row.started_at = "running", utcnow()
            return True

    def save_progress(self, run_id: str, step_results: list[dict[str, Any]], steps_completed: int) -> bool:
        """Record the step results so far; False when the run is no longer active (another
        daemon failed it, or it is gone), and then nothing is written."""
        with _write:
            row = self.store.e.WorkflowRunRow.get_for_update(id=run_id)
            if row is None or row.status not in ACTIVE:
                return False
            row.step_results = json.dumps(step_results, ensure_ascii=False)
            row.steps_completed = steps_completed
            return True

    def finish_run(self, run_id: str, status: str, output: str, error: str | None,
                   step_results: list[dict[str, Any]], steps_completed: int) -> bool:
        """Close an active run; False (nothing written) when it is no longer active: the
        reaper of another daemon failed it first, and its record stands."""
        with _write:
            # Row-locked on PostgreSQL, so a reaper's update and this one cannot interleave.
            row = self.store.e.WorkflowRunRow.get_for_update(id=run_id)
            if row is None or row.status not in ACTIVE:
                return False
            row.status, row.output, row.error = status, output, error
            row.step_results = json.dumps(step_results, ensure_ascii=False)
            row.steps_completed = steps_completed
            row.completed_at = utcnow()
            if row.started_at is None:
                row.started_at = row.completed_at
            return True

    def active_run_count(self, workflow_id: str) -> int:
        with orm.db_session:
            return orm.count(r for r in self.store.e.WorkflowRunRow
                             if r.workflow_id == workflow_id and r.status in ACTIVE)

    def fail_interrupted(self, message: str, owners: tuple[str | None, ...] | None = None) -> int:
        """Mark pending/running runs failed (called once at startup); returns how many.

        `owners` None: every active run. Otherwise only the runs recorded under one of these
        daemon ids, and the runs that have no owner (recorded before runs had owners)."""
        now = utcnow()
        with _write:
            runs = self.store.e.WorkflowRunRow
            query = orm.select(r for r in runs if r.status in ACTIVE)
            rows = [r for r in query.for_update()
                    if owners is None or r.daemon_id is None or r.daemon_id in owners]
            for row in rows:
                row.status, row.error, row.completed_at = "failed", message, now
                row.output = row.output or ""
                if row.started_at is None:
                    row.started_at = now
        return len(rows)

    @staticmethod
    def _item(row: Any) -> dict[str, Any]:
        return {"id": row.id, "workflow_id": row.workflow_id, "workflow_name": row.workflow_name,
                "state": {"status": row.status}, "steps_completed": row.steps_completed,
                "started_at": iso(row.started_at) if row.started_at else None,
                "completed_at": iso(row.completed_at) if row.completed_at else None,
                "error": row.error}

    def runs(self, workflow_id: str) -> list[dict[str, Any]]:
        """Run list items of one workflow, newest first."""
        with orm.db_session:
            rows = orm.select(r for r in self.store.e.WorkflowRunRow if r.workflow_id == workflow_id)
            return [self._item(r) for r in rows.order_by(lambda r: orm.desc(r.created_at))]

    def recent_runs(self, limit: int) -> list[dict[str, Any]]:
        """The newest run list items of every workflow."""
        with orm.db_session:
            rows = orm.select(r for r in self.store.e.WorkflowRunRow).order_by(lambda r: orm.desc(r.created_at))
            return [self._item(r) for r in rows[:limit]]

    def run(self, run_id: str) -> dict[str, Any] | None:
        """One run with its input, output and step results."""
        with orm.db_session:
            row = self.store.e.WorkflowRunRow.get(id=run_id)
            if row is None:
                return None
            item = self._item(row)
            item.update({"input": row.input, "output": row.output,
                         "created_at": iso(row.created_at), "daemon_id": row.daemon_id,
                         "step_results": json.loads(row.step_results or "[]")})
            return item

    def run_count(self) -> int:
        with orm.db_session:
            return orm.count(r for r in self.store.e.WorkflowRunRow)
