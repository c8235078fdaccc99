"""Agents under concurrent clients, through the real daemon: spawns of one name, kills of one
agent, and uploads and changes of mode or manifest racing its deletion answer documented
statuses, never 500, and leave exactly one agent or none, with nothing of a deleted agent behind."""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest
import requests

from support import db_rows
from tests.agents.test_agents import manifest, spawn
from tests.memory.test_races import _together


def test_spawns_of_one_name_at_once_create_one_agent(shared_daemon) -> None:
    d = shared_daemon
    name = f"twin-{uuid.uuid4().hex[:6]}"
    answers: Counter = Counter()

    def work(i: int, s: requests.Session) -> None:
        r = s.post(f"{d.url}/api/agents", json={"manifest_toml": manifest(name)})
        answers[(r.status_code, r.json()["error"] if r.status_code != 201 else "")] += 1

    _together(8, work)
    assert answers == {(201, ""): 1, (409, f"an agent named '{name}' already exists"): 7}, answers
    assert [a["name"] for a in d.get("/api/agents").json()].count(name) == 1


def test_kills_of_one_agent_at_once(shared_daemon) -> None:
    d = shared_daemon
    agent_id = spawn(d)
    answers: Counter = Counter()

    def work(i: int, s: requests.Session) -> None:
        r = s.delete(f"{d.url}/api/agents/{agent_id}")
        answers[(r.status_code, str(r.json()))] += 1

    _together(6, work)
    assert answers == {(200, str({"status": "killed", "agent_id": agent_id})): 1,
                       (404, str({"error": "agent not found"})): 5}, answers


CHANGES = {
    "upload": lambda s, url, name, j: s.post(f"{url}/upload", files={"file": ("notes.txt", b"hello", "text/plain")}),
    "mode": lambda s, url, name, j: s.put(f"{url}/mode", json={"mode": ("Manual", "Auto")[j % 2]}),
    "manifest": lambda s, url, name, j: s.put(f"{url}/manifest", json={
        "manifest_toml": manifest(name, ('profile = "coding"', 'profile = "minimal"')[j % 2])}),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_changes_racing_the_agents_deletion(shared_daemon, change: str) -> None:
    d = shared_daemon
    answers: Counter = Counter()
    for round_ in range(10):
        name = f"changing-{uuid.uuid4().hex[:6]}"
        agent_id = spawn(d, name)

        def work(i: int, s: requests.Session) -> None:
            if i == 0:
                time.sleep(0.005 * (round_ % 4))  # a few changes land first in some rounds
                answers[("KILL", s.delete(f"{d.url}/api/agents/{agent_id}").status_code)] += 1
                return
            for j in range(6):
                r = CHANGES[change](s, f"{d.url}/api/agents/{agent_id}", name, j)
                answers[(r.status_code, r.json().get("error"))] += 1

        _together(5, work)
        assert db_rows(d.home, "SELECT COUNT(*) FROM uploads WHERE agent = ?", (agent_id,)) == [(0,)]
    ok = 201 if change == "upload" else 200
    assert set(answers) <= {("KILL", 200), (ok, None), (404, "agent not found")}, \
        f"BUG: a change racing the agent's deletion answered {answers}"
    assert answers[("KILL", 200)] == 10
