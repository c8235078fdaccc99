"""Two real daemons on one PostgreSQL database: each due time of a job fires on exactly one
of them, and a run whose daemon is SIGKILLed is marked failed by the survivor."""

from __future__ import annotations

import os

import pytest

import pgtest
from channel_fixtures import wait_for
from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from support import Daemon, make_home

LEASE = 2.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(pgtest.pg_bindir() is None and not os.environ.get("AGENTD_TEST_DATABASE_URL"),
                       reason="PostgreSQL (initdb/pg_ctl) is not installed: apt-get install postgresql"),
]


def test_each_due_time_fires_on_one_daemon(tmp_path, fake_llm) -> None:
    db_url = pgtest.databases().new_url()
    daemons = []
    try:
        for name in ("cron-a", "cron-b"):
            extra = f'\n[cluster]\ndaemon_id = "{name}"\nlease_secs = {LEASE}\n'
            home = make_home(tmp_path / name, llm_config(fake_llm, extra + NO_REMEMBERING))
            daemons.append(Daemon(home, env_extra={**LLM_ENV, "AGENTD_DATABASE_URL": db_url}).start())
        a, b = daemons
        assert a.post("/api/agents", json={"manifest_toml": 'name = "shared"\n'}).status_code == 201
        body = {"name": "both", "agent_id": "shared", "schedule": {"kind": "every", "every_secs": 1},
                "action": {"kind": "agent_turn", "message": "[[reply:once]]"}}
        created = a.post("/api/cron/jobs", json=body).json()
        # Seen through the other daemon, and fired by whichever claims each due time.
        wait_for(lambda: len([r for r in b.get(f"/api/cron/jobs/{created['id']}/runs").json()
                              if r["status"] == "ok"]) >= 5, 20, what="five runs")
        b.request("PATCH", f"/api/cron/jobs/{created['id']}", json={"enabled": False})
        history = a.get(f"/api/cron/jobs/{created['id']}/runs").json()
        dues = [r["due_at"] for r in history]
        assert len(dues) == len(set(dues)), history  # no due time fired twice
        assert {r["daemon_id"] for r in history} <= {"cron-a", "cron-b"}

        # A daemon killed mid-run: the survivor fails its run record.
        slow = a.post("/api/cron/jobs", json={**body, "name": "slow", "one_shot": True,
                                              "action": {"kind": "agent_turn", "message": "[[slow:30]] zzz"}}).json()
        running = wait_for(lambda: [r for r in a.get(f"/api/cron/jobs/{slow['id']}/runs").json()
                                    if r["status"] == "running"], 10, what="the slow run")[0]
        victim, survivor = (a, b) if running["daemon_id"] == "cron-a" else (b, a)
        victim.kill()
        failed = wait_for(lambda: [r for r in survivor.get(f"/api/cron/jobs/{slow['id']}/runs").json()
                                   if r["status"] == "failed"], 5 * LEASE + 10, what="the reaped run")[0]
        assert failed["id"] == running["id"]
        assert failed["error"] == (f"daemon {running['daemon_id']} stopped while the run was in progress "
                                   "(its lease expired)")
    finally:
        for d in daemons:
            if not d.killed:
                d.stop()
