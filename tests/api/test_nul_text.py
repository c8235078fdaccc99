"""Text holding U+0000, which PostgreSQL cannot store, is refused with a 400 naming the field
on every backend (never a 500 on PostgreSQL), by the routes and tools that keep what they are
given: cron jobs, triggers, events, the task board, key-value memory, memory fragments and the
knowledge graph (and their import), workflows and uploads. A lookup by such a name finds nothing."""

from __future__ import annotations

import json

from tests.agents.test_agents import say, spawn
from tests.support import wait_until

NUL = "must not contain the NUL character (\\u0000), which PostgreSQL cannot store"


def test_nul_text_is_refused_by_name(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    memory = f"/api/memory/agents/{agent_id}"
    fragment = d.post(f"{memory}/memories", json={"content": "kept"}).json()["id"]
    assert d.post(f"{memory}/entities", json={"entity_type": "person", "name": "Ann"}).status_code == 201
    export = d.get(f"{memory}/export").json()
    workflow = d.post("/api/workflows", json={"name": "w", "steps": [{"agent_id": agent_id}]}).json()["workflow_id"]
    job = {"name": "nul", "agent_id": agent_id, "schedule": {"kind": "every", "every_secs": 3600}, "enabled": False}
    trigger = {"agent_id": agent_id, "pattern": {"content_match": "x"}, "prompt_template": "p"}
    refused = [
        ("POST", "/api/cron/jobs", {**job, "action": {"kind": "agent_turn", "message": "a\x00b"}},
         "action.message: " + NUL),
        ("POST", "/api/triggers", {**trigger, "prompt_template": "p\x00"}, "prompt_template: " + NUL),
        ("POST", "/api/events", {"event_type": "e\x00"}, "invalid request: event_type: " + NUL),
        ("POST", "/api/tasks", {"title": "t\x00"}, "title: " + NUL),
        ("POST", "/api/tasks", {"title": "t", "description": "\x00"}, "description: " + NUL),
        ("PUT", f"/api/memory/agents/{agent_id}/kv/k", "v\x00", "value: a string " + NUL),
        ("PUT", f"/api/memory/agents/{agent_id}/kv/k", {"a": ["\x00"]}, "value: a string " + NUL),
        ("PUT", f"/api/memory/agents/{agent_id}/kv/k", {"\x00": 1}, "value: a string " + NUL),
        ("PUT", f"/api/memory/agents/{agent_id}/kv/k\x00", 1, "key " + NUL),
        ("GET", f"/api/memory/agents/{agent_id}/kv/k\x00", None, "key " + NUL),
        ("POST", f"{memory}/memories", {"content": "a\x00b"}, "content " + NUL),
        ("POST", f"{memory}/memories", {"content": "c", "scope": "\x00"}, "scope " + NUL),
        ("POST", f"{memory}/memories", {"content": "c", "metadata": {"k": ["\x00"]}}, "metadata: a string " + NUL),
        ("PUT", f"{memory}/memories/{fragment}", {"content": "a\x00b"}, "content " + NUL),
        ("POST", f"{memory}/entities", {"entity_type": "person", "name": "a\x00b"}, "name " + NUL),
        ("POST", f"{memory}/entities", {"entity_type": {"custom": "p\x00"}, "name": "n"}, "entity_type " + NUL),
        ("POST", f"{memory}/entities", {"entity_type": "person", "name": "n", "properties": {"\x00": 1}},
         "properties: a string " + NUL),
        ("POST", f"{memory}/relations", {"source": "Ann", "relation": "knows", "target": "A\x00"}, "target " + NUL),
        ("POST", f"{memory}/recall", {"query": "q\x00"}, "query " + NUL),
        ("POST", f"{memory}/graph/query", {"source": "A\x00"}, "source " + NUL),
        ("POST", f"{memory}/import", {**export, "entities": [{"id": "e", "entity_type": "person", "name": "\x00",
                                                              "created_at": "2024-01-01T00:00:00Z"}]},
         "entities[0].name " + NUL),
        ("POST", "/api/workflows", {"name": "w\x00", "steps": [{"agent_id": agent_id}]}, "invalid workflow: name: " + NUL),
        ("POST", "/api/workflows", {"name": "w", "description": "\x00", "steps": [{"agent_id": agent_id}]},
         "invalid workflow: description: " + NUL),
        ("POST", "/api/workflows", {"name": "w", "steps": [{"agent_id": agent_id, "prompt": "p\x00"}]},
         "invalid workflow: step 1: prompt: " + NUL),
        ("POST", f"/api/workflows/{workflow}/runs", {"input": "a\x00b"}, "input " + NUL),
        ("POST", f"/api/workflows/{workflow}/run", {"input": "a\x00b"}, "input " + NUL),
    ]
    for method, path, body, error in refused:
        r = d.request(method, path, json=body)
        assert (r.status_code, r.json()) == (400, {"error": error}), (method, path, r.text)
    for filename, content_type, error in (("a\x00b.txt", "text/plain", "filename " + NUL),
                                          ("a.txt", "text/plain\x00", "content type " + NUL)):
        r = d.post(f"/api/agents/{agent_id}/upload", files={"file": (filename, b"x", content_type)})
        assert (r.status_code, r.json()) == (400, {"error": error}), (filename, content_type, r.text)
    assert d.get(f"/api/agents/{agent_id}/uploads").json() == []
    assert [m["content"] for m in d.get(f"{memory}/memories").json()["memories"]] == ["kept"]
    assert [e["name"] for e in d.get(f"{memory}/export").json()["entities"]] == ["Ann"]
    assert [w["name"] for w in d.get("/api/workflows").json()] == ["w"]
    assert d.get(f"/api/workflows/{workflow}/runs").json() == []
    task = d.post("/api/tasks", json={"title": "t"}).json()
    r = d.post(f"/api/tasks/{task['id']}/claim", json={"agent_id": agent_id})
    assert r.status_code == 200, r.text
    r = d.post(f"/api/tasks/{task['id']}/complete", json={"result": "done\x00"})
    assert (r.status_code, r.json()) == (400, {"error": "result: " + NUL})
    # Named agents and filters with NUL name no agent.
    assert d.post("/api/cron/jobs", json={**job, "agent_id": "a\x00", "action": {"kind": "agent_turn", "message": "m"}}
                  ).json() == {"error": "agent_id: no agent 'a\\x00'"}
    assert d.post("/api/triggers", json={**trigger, "agent_id": "a\x00"}).status_code == 404
    for path, param in [("/api/cron/jobs", "agent_id"), ("/api/triggers", "agent_id"), ("/api/tasks", "assigned_to"),
                        ("/api/tasks", "claimed_by")]:
        r = d.get(path, params={param: "a\x00"})
        assert (r.status_code, r.json()) == (200, []), (path, r.text)


def test_tools_answer_nul_text_with_a_tool_error(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d, extra='profile = "full"')
    calls = [("memory_store", {"key": "k", "value": "a\x00"}, "value: a string " + NUL),
             ("task_post", {"title": "t\x00", "description": "d"}, "title: " + NUL),
             ("event_publish", {"event_type": "e\x00"}, "event_type: " + NUL),
             ("cron_create", {"name": "n", "schedule": {"kind": "every", "every_secs": 60},
                              "action": {"kind": "agent_turn", "message": "\x00"}}, "action.message: " + NUL)]
    for name, args, error in calls:
        body = say(d, agent_id, f"[[tool:{name} {json.dumps(args)}]]").json()
        assert body["response"] == f"tool said: error: {error}", (name, body)
    assert d.get(f"/api/memory/agents/{agent_id}/kv").json() == {}


def test_an_exchange_holding_nul_is_answered_kept_and_remembered(agent_daemon) -> None:
    """A message is never refused for U+0000: the session keeps it as written, and the
    remembered exchange holds U+FFFD in its place (PostgreSQL cannot store the NUL)."""
    d = agent_daemon
    agent_id = spawn(d)
    r = d.post(f"/api/agents/{agent_id}/message", json={"message": "[[reply:a\x00b]] nul\x00text"})
    assert (r.status_code, r.json()["response"]) == (200, "a\x00b")
    messages = d.get(f"/api/agents/{agent_id}/session").json()["messages"]
    assert [m["content"] for m in messages] == ["[[reply:a\x00b]] nul\x00text", "a\x00b"]

    def remembered() -> list[str]:
        items = d.get(f"/api/memory/agents/{agent_id}/memories").json()
        items = items.get("memories", items) if isinstance(items, dict) else items
        return [m["content"] for m in items if "nul" in m["content"]]

    wait_until(remembered, "the exchange remembered")
    assert "\x00" not in remembered()[0] and "nul\ufffdtext" in remembered()[0] and "a\ufffdb" in remembered()[0]
