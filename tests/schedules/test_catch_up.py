"""Jobs and their due times survive a restart, and due times missed while the daemon was
down follow the job's `catch_up`: `skip` records them skipped, `once` runs once -- never a
burst of one run per missed time."""

from __future__ import annotations

import time

from channel_fixtures import wait_for
from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from support import Daemon, make_home


def test_missed_due_times_after_a_restart(tmp_path, fake_llm) -> None:
    home = make_home(tmp_path, llm_config(fake_llm, "\n[schedules]\nmisfire_grace_secs = 1\n" + NO_REMEMBERING))
    d = Daemon(home, env_extra=LLM_ENV).start()
    try:
        assert d.post("/api/agents", json={"manifest_toml": 'name = "sleeper"\n'}).status_code == 201
        ids = {}
        for catch_up in ("skip", "once"):
            r = d.post("/api/cron/jobs", json={"name": catch_up, "agent_id": "sleeper", "catch_up": catch_up,
                                               "schedule": {"kind": "every", "every_secs": 2},
                                               "action": {"kind": "agent_turn", "message": "[[reply:tick]]"}})
            ids[catch_up] = r.json()["id"]
        later = d.post("/api/cron/jobs", json={"name": "yearly", "agent_id": "sleeper",
                                               "schedule": {"kind": "cron", "expr": "0 0 1 1 *"},
                                               "action": {"kind": "agent_turn", "message": "x"}}).json()
        d.stop()
        time.sleep(3)  # due times of each job pass while the daemon is down (and it takes a moment to start)
        started = time.time()  # the scheduler runs before start() returns
        d.start()

        def history(job_id: str) -> list[dict]:
            return list(reversed(d.get(f"/api/cron/jobs/{job_id}/runs").json()))

        wait_for(lambda: history(ids["skip"]) and history(ids["once"]), 10, what="the first due times")
        skipped = history(ids["skip"])[0]
        assert skipped["status"] == "skipped"
        assert skipped["reason"] == "missed while the daemon was not running (catch_up: skip)"
        caught = wait_for(lambda: [r for r in history(ids["once"]) if r["status"] == "ok"], 10, what="the catch-up")
        assert caught[0]["reason"] == "catch-up of a missed due time (catch_up: once)"
        # No burst: one record for the missed times, then one per due time of the 2 s interval.
        for job_id in ids.values():
            assert len(history(job_id)) <= 2 + (time.time() - started) // 2, history(job_id)
        assert d.get(f"/api/cron/jobs/{later['id']}").json()["next_run_at"] == later["next_run_at"]
    finally:
        d.stop()
