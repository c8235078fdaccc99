"""The workflow engine: definitions, runs and their bookkeeping, recovery.

The caller's thread drives a run (POST /run blocks until it ends), or a thread of its own
does (`start`: the caller follows the run's step events and may cancel it); the steps are executed
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
from agentd.errors import AgentdError, BadRequest, Conflict, NotFound
from agentd.jsonsafe import NUL_MESSAGE, holds_nul
from agentd.store import Store
from agentd.workflows.definition import parse_workflow
from agentd.workflows.steps import BACKOFF_BASE, RunState, StepRunner, resolve
from agentd.workflows.store import WorkflowStore

log = logging.getLogger("agentd.workflows")

CANCEL_WAIT_SECS = 5.0
INTERRUPTED = ("interrupted: the daemon stopped while this run was in progress "
               "(marked failed when the daemon restarted)")


class WorkflowEngine:
    """Create, list and run workflows; the kernel owns one."""

    def __init__(self, store: Store, agents: AgentRegistry, runs: Runs, executor: concurrent.futures.Executor,
                 backoff_base: float = BACKOFF_BASE, daemon_id: str | None = None,
                 shared: bool = False, on_finish: Callable[[dict[str, Any], dict[str, Any], str], None] | None = None
                 ) -> None:
        """`daemon_id` is this daemon's cluster id (recorded as each run's owner); `shared`
        says other daemons use the same database (PostgreSQL), whose runs are not ours;
        `on_finish(workflow, result, key_id)` hears of every run that ended (`key_id`: the scoped
        API key that started it, "": the admin's)."""
        self.db = WorkflowStore(store)
        self.on_finish = on_finish
        self.agents = agents
        self.daemon_id = daemon_id
        self.shared = shared
        self._active: dict[str, RunState] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        # Notified whenever a run starts a step, records results or ends (see `wait_change`).
        self._changed = threading.Condition()
        self.steps = StepRunner(agents, runs, executor, self._save_progress, self._closing, backoff_base,
                                on_progress=self._notify)

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

    def _exists(self, sees: Callable[[AgentHandle], bool] | None) -> Callable[[dict[str, str]], bool]:
        """Whether a step's agent exists for someone who `sees` only some agents."""
        def exists(ref: dict[str, str]) -> bool:
            handle = self.resolve(ref)
            return handle is not None and (sees is None or sees(handle))
        return exists

    def create(self, body: Any, sees: Callable[[AgentHandle], bool] | None = None) -> str:
        """`sees`: the agents the creator may reach (a step on another is one on no agent)."""
        definition = parse_workflow(body, self._exists(sees))
        workflow_id = self.db.create(definition)
        log.info("created workflow %s (%s) with %d step(s)", definition.name, workflow_id,
                 len(definition.steps))
        return workflow_id

    def update(self, workflow_id: str, body: Any, sees: Callable[[AgentHandle], bool] | None = None) -> None:
        key = parse_uuid(workflow_id, "workflow")
        definition = parse_workflow(body, self._exists(sees))
        if not self.db.update(key, definition):
            raise NotFound("workflow not found")

    def delete(self, workflow_id: str) -> None:
        key = parse_uuid(workflow_id, "workflow")
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

    def run_cost(self, run_id: str) -> float | None:
        """What a run's steps cost in USD (None: no step reported a cost, or no such run)."""
        run = self.db.run(run_id) or {}
        costs = [step["cost_usd"] for step in run.get("step_results", []) if step.get("cost_usd") is not None]
        return sum(costs) if costs else None

    # -- running ------------------------------------------------------------------------
    def run(self, workflow_id: str, text: str, key_id: str = "") -> dict[str, Any]:
        """Run to the end in the calling thread; `{run_id, output, status[, error]}`. `key_id`:
        the scoped API key that pays for the steps (its budget applies to each)."""
        workflow, run = self._begin(workflow_id, text, key_id)
        return self._drive(workflow, run, self.db.start_run(run.run_id))

    def start(self, workflow_id: str, text: str, key_id: str = "") -> dict[str, Any]:
        """Start a run on a thread of its own and answer at once: `{run_id, status}`."""
        workflow, run = self._begin(workflow_id, text, key_id)
        started = self.db.start_run(run.run_id)
        thread = threading.Thread(target=self._drive, args=(workflow, run, started), daemon=True,
                                  name=f"agentd-wf-{run.run_id[:8]}")
        thread.start()
        return {"run_id": run.run_id, "status": "running" if started else "failed"}

    def cancel(self, run_id: str) -> dict[str, Any]:
        """Stop a run this daemon drives; waits briefly for it to end and answers its record."""
        key = parse_uuid(run_id, "run")
        with self._lock:
            run = self._active.get(key)
        if run is None:
            record = self.run_detail(key)
            status = record["state"]["status"]
            if status in ("pending", "running"):
                raise Conflict(f"workflow run {key} is driven by daemon {record['daemon_id']}; cancel it there")
            raise Conflict(f"workflow run {key} is not in progress (it {status})")
        run.cancel.set()
        # Steps notice within a poll interval; an agent run stops at its next cancellation point.
        run.finished.wait(CANCEL_WAIT_SECS)
        return self.run_detail(key)

    def progress(self, run_id: str) -> tuple[dict[str, Any], list[int]]:
        """A run's record and the indexes of the steps in progress (known only where it runs)."""
        record = self.run_detail(run_id)
        with self._lock:
            run = self._active.get(record["id"])
        return record, list(run.running) if run is not None else []

    def wait_change(self, timeout: float) -> None:
        """Sleep until some run makes progress, or `timeout` seconds."""
        with self._changed:
            self._changed.wait(timeout)

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _save_progress(self, run_id: str, step_results: list[dict[str, Any]], steps_completed: int) -> bool:
        saved = self.db.save_progress(run_id, step_results, steps_completed)
        self._notify()
        return saved

    def _begin(self, workflow_id: str, text: str, key_id: str = "") -> tuple[dict[str, Any], RunState]:
        if self._closing.is_set():
            raise AgentdError("the daemon is shutting down", status=503)
        if holds_nul(text):
            raise BadRequest(f"input {NUL_MESSAGE}")
        workflow = self.get(workflow_id)
        run = RunState(run_id=self.db.create_run(workflow, text, self.daemon_id), workflow=workflow,
                       current=text, key_id=key_id)
        with self._lock:
            self._active[run.run_id] = run
        return workflow, run

    def _drive(self, workflow: dict[str, Any], run: RunState, started: bool) -> dict[str, Any]:
        try:
            error: str | None = "the run was failed before it started"  # by another daemon
            if started:
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
            run.finished.set()
            self._notify()
        body: dict[str, Any] = {"run_id": run.run_id, "output": output, "status": status}
        if error:
            body["error"] = error
        if self.on_finish is not None:
            self.on_finish(workflow, body, run.key_id)
        return body
