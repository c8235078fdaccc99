"""Real daemons on one PostgreSQL database: each due time of a job fires on exactly one
of them, a run whose daemon is SIGKILLed is marked failed by the survivor, and a delivery a
stopped daemon left unfinished is resumed by one of the daemons starting after it."""

from __future__ import annotations

import json
import os
import time

import pytest

import pgtest
from channel_fixtures import wait_for
from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from support import Daemon, make_home
from test_cron import SECRET, Receiver

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


def test_an_unfinished_delivery_is_resumed_by_one_of_the_daemons_starting(tmp_path, fake_llm) -> None:
    db_url = pgtest.databases().new_url()
    receiver = Receiver()
    receiver.status = 503
    env = {**LLM_ENV, "AGENTD_DATABASE_URL": db_url, "CRON_SECRET": SECRET}

    def daemon(name: str) -> Daemon:
        extra = f'\n[cluster]\ndaemon_id = "{name}"\nlease_secs = {LEASE}\n[schedules]\ndelivery_attempts = 6\n'
        return Daemon(make_home(tmp_path / name, llm_config(fake_llm, extra + NO_REMEMBERING)), env_extra=env)

    daemons = [daemon("deliver-a").start()]
    try:
        a = daemons[0]
        assert a.post("/api/agents", json={"manifest_toml": 'name = "sender"\n'}).status_code == 201
        created = a.post("/api/cron/jobs", json={
            "name": "hooked", "agent_id": "sender", "schedule": {"kind": "cron", "expr": "0 0 1 1 *"},
            "action": {"kind": "agent_turn", "message": "[[reply:for the hook]]"},
            "delivery": {"kind": "webhook", "url": f"{receiver.url}/flaky", "secret_env": "CRON_SECRET"}}).json()
        assert a.post(f"/api/cron/jobs/{created['id']}/run").status_code == 202
        wait_for(lambda: len(receiver.on("/flaky")) >= 2, 10, what="two failed attempts")
        a.stop()
        before = len(receiver.on("/flaky"))
        receiver.status = 200
        # Two daemons starting at once both find the delivery; one takes it.
        starting = [daemon(name).start(wait=False) for name in ("deliver-b", "deliver-c")]
        daemons += starting
        for d in starting:
            d.wait_healthy()
        run = wait_for(lambda: (r := starting[0].get(f"/api/cron/jobs/{created['id']}/runs").json())
                       and r[0]["delivery"]["status"] == "delivered" and r[0], 15, what="the delivery resumed")
        time.sleep(1)  # time enough for a second delivery, were there one
        assert run["delivery"] == {"status": "delivered", "attempts": before + 1, "error": None}
        assert len(receiver.on("/flaky")) == before + 1
        assert json.loads(receiver.on("/flaky")[-1]["body"])["output"] == "for the hook"
        assert run["daemon_id"] in ("deliver-b", "deliver-c")
    finally:
        for d in daemons:
            if not d.killed:
                d.stop()
        receiver.server.shutdown()
