"""The ticker under wall-clock steps (an NTP step, a clock set by hand), driven by a fake
wall clock and a fake monotonic clock on a real store: a step forward fires each job's
passed due times once (not as missed), a step back neither runs a cron slot again nor
leaves an interval job waiting out the step."""

from __future__ import annotations

from typing import Any

import pytest

from agentd.config.tables import SchedulesConfig
from agentd.schedules.scheduler import Scheduler
from agentd.schedules.spec import schedule_from_json
from agentd.schedules.store import CronStore
from agentd.store import open_store

START = 1_800_000_000.0  # a whole hour (UTC)


class Clocks:
    def __init__(self) -> None:
        self.wall, self.mono = START + 1, 1000.0

    def advance(self, secs: float) -> None:
        """Time passes: both clocks move."""
        self.wall += secs
        self.mono += secs

    def step(self, secs: float) -> None:
        """The wall clock is set: only it moves."""
        self.wall += secs


class Finisher:
    """The run pool: every run ends at once (the ticker's part is what is tested)."""

    def __init__(self, store: CronStore) -> None:
        self.store = store

    def submit(self, fn: Any, job: dict[str, Any], run_id: str) -> None:
        self.store.finish_run(run_id, "ok", "done", None, None, None)


@pytest.fixture
def ticker(tmp_path):
    store = open_store(tmp_path / "agentd.db")
    cron = CronStore(store)
    clocks = Clocks()
    scheduler = Scheduler(cron, SchedulesConfig(misfire_grace_secs=5.0), "d1", runs=None, find_agent=lambda _: None,
                          run_workflow=None, delivery=None, listeners=None, audit=lambda *a: None,
                          executor=Finisher(cron), clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)
    jobs = {}
    for name, schedule in (("every", {"kind": "every", "every_secs": 60}),
                           ("hourly", {"kind": "cron", "expr": "0 * * * *", "tz": "UTC"})):
        jobs[name] = cron.create({"name": name, "agent_id": "", "schedule": schedule, "catch_up": "skip",
                                  "action": {"kind": "agent_turn", "message": "x"}, "delivery": {"kind": "none"},
                                  "next_due": schedule_from_json(schedule).first_due(clocks.wall)}, 50)["id"]
    yield scheduler, cron, clocks, jobs
    store.close()


def run_for(scheduler: Scheduler, clocks: Clocks, secs: int) -> None:
    """The ticker looking once a second for `secs` seconds."""
    for _ in range(secs):
        clocks.advance(1)
        while scheduler.step() is None:
            pass


def fired(cron: CronStore, job_id: str) -> list[dict[str, Any]]:
    return list(reversed(cron.runs(job_id)))


def assert_each_due_time_once(cron: CronStore, job_id: str) -> None:
    due = [r["due_at"] for r in fired(cron, job_id)]
    assert len(due) == len(set(due)), due


def test_a_forward_step_fires_each_passed_due_time_once(ticker) -> None:
    scheduler, cron, clocks, jobs = ticker
    run_for(scheduler, clocks, 130)
    assert [r["status"] for r in fired(cron, jobs["every"])] == ["ok", "ok"]
    assert fired(cron, jobs["hourly"]) == []

    clocks.step(3600)  # sixty due times of the interval and one of the hourly job jumped over
    run_for(scheduler, clocks, 1)
    for name in ("every", "hourly"):
        last = fired(cron, jobs[name])[-1]
        assert last["status"] == "ok" and last["reason"] == "", last  # run, not skipped as missed
    assert len(fired(cron, jobs["every"])) == 3 and len(fired(cron, jobs["hourly"])) == 1
    assert cron.get(jobs["every"])["next_due"] > clocks.wall
    assert cron.get(jobs["hourly"])["next_due"] == START + 7200

    run_for(scheduler, clocks, 60)  # and the interval goes on from there
    assert len(fired(cron, jobs["every"])) == 4
    assert_each_due_time_once(cron, jobs["every"])


def test_a_backward_step_neither_repeats_nor_stalls(ticker) -> None:
    scheduler, cron, clocks, jobs = ticker
    run_for(scheduler, clocks, 3600)
    assert len(fired(cron, jobs["every"])) == 60 and len(fired(cron, jobs["hourly"])) == 1

    clocks.step(-1800)  # back half an hour: the hourly slot that ran comes round again
    run_for(scheduler, clocks, 61)
    # The interval job did not wait out the half hour: it fired one interval later.
    assert len(fired(cron, jobs["every"])) == 61
    due = cron.get(jobs["every"])["next_due"]
    assert clocks.wall < due <= clocks.wall + 60

    run_for(scheduler, clocks, 1800)
    # The wall clock passed the hourly slot that already ran: it was not run again.
    assert clocks.wall > START + 3600
    assert len(fired(cron, jobs["hourly"])) == 1 and cron.get(jobs["hourly"])["next_due"] == START + 7200
    # The interval job fired once a minute of real time throughout.
    assert len(fired(cron, jobs["every"])) == 91
