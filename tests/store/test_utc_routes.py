"""Times on a whole second, end to end: the real daemon on a clock that reads whole seconds
writes each family of rows (agents and sessions, uploads, workflows and their runs, KV,
memory fragments, tasks, keys, approvals, audit); the route that lists them answers with those times,
and the database holds them as naive UTC wall time."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from conftest import LLM_ENV, llm_config
from support import Daemon, db_rows, make_home, stop_shared
from tests.agents.test_agents import manifest

ADMIN = "admin-secret-for-times"
WHOLE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")

# Loaded by the daemon's interpreter at start (`sitecustomize` on its PYTHONPATH), before
# agentd's modules import `utcnow`: every time the daemon takes falls on a whole second.
WHOLE_SECOND_CLOCK = """\
from datetime import datetime, timezone

import agentd.timestamps


def utcnow():
    return datetime.now(timezone.utc).replace(microsecond=0)


agentd.timestamps.utcnow = utcnow
"""


def clocked(root: Path, fake_llm: Any) -> Daemon:
    """A daemon (not started) on the whole-second clock, the fake LLM and an admin key."""
    clock = root / "clock"
    clock.mkdir(parents=True)
    (clock / "sitecustomize.py").write_text(WHOLE_SECOND_CLOCK)
    path = os.pathsep.join(p for p in (str(clock), os.environ.get("PYTHONPATH", "")) if p)
    home = make_home(root, f'api_key = "{ADMIN}"\n' + llm_config(fake_llm))
    return Daemon(home, api_key=ADMIN, env_extra={**LLM_ENV, "PYTHONPATH": path})


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    daemon = clocked(tmp_path_factory.mktemp("utc"), fake_llm).start()
    yield daemon
    stop_shared(daemon)


def ok(r: requests.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json()


def whole(value: Any) -> bool:
    return isinstance(value, str) and WHOLE.fullmatch(value) is not None


def stored(d: Daemon, table: str, column: str, where: str, *params: Any) -> list[bool]:
    """For each row: does `column` hold a whole second as naive UTC (SQLite: the text with
    microseconds; PostgreSQL: a `timestamp`)?"""
    values = [r[0] for r in db_rows(d.home, f"SELECT {column} FROM {table} WHERE {where}", params)]
    return [re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.000000", v) is not None if isinstance(v, str)
            else v.tzinfo is None and v.microsecond == 0 for v in values]


def spawn(d: Daemon) -> tuple[str, str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    return ok(d.post("/api/agents", json={"manifest_toml": manifest(name)}), 201)["agent_id"], name


def test_agents_and_sessions(tmp_path: Path, fake_llm) -> None:
    d = clocked(tmp_path, fake_llm).start()  # its own: restarted below
    agent_id, _ = spawn(d)
    # The session row and the agent's last_active are written with plain SQL (the run writer).
    assert "echo: hi" in ok(d.post(f"/api/agents/{agent_id}/message", json={"message": "hi"}))["response"]
    assert stored(d, "sessions", "created_at", "agent = ?", agent_id) == [True]
    assert stored(d, "agents", "last_active", "id = ?", agent_id) == [True]
    d.stop()
    d.start()  # the agent is loaded from its row
    agent = ok(d.get(f"/api/agents/{agent_id}"))
    assert whole(agent["created_at"]) and whole(agent["last_active"]), agent
    assert [a["id"] for a in ok(d.get("/api/agents")) if a["id"] == agent_id] == [agent_id]
    assert "echo: again" in ok(d.post(f"/api/agents/{agent_id}/message", json={"message": "again"}))["response"]


def test_uploads(d: Daemon) -> None:
    agent_id, _ = spawn(d)
    file_id = ok(d.post(f"/api/agents/{agent_id}/upload", files={"file": ("a.txt", b"x", "text/plain")}),
                 201)["file_id"]
    listed = ok(d.get(f"/api/agents/{agent_id}/uploads"))
    assert [(u["file_id"], whole(u["created_at"])) for u in listed] == [(file_id, True)]
    assert stored(d, "uploads", "created_at", "id = ?", file_id) == [True]


def test_workflows_and_their_runs(d: Daemon) -> None:
    _, name = spawn(d)
    workflow_id = ok(d.post("/api/workflows", json={"name": "w", "steps": [
        {"name": "one", "agent_name": name, "prompt": "say {{input}}"}]}), 201)["workflow_id"]
    run_id = ok(d.post(f"/api/workflows/{workflow_id}/run", json={"input": "x"}))["run_id"]
    assert [whole(w["created_at"]) for w in ok(d.get("/api/workflows")) if w["id"] == workflow_id] == [True]
    runs = ok(d.get(f"/api/workflows/{workflow_id}/runs"))
    assert [(r["id"], r["state"]["status"], whole(r["started_at"]), whole(r["completed_at"])) for r in runs] == [
        (run_id, "completed", True, True)]
    assert stored(d, "workflow_runs", "completed_at", "id = ?", run_id) == [True]


def test_kv(d: Daemon) -> None:
    agent_id, _ = spawn(d)
    ok(d.put(f"/api/memory/agents/{agent_id}/kv/colour", json="red"))
    ok(d.put(f"/api/memory/agents/{agent_id}/kv/colour", json="blue"))
    assert ok(d.get(f"/api/memory/agents/{agent_id}/kv")) == {"colour": "blue"}
    assert stored(d, "memory_kv", "updated_at", "agent = ?", agent_id) == [True]


def test_memory_fragments(d: Daemon) -> None:
    agent_id, _ = spawn(d)
    base = f"/api/memory/agents/{agent_id}/memories"
    memory_id = ok(d.post(base, json={"content": "The user likes tea"}), 201)["id"]
    updated = ok(d.put(f"{base}/{memory_id}", json={"content": "The user likes green tea"}))
    assert (updated["content"], whole(updated["created_at"])) == ("The user likes green tea", True)
    listed = ok(d.get(base))["memories"]
    assert [(f["id"], f["content"], whole(f["created_at"]), whole(f["accessed_at"])) for f in listed] == [
        (memory_id, "The user likes green tea", True, True)]
    assert stored(d, "memory_fragments", "created_at", "agent_id = ?", agent_id) == [True]


def test_tasks(d: Daemon) -> None:
    agent_id, _ = spawn(d)
    task_id = ok(d.post("/api/tasks", json={"title": "t"}), 201)["id"]
    ok(d.post(f"/api/tasks/{task_id}/claim", json={"agent_id": agent_id}))
    ok(d.post(f"/api/tasks/{task_id}/complete", json={"result": "done"}))
    task = [t for t in ok(d.get("/api/tasks")) if t["id"] == task_id]
    assert [(t["status"], whole(t["created_at"]), whole(t["claimed_at"]), whole(t["completed_at"]))
            for t in task] == [("completed", True, True, True)]
    assert stored(d, "tasks", "claimed_at", "id = ?", task_id) == [True]


def test_keys(d: Daemon) -> None:
    expires = (datetime.now(timezone.utc) + timedelta(days=1)).replace(microsecond=0)
    key = ok(d.post("/api/keys", json={"name": f"k-{uuid.uuid4().hex[:6]}", "scopes": ["read"],
                                       "expires_at": expires.isoformat()}), 201)
    # Every request with the key compares its expiry with now.
    for _ in range(2):
        assert requests.get(f"{d.url}/api/agents", headers={"Authorization": f"Bearer {key['key']}"},
                            timeout=30).status_code == 200
    listed = [k for k in ok(d.get("/api/keys")) if k["id"] == key["id"]]
    assert [(k["expires_at"], whole(k["created_at"])) for k in listed] == [(expires.isoformat(), True)]
    assert stored(d, "api_keys", "expires_at", "id = ?", key["id"]) == [True]


def test_audit(d: Daemon) -> None:
    agent_id, name = spawn(d)
    entries = [e for e in ok(d.get("/api/audit/recent", params={"limit": 50})) if e["subject"] == name]
    assert [(e["event"], whole(e["timestamp"])) for e in entries] == [("agent.spawn", True)]


def test_approvals(d: Daemon) -> None:
    agent_id = ok(d.post("/api/agents", json={"manifest_toml": manifest(f"t-{uuid.uuid4().hex[:8]}",
                                                                        'profile = "coding"')}), 201)["agent_id"]
    ok(d.put(f"/api/agents/{agent_id}/mode", json={"mode": "Manual"}))
    result: dict = {}
    say = threading.Thread(target=lambda: result.update(r=d.post(f"/api/agents/{agent_id}/message", json={
        "message": '[[tool:file_write {"path": "m.txt", "content": "ok"}]]'})))
    say.start()
    pending: list = []
    deadline = time.monotonic() + 10
    while not pending and time.monotonic() < deadline:
        pending = [a for a in ok(d.get("/api/approvals")) if a["agent_id"] == agent_id]
        time.sleep(0.05)
    assert [(a["tool"], whole(a["requested_at"])) for a in pending] == [("file_write", True)]
    ok(d.post(f"/api/approvals/{pending[0]['id']}/approve"))
    say.join(30)
    assert "wrote 2 bytes" in result["r"].json()["response"]
