"""Step execution of a workflow run: each step attempt is an ordinary agent run.

Each attempt is an agent run (`Runs.start`) on the kernel's bounded executor, so steps are
metered, respect the agent's mode, quotas and the budget like any message. Fan-out
branches are coordinated on a separate pool of waiting threads: a coordinator only waits
(for attempts and backoff), so coordinators never take executor threads from the agent
runs they wait for, and nesting cannot deadlock. The run's bookkeeping (records, owner,
recovery) is the engine's (agentd/workflows/engine.py); this module only runs steps.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from agentd.agents.loop import RunCancelled, RunResult
from agentd.agents.manager import AgentHandle
from agentd.agents.registry import AgentRegistry
from agentd.agents.run_request import INLINE, RunRequest
from agentd.agents.runs import Runs
from agentd.errors import AgentdError
from agentd.retry import backoff_delay
from agentd.workflows.definition import render

log = logging.getLogger("agentd.workflows")

BACKOFF_BASE = 0.25   # seconds before the first retry; doubles each time (each ±20 %)
BACKOFF_MAX = 8.0
_POLL = 0.2           # how often a waiting coordinator notices a run being cancelled


class StepFailure(Exception):
    """One attempt failed; `final` when another attempt could not help (the default: it could)."""

    def __init__(self, message: str, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


@dataclass
class Outcome:
    """What executing one step (all its attempts, or all loop iterations) produced."""

    output: str = ""                     # what the next step sees as {{input}}
    records: list[dict[str, Any]] = field(default_factory=list)   # step results to append, in order
    failed: str | None = None            # error message when the run must stop (output unused then)
    skipped: bool = False                # error_mode skip: passed its input on (read by loops and fan-out)
    cancelled_by_sibling: bool = False


@dataclass
class RunState:
    """Mutable state of one run; only the driving thread touches it."""

    run_id: str
    workflow: dict[str, Any]
    current: str
    cancel: threading.Event = field(default_factory=threading.Event)
    variables: dict[str, str] = field(default_factory=dict)
    fanout: list[tuple[str, str]] = field(default_factory=list)   # (step name, output) since last collect
    results: list[dict[str, Any]] = field(default_factory=list)
    steps_completed: int = 0
    running: tuple[int, ...] = ()        # indexes of the step (or fan-out group) in progress
    finished: threading.Event = field(default_factory=threading.Event)
    key_id: str = ""                     # the scoped API key that started the run (it pays for its steps)


def _agent_label(ref: dict[str, str]) -> str:
    # Only steps with an agent get here (a collect without one never runs an agent step).
    key, value = next(iter(ref.items()))
    return f"{value!r}" if key == "name" else f"with id {value}"


def resolve(agents: AgentRegistry, ref: dict[str, str] | None) -> AgentHandle | None:
    """The live agent a step refers to (by id or exact name), or None."""
    if not ref:
        return None
    if "id" in ref:
        try:
            agent_id = str(uuid.UUID(ref["id"]))
        except ValueError:
            return None
        handle = agents.find(agent_id)
        return handle if handle is not None and handle.id == agent_id else None
    handle = agents.by_name(ref["name"])
    return None if handle is None or handle.killed else handle


# Saves a run's step results so far; False when the run is no longer this daemon's to
# drive (another daemon failed it, believing its owner dead): the driver then stops.
SaveProgress = Callable[[str, list[dict[str, Any]], int], bool]


class StepRunner:
    """Drives the steps of runs: sequence, conditions, loops, fan-out/collect, retries."""

    def __init__(self, agents: AgentRegistry, runs: Runs, executor: concurrent.futures.Executor,
                 save_progress: SaveProgress, closing: threading.Event,
                 backoff_base: float = BACKOFF_BASE, on_progress: Callable[[], None] = lambda: None) -> None:
        """`on_progress()` hears of every step starting (watchers of a run wake up)."""
        self.agents = agents
        self.runs = runs
        self.executor = executor
        self.save_progress = save_progress
        self.on_progress = on_progress
        self._closing = closing
        self.backoff_base = backoff_base
        # Coordinators of fan-out branches only wait; many may wait at once.
        self._coordinators = concurrent.futures.ThreadPoolExecutor(max_workers=256,
                                                                   thread_name_prefix="agentd-wf")

    def close(self) -> None:
        """No new fan-out branches; queued ones are dropped (their runs are being cancelled)."""
        self._coordinators.shutdown(wait=False, cancel_futures=True)

    def resolve(self, ref: dict[str, str] | None) -> AgentHandle | None:
        return resolve(self.agents, ref)

    def drive(self, run: RunState) -> str | None:
        """Execute every step in order; the run's error message, or None when it completed."""
        steps = run.workflow["steps"]
        index = 0
        while index < len(steps):
            step = steps[index]
            if step["mode"] == "fan_out":
                end = index
                while end < len(steps) and steps[end]["mode"] == "fan_out":
                    end += 1
                run.running = tuple(range(index, end))
                self.on_progress()
                error = self._fan_out(run, list(range(index, end)))
                index = end
            else:
                run.running = (index,)
                self.on_progress()
                error = self._single(run, index)
                index += 1
            run.running = ()
            if not self.save_progress(run.run_id, run.results, run.steps_completed):
                return error or "the run was failed elsewhere (its daemon was believed dead); stopped"
            if error:
                return error
        return None

    @staticmethod
    def _step_error(index: int, step: dict[str, Any], message: str) -> str:
        label = f"step {index + 1}"
        # A step without a name of its own was given its label as one: do not say it twice.
        if step["name"] != label:
            label += f" ({step['name']!r})"
        return f"{label} failed: {message}"

    def _single(self, run: RunState, index: int) -> str | None:
        step = run.workflow["steps"][index]
        mode = step["mode"]
        if mode == "collect":
            joined = "\n\n".join(f"--- begin {name} ---\n{text}\n--- end {name} ---" for name, text in run.fanout)
            run.fanout = []
            if step["agent"] is None:
                outcome = Outcome(output=joined, records=[self._record(index, step, None, "completed",
                                                                       joined, None, 0.0, 0)])
            else:
                outcome = self._agent_step(run, index, joined, (run.cancel,))
        elif mode == "conditional" and step["condition"].lower() not in run.current.lower():
            # Skipped: the next step sees this step's input, as if it were not there.
            record = self._record(index, step, self.resolve(step["agent"]), "skipped", run.current, None, 0.0, 0)
            record["note"] = f"condition {step['condition']!r} not met by the previous output"
            outcome = Outcome(output=run.current, records=[record])
        elif mode == "loop":
            outcome = self._loop(run, index)
        else:
            outcome = self._agent_step(run, index, run.current, (run.cancel,))
        run.results.extend(outcome.records)
        if outcome.failed:
            return self._step_error(index, step, outcome.failed)
        run.steps_completed += 1
        run.current = outcome.output
        if step["output_var"]:
            run.variables[step["output_var"]] = outcome.output
        return None

    def _loop(self, run: RunState, index: int) -> Outcome:
        step = run.workflow["steps"][index]
        until = (step["until"] or "").lower()
        current, records = run.current, []
        for iteration in range(1, step["max_iterations"] + 1):
            outcome = self._agent_step(run, index, current, (run.cancel,), iteration=iteration)
            records.extend(outcome.records)
            if outcome.failed:
                return Outcome(records=records, failed=f"iteration {iteration}: {outcome.failed}")
            if outcome.skipped:
                break  # error_mode skip: the loop ends with the last good output
            current = outcome.output
            if until and until in current.lower():
                break
        else:
            if until and records:
                records[-1]["note"] = (f"until {step['until']!r} not met after "
                                       f"{step['max_iterations']} iteration(s)")
        return Outcome(output=current, records=records)

    def _fan_out(self, run: RunState, indexes: list[int]) -> str | None:
        """Run consecutive fan_out steps in parallel, each with its own error_mode."""
        steps = run.workflow["steps"]
        group_cancel = threading.Event()
        given = run.current

        def branch(i: int) -> Outcome:
            outcome = self._agent_step(run, i, given, (run.cancel, group_cancel))
            if outcome.failed and not group_cancel.is_set():
                # error_mode fail (or retries used up): stop the siblings, the run is over.
                group_cancel.set()
            elif outcome.failed:
                outcome.cancelled_by_sibling = True
            return outcome

        try:
            futures = [self._coordinators.submit(branch, i) for i in indexes]
        except RuntimeError:
            return "the daemon is shutting down"
        errors = []
        for i, future in zip(indexes, futures):
            step = steps[i]
            try:
                outcome = future.result()
            except concurrent.futures.CancelledError:
                # Still queued when close() dropped it (the run is being cancelled): never ran.
                outcome = Outcome(failed="the daemon is shutting down")
            run.results.extend(outcome.records)
            if outcome.failed:
                if not outcome.cancelled_by_sibling:
                    errors.append(self._step_error(i, step, outcome.failed))
                continue
            run.steps_completed += 1
            if step["output_var"]:
                run.variables[step["output_var"]] = outcome.output
            if not outcome.skipped:
                run.fanout.append((step["name"], outcome.output))
            run.current = outcome.output
        # Some failed outcome is never `cancelled_by_sibling`: only a failing branch sets
        # group_cancel, and the one that set it saw it unset. So a failure always names a step
        # (the first in step order: two branches may both fail before either sees the other).
        return errors[0] if errors else None

    # -- one agent step: attempts, retries, error_mode -------------------------------------
    def _agent_step(self, run: RunState, index: int, given: str, stops: tuple[threading.Event, ...],
                    iteration: int | None = None) -> Outcome:
        step = run.workflow["steps"][index]
        prompt = render(step["prompt"], given, run.variables)
        attempts = step["max_retries"] + 1 if step["error_mode"] == "retry" else 1
        began = time.monotonic()
        # Every way out of this loop is a return or a break that has set `error` (and `handle`).
        for attempt in itertools.count(1):
            handle = self.resolve(step["agent"])
            if handle is None:
                error = f"agent {_agent_label(step['agent'])} not found (killed, or never existed)"
                break
            try:
                result = self._attempt(handle, prompt, step["timeout_secs"], stops, run.key_id)
            except StepFailure as exc:
                error = str(exc)
                if handle.killed:
                    error = f"agent {handle.name!r} was killed while the step was running"
                    break
                if exc.final or attempt == attempts:
                    break
                delay = backoff_delay(attempt - 1, self.backoff_base, BACKOFF_MAX)
                log.info("workflow step %r attempt %d failed (%s); retrying in %.2fs",
                         step["name"], attempt, error, delay)
                if _wait_any(stops, delay):
                    error = f"{error}; retry abandoned: {_stop_reason(stops, self._closing)}"
                    break
                continue
            record = self._record(index, step, handle, "completed", result.response, result,
                                  time.monotonic() - began, attempt, iteration)
            return Outcome(output=result.response, records=[record])
        if attempts > 1 and attempt == attempts and handle is not None and not handle.killed:
            error = f"failed after {attempts} attempts: {error}"
        skip = step["error_mode"] == "skip" and not any(s.is_set() for s in stops)
        status = "skipped" if skip else "failed"
        record = self._record(index, step, handle, status, given if skip else "", None,
                              time.monotonic() - began, attempt, iteration, error)
        if skip:
            return Outcome(output=given, records=[record], skipped=True)
        return Outcome(records=[record], failed=error)

    def _attempt(self, handle: AgentHandle, prompt: str, timeout: float,
                 stops: tuple[threading.Event, ...], key_id: str = "") -> RunResult:
        """One agent run on the executor, bounded by `timeout` from when it starts."""
        cancel = threading.Event()
        started: list[float] = []

        def call() -> RunResult:
            started.append(time.monotonic())
            # Waiting for the agent's current run counts against the attempt's timeout.
            return self.runs.start(RunRequest(handle, prompt, cancel=cancel, on=INLINE, origin="workflow", wait=timeout,
                                              from_client=False, key_id=key_id)).result()

        try:
            future = self.executor.submit(call)
        except RuntimeError:
            raise StepFailure("the daemon is shutting down", final=True) from None
        while True:
            # Queueing for an executor thread does not count; the attempt starts when it runs.
            # (Past the deadline the wait is negative: wait() then only looks, like a 0 wait.)
            wait = _POLL if not started else min(_POLL, started[0] + timeout - time.monotonic())
            done, _ = concurrent.futures.wait([future], timeout=wait)
            # A queued attempt cancelled by the executor's shutdown never counts as done for
            # wait() (only the worker that would have run it marks it so): look at it directly.
            if done or future.cancelled():
                break
            if any(s.is_set() for s in stops):
                cancel.set()
                raise StepFailure(_stop_reason(stops, self._closing), final=True)
            if started and time.monotonic() >= started[0] + timeout:
                cancel.set()  # the agent run stops at its next cancellation point
                raise StepFailure(f"timed out after {timeout:g}s")
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise StepFailure("the daemon is shutting down", final=True) from None
        except RunCancelled:
            if any(s.is_set() for s in stops):
                # The run was cancelled because this one is (the daemon stopping, a sibling
                # failing): say why, rather than blame the agent.
                raise StepFailure(_stop_reason(stops, self._closing), final=True) from None
            raise StepFailure("the agent's run was cancelled (stopped or killed)", final=True) from None
        except AgentdError as exc:
            # Refusals (bad input, quota, budget) would only be refused again.
            raise StepFailure(exc.message, final=exc.status < 500 and exc.status != 409) from None

    @staticmethod
    def _record(index: int, step: dict[str, Any], handle: AgentHandle | None, status: str, output: str,
                result: RunResult | None, seconds: float, attempts: int, iteration: int | None = None,
                error: str | None = None) -> dict[str, Any]:
        """A Step result (spec fields first, then what explains skips and failures)."""
        ref = step["agent"] or {}
        return {"step_name": step["name"], "agent_id": handle.id if handle else ref.get("id", ""),
                "agent_name": handle.name if handle else ref.get("name", ""), "output": output,
                "input_tokens": result.usage.input_tokens if result else 0,
                "output_tokens": result.usage.output_tokens if result else 0,
                "duration_ms": int(seconds * 1000),
                "step_index": index, "mode": step["mode"], "status": status, "error": error,
                "attempts": attempts, "iteration": iteration,
                "cost_usd": result.cost_usd if result else None, "note": None}



def _wait_any(events: Iterable[threading.Event], seconds: float) -> bool:
    """Sleep up to `seconds`; True as soon as any event is set."""
    deadline = time.monotonic() + seconds
    events = tuple(events)
    while True:
        if any(e.is_set() for e in events):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        events[0].wait(min(left, _POLL))


def _stop_reason(stops: tuple[threading.Event, ...], closing: threading.Event) -> str:
    if closing.is_set():
        return "the daemon is shutting down"
    if len(stops) > 1 and stops[1].is_set() and not stops[0].is_set():
        return "cancelled because a parallel fan_out step failed"
    return "run cancelled"
