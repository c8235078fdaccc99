"""The ticker: fires each due time of each enabled job once, on one daemon.

One thread sleeps until the earliest `next_due` of all jobs (one indexed query), or until a
job changes on this daemon, and then reads the jobs due now (a second indexed query).
For each, it claims the due time (a conditional UPDATE moving `next_due` on: on a shared
PostgreSQL database only one daemon wins) and then decides:

* backing off after provider failures in a row -> the due time is recorded `skipped`;
* missed (later than `misfire_grace_secs`, the daemon was down): `catch_up = skip` records
  it `skipped`, `once` runs once -- never one run per missed time;
* the previous run still going -> `skipped` ("previous run still running");
* over `max_runs_per_day` / `max_cost_usd_per_day` (UTC days) -> the job is paused
  (`enabled: false`, `paused_reason`) and audited;
* else the run starts on the run pool: an agent turn through the one run path
  (`Runs.start(RunRequest(..., origin="schedule"))`) or a workflow run, then the delivery.
  A job created with a scoped API key runs as that key (agentd/key_runs.py): its spend is
  the key's, and a key deleted, disabled, expired or over its budget fails the run, saying so.

A run record left `running` by a daemon that died is failed by the cluster heartbeat
(`reap`), as the lease reaper fails agent runs.
A delivery left `pending` or `retrying` by a stopped daemon is resumed by the next daemon
to start, from the attempt it reached.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Callable

from agentd.agents.events import Event
from agentd.agents.handle import RunOptions
from agentd.agents.listeners import AgentListeners
from agentd.agents.loop import RunCancelled
from agentd.agents.run_request import CALLER, RunRequest
from agentd.agents.runs import Runs
from agentd.config import SchedulesConfig
from agentd.errors import AgentdError, Conflict, NotFound
from agentd.llm.think import strip_think
from agentd.retry import backoff_delay
from agentd.schedules.delivery import Delivery, unset_secret
from agentd.schedules.spec import day_start, iso_seconds, schedule_from_json
from agentd.schedules.store import CronStore
from agentd.store.outage import log_failure

if TYPE_CHECKING:
    from agentd.key_runs import KeyRuns

OVERLAP = "previous run still running"
log = logging.getLogger("agentd.schedules")

# The longest sleep without looking at the database: jobs created or changed on other
# daemons of a shared database are seen within this (changes here wake the ticker at once).
IDLE_SECS = 5.0
# A wall-clock step (NTP, a manual set) bigger than this, measured against the monotonic
# clock, is a clock change rather than the ticker's own lateness.
CLOCK_STEP_SECS = 2.0
BACKOFF_INITIAL_SECS = 60.0
OUTPUT_LIMIT = 64 * 1024

Audit = Callable[[str, str, dict[str, Any]], None]


class Scheduler:
    def __init__(self, store: CronStore, settings: SchedulesConfig, daemon_id: str, runs: Runs,
                 find_agent: Callable[[str], Any], run_workflow: Callable[[str, str, str], dict[str, Any]],
                 delivery: Delivery, listeners: AgentListeners, audit: Audit, executor: Executor,
                 wake: threading.Event | None = None, live_daemons: Callable[[], set[str]] | None = None,
                 on_lag: Callable[[float], None] | None = None, key_runs: KeyRuns | None = None,
                 workflow_cost: Callable[[str], float | None] | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        # Due times are wall-clock instants (`clock`); waiting is measured on `monotonic`,
        # which no clock change moves.
        self.clock = clock
        self.monotonic = monotonic
        self._seen: tuple[float, float] | None = None  # (wall, monotonic) at the last look
        # The wall time before a forward clock step, until the due times it passed are
        # handled: those were jumped over, not missed while the daemon was down.
        self._stepped_from: float | None = None
        self.settings = settings
        self.daemon_id = daemon_id
        self.runs = runs
        self.find_agent = find_agent
        self.run_workflow = run_workflow
        # What a workflow run's steps cost (its run id): a workflow job's spend, for its caps.
        self.workflow_cost = workflow_cost
        self.delivery = delivery
        self.listeners = listeners
        self.audit = audit
        self.executor = executor
        # The daemons alive on a shared database (None: this daemon is alone).
        self.live_daemons = live_daemons
        # Told how late each due time this daemon claimed was handled (the metrics' histogram).
        self.on_lag = on_lag
        # The scoped key a job created with one acts as (None: every job is the admin's).
        self.key_runs = key_runs
        # Set when a job changes on this daemon (CronJobs is given its `set`).
        self._wake = wake or threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        # A run this daemon left running belongs to its previous life; alone on the
        # database, every run left running does.
        if self.live_daemons is None:
            self.store.fail_running("the daemon stopped while the run was in progress")
        else:
            self.store.fail_running("daemon {daemon} restarted while the run was in progress", daemon_id=self.daemon_id)
        self._resume_deliveries()
        for job in self.store.list():
            missing = unset_secret(job["delivery"])
            if missing:
                # Jobs stored before the variable went away, or a start without it: said once
                # here rather than only in each failed delivery.
                log.warning("cron job %s: its webhook's secret_env %s is not set in the daemon's environment; "
                            "every delivery fails until the daemon starts with it", job["name"], missing)
        if not self.settings.enabled:
            return
        self._thread = threading.Thread(target=self._loop, name="agentd-scheduler", daemon=True)
        self._thread.start()

    def _resume_deliveries(self) -> None:
        """Deliveries left unfinished by this daemon's previous life or, on a shared database,
        by a daemon no longer alive: each is taken by one starting daemon (the run moves to it,
        so a daemon starting later leaves it alone while this one is alive)."""
        others = self.live_daemons() - {self.daemon_id} if self.live_daemons is not None else set()
        for run_id, owner in self.store.unfinished_deliveries():
            if owner in others or not self.store.take_run(run_id, owner, self.daemon_id):
                continue
            run = self.store.get_run(run_id)
            job = self.store.get(run["job_id"]) if run is not None else None
            if job is not None and run["delivery"]["status"] in ("pending", "retrying"):
                log.info("cron job %s: resuming the delivery of run %s", job["name"], run_id)
                self.delivery.resume(job, run)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def wake(self) -> None:
        """A job changed: look at the due times again now."""
        self._wake.set()

    def reap(self) -> None:
        """On the cluster heartbeat: fail the running runs of daemons that are gone."""
        if self.live_daemons is None:
            return
        for run_id, job_id in self.store.fail_running(
                "daemon {daemon} stopped while the run was in progress (its lease expired)",
                except_live=self.live_daemons() | {self.daemon_id}):
            log.warning("cron run %s of job %s failed: its daemon is gone", run_id, job_id)
            self.audit("cron.run_failed", job_id, {"run_id": run_id})

    def _loop(self) -> None:
        while not self._stop.is_set():
            wait = self.step()
            if wait is None:
                continue
            self._wake.wait(max(0.0, wait))
            self._wake.clear()

    def step(self) -> float | None:
        """One look at the due times, firing those due; the seconds to sleep before the
        next look (never more than IDLE_SECS, so a clock set forward is seen within that),
        or None to look again at once."""
        try:
            now = self.clock()
            self._check_clock(now)
            earliest = self.store.earliest()
            if earliest is not None and earliest <= now:
                self.tick(now)
                return None
            self._stepped_from = None  # every due time a step passed has been handled
            return IDLE_SECS if earliest is None else min(IDLE_SECS, earliest - now)
        except Exception as exc:  # noqa: BLE001 - a database hiccup must not end the ticker
            log_failure(log, exc, "scheduler tick failed")
            return IDLE_SECS

    def _check_clock(self, now: float) -> None:
        """Notice a wall-clock step since the last look. Forward: the due times it passed
        fire once each (a claim moves each job past `now`). Back: interval jobs would wait
        out the step, so they are due one interval from now; cron and `at` times stay, as a
        slot that already ran must not run again."""
        mono = self.monotonic()
        seen, self._seen = self._seen, (now, mono)
        if seen is None:
            return
        expected = seen[0] + (mono - seen[1])
        step = now - expected
        if step > CLOCK_STEP_SECS:
            self._stepped_from = expected
            log.warning("the wall clock jumped %.0fs forward; due times passed meanwhile fire once", step)
        elif step < -CLOCK_STEP_SECS:
            self._stepped_from = None
            moved = self.store.rewind_intervals(now)
            log.warning("the wall clock went %.0fs back; %d interval job(s) re-anchored to now", -step, len(moved))

    # -- firing --------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        for job_id, due in self.store.due(now):
            if self._stop.is_set():
                return
            try:
                self._due(job_id, due, now)
            except Exception as exc:  # noqa: BLE001 - one broken job must not stop the others
                log_failure(log, exc, "cron job %s: due time not handled", job_id)

    def _due(self, job_id: str, due: float, now: float) -> None:
        job = self.store.get(job_id)
        if job is None or job["next_due"] != due:
            return
        schedule = schedule_from_json(job["schedule"])
        following = None if job["one_shot"] else schedule.next_after(now, anchor=due)
        if not self.store.claim(job_id, due, following):
            return  # another daemon took this due time
        if self.on_lag is not None:
            self.on_lag(max(0.0, now - due))
        finished = following is None
        if finished:  # one-shot (or an `at` time): nothing left to run
            self.store.update(job_id, enabled=False, next_due=None)
        jumped = self._stepped_from is not None and due > self._stepped_from
        missed = now - due > self.settings.misfire_grace_secs and not jumped
        if job["backoff_until"] is not None and now < job["backoff_until"]:
            self.store.add_run(job_id, self.daemon_id, due, "skipped",
                               f"backing off after {job['failures']} failed runs in a row "
                               f"(until {iso_seconds(job['backoff_until'])})")
            return
        if missed and job["catch_up"] == "skip":
            self.store.add_run(job_id, self.daemon_id, due, "skipped",
                               "missed while the daemon was not running (catch_up: skip)")
            return
        self.fire(job, due, "catch-up of a missed due time (catch_up: once)" if missed else "")

    def fire(self, job: dict[str, Any], due: float | None, reason: str = "") -> dict[str, Any]:
        """Run the job now unless it overlaps or is over a cap; the run record."""
        if not self.store.running(job["id"]):
            over = self._over_cap(job, self.clock())
            if over:
                return self.pause(job, over, due)
            started = self._start(job, due, reason)
            if started is not None:
                return started
        run_id = self.store.add_run(job["id"], self.daemon_id, due, "skipped", OVERLAP)
        return self.store.get_run(run_id)  # type: ignore[return-value]

    def _start(self, job: dict[str, Any], due: float | None, reason: str) -> dict[str, Any] | None:
        """The job's run, started; None when another run of it is going."""
        run_id = self.store.start_run(job["id"], self.daemon_id, due, reason)
        if run_id is None:
            return None
        run = self.store.get_run(run_id)  # read first: the run may go with its job at once
        self.executor.submit(self._execute, job, run_id)
        return run

    def run_now(self, job: dict[str, Any]) -> dict[str, Any]:
        """POST /api/cron/jobs/{id}/run: 409 while a run is going or the job is over a cap."""
        if self.store.running(job["id"]):
            raise Conflict("the job's previous run is still running")
        over = self._over_cap(job, self.clock())
        if over:
            self.pause(job, over, None)
            raise Conflict(f"the job is paused: {over}")
        started = self._start(job, None, "run now")
        if started is None:
            if self.store.get(job["id"]) is None:  # deleted meanwhile
                raise NotFound("cron job not found")
            raise Conflict("the job's previous run is still running")
        if job["one_shot"]:  # its one run: nothing left to run, as after a due time
            self.store.update(job["id"], enabled=False, next_due=None)
        return started

    def _over_cap(self, job: dict[str, Any], now: float) -> str:
        runs, cost = self.store.today(job["id"], day_start(now))
        if job["max_runs_per_day"] is not None and runs >= job["max_runs_per_day"]:
            return f"max_runs_per_day reached ({runs} runs today, UTC)"
        if job["max_cost_usd_per_day"] is not None and cost >= job["max_cost_usd_per_day"]:
            return f"max_cost_usd_per_day reached (${cost:.4f} today, UTC)"
        return ""

    def pause(self, job: dict[str, Any], reason: str, due: float | None) -> dict[str, Any]:
        # The skipped run first: a job seen paused has its record of why.
        run_id = self.store.add_run(job["id"], self.daemon_id, due, "skipped", reason)
        self.store.update(job["id"], enabled=False, next_due=None, paused_reason=reason)
        self.audit("cron.job_paused", job["name"], {"job_id": job["id"], "reason": reason})
        log.warning("cron job %s paused: %s", job["name"], reason)
        return self.store.get_run(run_id)  # type: ignore[return-value]

    # -- one run ---------------------------------------------------------------------------
    def _execute(self, job: dict[str, Any], run_id: str) -> None:
        output, error, cost = None, None, None
        try:
            if job["action"]["kind"] == "workflow_run":
                workflow_id = job["action"]["workflow_id"]
                payer = self.key_runs.workflow_payer(job.get("key_id"), workflow_id) if self.key_runs else ""
                result = self.run_workflow(workflow_id, job["action"].get("input", ""), payer)
                output, error = result.get("output"), result.get("error")
                if self.workflow_cost is not None and result.get("run_id"):
                    cost = self.workflow_cost(result["run_id"])
            else:
                output, cost = self._agent_turn(job)
        except AgentdError as exc:
            error = exc.message
        except Exception as exc:  # noqa: BLE001 - the run record must close whatever failed
            log.exception("cron job %s: run crashed", job["name"])
            error = f"internal error: {type(exc).__name__}: {exc}"
        status = "failed" if error else "ok"
        output = None if output is None else output[:OUTPUT_LIMIT]
        run = self.store.get_run(run_id) or {"id": run_id}
        finished = time.time()  # (the delivered body and the stored run tell the same time)
        run.update(status=status, finished_at=iso_seconds(finished), cost_usd=cost)
        delivery = self.delivery.pending(job) if status == "ok" else None
        self.store.finish_run(run_id, status, output, error, cost, delivery, finished)
        if delivery is not None:
            self.delivery.start(job, run, output or "")
        self.audit("cron.run", job["name"], {"job_id": job["id"], "run_id": run_id, "status": status,
                                             "source": "cron"})
        self._after(job, status)

    def _after(self, job: dict[str, Any], status: str) -> None:
        """Failures in a row back off; a run that crossed the cost cap pauses the job."""
        fresh = self.store.get(job["id"])
        if fresh is None:
            return
        if status == "ok":
            if fresh["failures"] or fresh["backoff_until"]:
                self.store.update(job["id"], failures=0, backoff_until=None)
        else:
            failures = fresh["failures"] + 1
            changes: dict[str, Any] = {"failures": failures}
            limit = self.settings.failure_backoff_after
            if failures >= limit:
                delay = backoff_delay(failures - limit, BACKOFF_INITIAL_SECS, self.settings.backoff_max_secs,
                                      jitter=0.0)
                changes["backoff_until"] = self.clock() + delay
                self.audit("cron.job_backoff", job["name"], {"job_id": job["id"], "failures": failures,
                                                             "backoff_secs": delay})
            self.store.update(job["id"], **changes)
        if fresh["enabled"] and fresh["max_cost_usd_per_day"] is not None:
            over = self._over_cap(fresh, self.clock())
            if over.startswith("max_cost"):
                self.pause(fresh, over, None)

    def _agent_turn(self, job: dict[str, Any]) -> tuple[str, float | None]:
        handle = self.find_agent(job["agent_id"])
        if handle is None:
            raise AgentdError(f"agent {job['agent_id']} not found")
        acting = self.key_runs.fields(job.get("key_id"), handle) if self.key_runs else {}
        message = job["action"]["message"]
        # Shown on the agent's sockets that talk in the session the run writes to, and no other.
        sockets = [s for s in self.listeners.of(handle.id) if s.session_id == acting.get("session_id")]
        for socket in sockets:
            socket.send("message", content=message, source="cron", job_id=job["id"], job_name=job["name"])
            socket.send("typing", state="start")

        def emit(event: Event) -> None:
            for socket in sockets:
                socket.on_event(event)

        request = RunRequest(handle, message, options=RunOptions(source="cron"), emit=emit if sockets else None,
                             on=CALLER, origin="schedule", from_client=False, **acting)
        timeout = job["action"].get("timeout_secs")
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            request.cancel.set()

        try:
            ticket = self.runs.start(request)
            if timeout:
                timer = threading.Timer(timeout, expire)
                timer.daemon = True
                timer.start()
            try:
                result = ticket.result()
            except RunCancelled:
                if not expired.is_set():
                    raise
                # The run's own words ("run cancelled") would not tell a timeout from a stop.
                raise AgentdError(f"timed out after {timeout} s (action.timeout_secs)") from None
            finally:
                if timeout:
                    timer.cancel()
        except Exception as exc:
            for socket in sockets:
                socket.send("typing", state="stop")
                socket.send("error", content=getattr(exc, "message", None) or "internal error")
            raise
        for socket in sockets:
            socket.send("typing", state="stop")
            socket.send("response", content=result.response, input_tokens=result.usage.input_tokens,
                        output_tokens=result.usage.output_tokens, iterations=result.iterations,
                        cost_usd=result.cost_usd)
        return strip_think(result.response).strip(), result.cost_usd
