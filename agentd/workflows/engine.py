"""The workflow engine: definitions, runs and their bookkeeping, recovery.

The caller's thread drives a run (POST /run blocks until it ends); the steps are executed
by agentd/workflows/steps.py. Every run record names the daemon that drives it
(`workflow_runs.daemon_id`), so several daemons on one database each recover only their own
runs at start, and the cluster's reaper (agentd/store/leases.py) fails the runs of a daemon
whose lease expired.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any, Callable

from agentd.agents.manager import AgentHandle, parse_uuid
from agentd.agents.registry import AgentRegistry
from agentd.agents.runs import Runs
from agentd.errors import AgentdError, Conflict, NotFound
from agentd.store import Store
from agentd.workflows.definition import parse_workflow
from agentd.workflows.steps import BACKOFF_BASE, RunState, StepRunner, resolve
from agentd.workflows.store import WorkflowStore

log = logging.getLogger("agentd.workflows")

INTERRUPTED = ("interrupted: the daemon stopped while this run was in progress "
               "(marked failed when the daemon restarted)")


class WorkflowEngine:
    """Create, list and run workflows; the kernel owns one."""

    def __init__(self, store: Store, agents: AgentRegistry, runs: Runs, executor: concurrent.futures.Executor,
                 backoff_base: float = BACKOFF_BASE, daemon_id: str | None = None,
                 shared: bool = False, on_finish: Callable[[dict[str, Any], dict[str, Any]], None] | None = None
                 ) -> None:
        """`daemon_id` is this daemon's cluster id (recorded as each run's owner); `shared`
        says other daemons use the same database (PostgreSQL), whose runs are not ours;
        `on_finish(workflow, result)` hears of every run that ended."""
        self.db = WorkflowStore(store)
        self.on_finish = on_finish
        self.agents = agents
        self.daemon_id = daemon_id
        self.shared = shared
        self._active: dict[str, RunState] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.steps = StepRunner(agents, runs, executor, self.db.save_progress, self._closing, backoff_base)

    # -- lifecycle ----------------------------------------------------------------
    def recover(self) -> int:
        """At startup: fail the runs this daemon left running (its previous process is gone).

        On a database of its own (SQLite) that is every active run, whatever daemon id
        recorded it (the default id follows the port). On a shared database only the runs
        recorded under this daemon's id, and those recorded before runs had owners: the
        others belong to live daemons (a dead one's runs are the reaper's)."""
        owners = (self.daemon_id,) if self.shared else None
        count = self.db.fail_interrupted(INTERRUPTED, owners)
        if count:
            log.warning("marked %d interrupted workflow run(s) failed", count)
        return count

    def close(self) -> None:
        """Stop every run in progress (each ends `failed`, saying the daemon is stopping)."""
        self._closing.set()
        with self._lock:
            runs = list(self._active.values())
        for run in runs:
            run.cancel.set()
        self.steps.close()

    # -- definitions ----------------------------------------------------------------
    def resolve(self, ref: dict[str, str] | None) -> AgentHandle | None:
        """The live agent a step refers to (by id or exact name), or None."""
        return resolve(self.agents, ref)

    def create(self, body: Any) -> str:
        definition = parse_workflow(body, lambda ref: self.resolve(ref) is not None)
        workflow_id = self.db.create(definition)
        log.info("created workflow %s (%s) with %d step(s)", definition.name, workflow_id,
                 len(definition.steps))
        return workflow_id

    def update(self, workflow_id: str, body: Any) -> None:
        key = parse_uuid(workflow_id, "workflow")
        definition = parse_workflow(body, lambda ref: self.resolve(ref) is not None)
        if not self.db.update(key, definition):
            raise NotFound("workflow not found")

    def delete(self, workflow_id: str) -> None:
        key = parse_uuid(workflow_id, "workflow")
        active = self.db.active_run_count(key)
        if active:
            raise Conflict(f"workflow has {active} run(s) in progress; delete it when they end")
        if not self.db.delete(key):
            raise NotFound("workflow not found")

    def get(self, workflow_id: str) -> dict[str, Any]:
        workflow = self.db.get(parse_uuid(workflow_id, "workflow"))
        if workflow is None:
            raise NotFound("workflow not found")
        return workflow

    def list(self) -> list[dict[str, Any]]:
        return self.db.list()

    def runs(self, workflow_id: str) -> list[dict[str, Any]]:
        workflow = self.get(workflow_id)
        return self.db.runs(workflow["id"])

    def recent_runs(self, limit: int = 10) -> list[dict[str, Any]]:
        """The newest runs across all workflows (the dashboard's overview)."""
        return self.db.recent_runs(limit)

    def run_detail(self, run_id: str) -> dict[str, Any]:
        run = self.db.run(parse_uuid(run_id, "run"))
        if run is None:
            raise NotFound("workflow run not found")
        return run

    # -- running ------------------------------------------------------------------------
    def run(self, workflow_id: str, text: str) -> dict[str, Any]:
        """Run to the end in the calling thread; `{run_id, output, status[, error]}`."""
        if self._closing.is_set():
            raise AgentdError("the daemon is shutting down", status=503)
        workflow = self.get(workflow_id)
        run = RunState(run_id=self.db.create_run(workflow, text, self.daemon_id), workflow=workflow,
                       current=text)
        with self._lock:
            self._active[run.run_id] = run
        try:
            error: str | None = "the run was failed before it started"  # by another daemon
            if self.db.start_run(run.run_id):
                try:
                    error = self.steps.drive(run)
                except Exception as exc:  # noqa: BLE001 - a run must never stay `running`
                    log.exception("workflow run %s crashed", run.run_id)
                    error = f"internal error: {exc}"
            status = "failed" if error else "completed"
            output = "" if error else run.current
            if not self.db.finish_run(run.run_id, status, output, error, run.results, run.steps_completed):
                # Another daemon failed the run meanwhile (it took this one for dead):
                # its record stands, and the caller sees what it says.
                final = self.db.run(run.run_id) or {}
                status, output = "failed", ""
                error = final.get("error") or "the run was failed by another daemon"
        finally:
            with self._lock:
                self._active.pop(run.run_id, None)
        body: dict[str, Any] = {"run_id": run.run_id, "output": output, "status": status}
        if error:
            body["error"] = error
        if self.on_finish is not None:
            self.on_finish(workflow, body)
        return body
