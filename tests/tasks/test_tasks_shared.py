"""Two daemons on one PostgreSQL database share one task board: claims of the same task
racing through both daemons have exactly one winner, and a trigger's daily cap holds across
both (its counters are one row, locked per firing)."""

from __future__ import annotations

import os
import threading
import uuid
from typing import Iterator

import pytest

import pgtest
from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, stop_shared, wait_until
from tests.agents.test_agents import spawn

pytestmark = pytest.mark.skipif(pgtest.pg_bindir() is None and not os.environ.get("AGENTD_TEST_DATABASE_URL"),
                                reason="PostgreSQL (initdb/pg_ctl) is not installed: apt-get install postgresql")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[tuple[Daemon, Daemon]]:
    url = pgtest.databases().new_url()
    env = {**LLM_ENV, "AGENTD_DATABASE_URL": url}
    a = Daemon(make_home(tmp_path_factory.mktemp("tasks-a"), llm_config(fake_llm)), env_extra=env).start()
    b = Daemon(make_home(tmp_path_factory.mktemp("tasks-b"), llm_config(fake_llm)), env_extra=env).start()
    yield a, b
    stop_shared(a)
    stop_shared(b)


def test_one_claim_wins_across_daemons(pair) -> None:
    a, b = pair
    agents = [spawn(a, f"pg-{uuid.uuid4().hex[:8]}") for _ in range(6)]
    for round_ in range(3):
        task = a.post("/api/tasks", json={"title": f"race {round_}"}).json()
        results: list[tuple[int, str]] = []
        start = threading.Barrier(len(agents))

        def claim(daemon: Daemon, agent_id: str) -> None:
            start.wait()
            r = daemon.post(f"/api/tasks/{task['id']}/claim", json={"agent_id": agent_id})
            results.append((r.status_code, agent_id))

        threads = [threading.Thread(target=claim, args=((a, b)[i % 2], agent_id)) for i, agent_id in enumerate(agents)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [agent_id for status, agent_id in results if status == 200]
        assert len(winners) == 1 and sorted(s for s, _ in results) == [200] + [409] * (len(agents) - 1), results
        assert b.get(f"/api/tasks/{task['id']}").json()["claimed_by"] == winners[0]


def test_a_trigger_cap_holds_across_daemons(pair) -> None:
    a, b = pair
    agent_id = spawn(a, f"pg-{uuid.uuid4().hex[:8]}")
    word = f"both-{uuid.uuid4().hex[:6]}"
    r = b.post("/api/triggers", json={"agent_id": agent_id, "pattern": {"content_match": word},
                                      "prompt_template": "[[reply:ok]] {{event}}", "max_runs_per_day": 2})
    assert r.status_code == 201, r.text
    trigger_id = r.json()["id"]
    for i in range(6):
        assert (a, b)[i % 2].post("/api/events", json={"event_type": word}).status_code == 202
    wait_until(lambda: a.get(f"/api/triggers/{trigger_id}").json()["paused"], "the cap")
    got = b.get(f"/api/triggers/{trigger_id}").json()
    assert got["fire_count"] == 2
    assert got["paused_reason"] == "max_runs_per_day reached: 2 of 2 run(s) today (resumes at 00:00 UTC)"
