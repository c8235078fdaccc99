"""Text holding U+0000, which PostgreSQL cannot store, is refused with a 400 naming the field
on every backend (never a 500 on PostgreSQL), by the routes and tools that keep what they are
given: cron jobs, triggers, events, the task board and key-value memory. A lookup by such a
name finds nothing."""

from __future__ import annotations

import json

from tests.agents.test_agents import say, spawn
from tests.support import wait_until

NUL = "must not contain the NUL character (\\u0000), which PostgreSQL cannot store"


def test_nul_text_is_refused_by_name(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
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
    ]
    for method, path, body, error in refused:
        r = d.request(method, path, json=body)
        assert (r.status_code, r.json()) == (400, {"error": error}), (method, path, r.text)
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
