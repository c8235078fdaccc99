"""Two daemons on one PostgreSQL database see the same durable state: agents spawned,
re-moded and killed through either, sessions, uploads, KV memory, usage, workflows.

Real daemons, a real PostgreSQL server (tests/pgtest.py) and the fake LLM; the daemons
are addressed directly (the nginx deployment is tested separately).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

import pgtest
from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, stop_shared
from tests.agents.test_agents import say, spawn


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[tuple[Daemon, Daemon]]:
    url = pgtest.databases().new_url()
    env = {**LLM_ENV, "AGENTD_DATABASE_URL": url}
    a = Daemon(make_home(tmp_path_factory.mktemp("shared-a"), llm_config(fake_llm)), env_extra=env).start()
    b = Daemon(make_home(tmp_path_factory.mktemp("shared-b"), llm_config(fake_llm)), env_extra=env).start()
    yield a, b
    stop_shared(a)
    stop_shared(b)


def test_agent_spawned_on_one_is_served_by_the_other(pair) -> None:
    a, b = pair
    agent_id = spawn(a, "shared-one")
    detail = b.get(f"/api/agents/{agent_id}")
    assert detail.status_code == 200, detail.text
    assert detail.json()["name"] == "shared-one"
    assert agent_id in {x["id"] for x in b.get("/api/agents").json()}
    # The session written by B's run is what A shows, and the history carries over.
    first = say(b, agent_id, "hello from b")
    assert first.status_code == 200, first.text
    assert first.json()["response"] == "echo: hello from b"
    second = say(a, agent_id, "and from a")
    assert second.json()["response"] == "echo: and from a"
    contents = [m["content"] for m in b.get(f"/api/agents/{agent_id}/session").json()["messages"]]
    assert contents == ["hello from b", "echo: hello from b", "and from a", "echo: and from a"]


def test_mode_kill_and_names_are_shared(pair) -> None:
    a, b = pair
    agent_id = spawn(a, "shared-two")
    assert b.put(f"/api/agents/{agent_id}/mode", json={"mode": "Observe"}).status_code == 200
    assert a.get(f"/api/agents/{agent_id}").json()["mode"] == "Observe"
    duplicate = b.post("/api/agents", json={"manifest_toml": 'name = "shared-two"\n'})
    assert duplicate.status_code == 409, duplicate.text
    assert b.delete(f"/api/agents/{agent_id}").status_code == 200
    assert a.get(f"/api/agents/{agent_id}").status_code == 404
    assert agent_id not in {x["id"] for x in a.get("/api/agents").json()}
    # The name is free again on both.
    again = spawn(a, "shared-two")
    assert b.get(f"/api/agents/{again}").json()["name"] == "shared-two"


def test_upload_kv_usage_and_workflows_are_shared(pair) -> None:
    a, b = pair
    agent_id = spawn(a, "shared-three")
    upload = a.post(f"/api/agents/{agent_id}/upload", files={"file": ("note.txt", b"the shared note", "text/plain")})
    assert upload.status_code == 201, upload.text
    reply = say(b, agent_id, "read it", attachments=[{"file_id": upload.json()["file_id"]}])
    assert reply.status_code == 200, reply.text
    assert "the shared note" in reply.json()["response"]
    assert a.put(f"/api/memory/agents/{agent_id}/kv/colour", json="teal").json() == {"status": "ok"}
    assert b.get(f"/api/memory/agents/{agent_id}/kv/colour").json() == "teal"
    usage_a, usage_b = a.get("/api/usage").json(), b.get("/api/usage").json()
    assert usage_a == usage_b and usage_a["requests"] >= 1
    created = a.post("/api/workflows", json={"name": "wf-shared", "steps": [{"name": "s", "agent": {"name": "shared-three"},
                                                                              "prompt": "{{input}}"}]})
    assert created.status_code == 201, created.text
    workflow_id = created.json()["workflow_id"]
    assert workflow_id in {w["id"] for w in b.get("/api/workflows").json()}


def _eventually(check, timeout: float = 15.0):
    """The settings follower polls every second; give it generous slack on a loaded machine."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def test_settings_changed_on_one_reach_the_other(pair) -> None:
    a, b = pair
    model = {"id": "shared-model", "display_name": "Shared", "provider": "openai", "tier": "custom",
             "context_window": 8000, "max_output_tokens": 1000, "input_cost_per_m": 1.0,
             "output_cost_per_m": 2.0, "supports_tools": True, "supports_vision": False,
             "supports_streaming": True}
    assert a.post("/api/models/custom", json=model).status_code == 201
    assert _eventually(lambda: b.get("/api/models/shared-model").status_code == 200)
    assert b.get("/api/models/shared-model").json()["context_window"] == 8000
    assert b.delete("/api/models/custom/shared-model").status_code == 200
    assert _eventually(lambda: a.get("/api/models/shared-model").status_code == 404)
    assert a.put("/api/budget", json={"limit_usd": 123.5}).status_code == 200
    assert _eventually(lambda: b.get("/api/budget").json()["limit_usd"] == 123.5)
    assert a.put("/api/budget", json={"limit_usd": 0}).status_code == 200
    assert _eventually(lambda: b.get("/api/budget").json()["limited"] is False)
    url = "http://127.0.0.1:9/v1"
    assert b.put("/api/providers/groq/url", json={"base_url": url}).status_code == 200
    groq = lambda: next(p for p in a.get("/api/providers").json() if p["id"] == "groq")  # noqa: E731
    assert _eventually(lambda: groq()["base_url"] == url)
