"""The task board through the real daemon: /api/tasks, the task_* tools, event_publish and
agent_activate called by the fake LLM, Observe mode, claims racing on one task, and the
tools in a run of a scoped API key (the key's agents and scopes, as on /api/tasks)."""

from __future__ import annotations

import json
import re
import threading
import uuid
from typing import Any, Iterator

import pytest

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, stop_shared
from tests.agents.test_agents import say, spawn
from tests.api.test_keys import as_key, new_key

ADMIN = "admin-secret-for-tasks"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    home = make_home(tmp_path_factory.mktemp("tasks-keys"), f'api_key = "{ADMIN}"\n' + llm_config(fake_llm))
    daemon = Daemon(home, api_key=ADMIN, env_extra=LLM_ENV).start()
    yield daemon
    stop_shared(daemon)


def _agent(d, extra: str = "") -> tuple[str, str]:
    name = f"tb-{uuid.uuid4().hex[:8]}"
    return spawn(d, name, extra), name


def _call(tool: str, **args) -> str:
    return f"[[tool:{tool} " + json.dumps(args) + "]]"


def _tool(d, caller: str, tool: str, /, **args) -> str:
    r = say(d, caller, _call(tool, **args))
    assert r.status_code == 200, r.text
    out = r.json()["response"]
    assert out.startswith("tool said: "), out
    return out[len("tool said: "):]


def _key_tool(d, key: dict[str, Any], caller: str, tool: str, /, **args) -> str:
    """What `tool` answered in a run of `caller` that `key` started."""
    r = as_key(d, key, "POST", f"/api/agents/{caller}/message", json={"message": _call(tool, **args)})
    assert r.status_code == 200, r.text
    return r.json()["response"].removeprefix("tool said: ")


def _audit(d, event: str) -> list[dict]:
    return d.get(f"/api/audit/recent?limit=500&event={event}").json()


def test_api_post_list_claim_complete_delete(agent_daemon) -> None:
    d = agent_daemon
    worker, worker_name = _agent(d)
    other, _ = _agent(d)
    r = d.post("/api/tasks", json={"title": "Check the links", "description": "all of them",
                                   "assigned_to": worker_name})
    assert r.status_code == 201, r.text
    task = r.json()
    assert {k: task[k] for k in ("title", "description", "status", "assigned_to", "created_by", "claimed_by",
                                 "result", "claimed_at", "completed_at")} == {
        "title": "Check the links", "description": "all of them", "status": "pending", "assigned_to": worker,
        "created_by": None, "claimed_by": None, "result": None, "claimed_at": None, "completed_at": None}
    assert d.get(f"/api/tasks/{task['id']}").json() == task
    assert task["id"] in [t["id"] for t in d.get("/api/tasks?status=pending").json()]
    assert task["id"] not in [t["id"] for t in d.get("/api/tasks?status=completed").json()]
    assert [t["id"] for t in d.get(f"/api/tasks?assigned_to={worker}").json()] == [task["id"]]
    assert [t["id"] for t in d.get(f"/api/tasks?assigned_to={worker_name}").json()] == [task["id"]]
    # Assigned to the worker: another agent cannot claim it.
    r = d.post(f"/api/tasks/{task['id']}/claim", json={"agent_id": other})
    assert r.status_code == 409 and r.json() == {"error": f"task {task['id']} is assigned to another agent"}
    r = d.post(f"/api/tasks/{task['id']}/claim", json={"agent_id": worker_name})
    assert r.status_code == 200 and r.json()["status"] == "in_progress" and r.json()["claimed_by"] == worker
    assert d.post(f"/api/tasks/{task['id']}/claim", json={"agent_id": worker}).status_code == 409
    r = d.post(f"/api/tasks/{task['id']}/complete", json={"result": "fine", "agent_id": other})
    assert r.status_code == 409 and r.json() == {"error": f"task {task['id']} was claimed by another agent"}
    r = d.post(f"/api/tasks/{task['id']}/complete", json={"result": "all fine"})
    assert r.status_code == 200 and r.json()["status"] == "completed" and r.json()["result"] == "all fine"
    assert r.json()["completed_at"]
    assert d.delete(f"/api/tasks/{task['id']}").json() == {"status": "removed", "task_id": task["id"]}
    assert d.get(f"/api/tasks/{task['id']}").status_code == 404
    assert d.get("/api/tasks/nope").json() == {"error": "invalid task id: 'nope' is not a UUID"}
    for body, status in [({"title": " "}, 400), ({"description": "x"}, 400),
                         ({"title": "t", "assigned_to": "no-such-agent"}, 404)]:
        r = d.post("/api/tasks", json=body)
        assert r.status_code == status, r.text
    assert d.get("/api/tasks?status=done").status_code == 400


def test_lists_show_the_newest_tasks(agent_daemon) -> None:
    d = agent_daemon
    worker, _ = _agent(d)
    titles = [f"t-{i}" for i in range(502)]
    for title in titles:
        assert d.post("/api/tasks", json={"title": title, "assigned_to": worker}).status_code == 201
    listed = d.get(f"/api/tasks?assigned_to={worker}").json()
    assert [t["title"] for t in listed] == titles[2:]
    # The tool shows the newest 50 of the board, oldest first.
    shown = _tool(d, worker, "task_list", status="pending")
    assert shown.startswith('[{"id": "') and '"title": "t-452"' in shown[:120], shown
    # Long descriptions and results are cut for the model, never on the board.
    long = d.post("/api/tasks", json={"title": "long", "description": "d" * 600, "assigned_to": worker}).json()
    assert d.post(f"/api/tasks/{long['id']}/claim", json={"agent_id": worker}).status_code == 200
    assert d.post(f"/api/tasks/{long['id']}/complete", json={"result": "r" * 600}).status_code == 200
    _tool(d, worker, "task_list", status="completed")
    results = [t["result"] for m in d.get(f"/api/agents/{worker}/session").json()["messages"]
               for t in m.get("tools", [])]
    listing = re.sub(r" \(the newest \d+ of \d+\)$", "", results[-1])
    shown = next(t for t in json.loads(listing) if t["id"] == long["id"])
    assert (shown["description"], shown["result"]) == ("d" * 500 + "...", "r" * 500 + "...")
    assert d.get(f"/api/tasks/{long['id']}").json()["result"] == "r" * 600
    while left := d.get(f"/api/tasks?assigned_to={worker}").json():
        for task in left:
            assert d.delete(f"/api/tasks/{task['id']}").status_code == 200


def test_claims_racing_on_one_task_have_one_winner(agent_daemon) -> None:
    d = agent_daemon
    agents = [_agent(d)[0] for _ in range(8)]
    task = d.post("/api/tasks", json={"title": "only one of you"}).json()
    statuses: list[int] = []
    start = threading.Barrier(len(agents))

    def claim(agent_id: str) -> None:
        start.wait()
        statuses.append(d.post(f"/api/tasks/{task['id']}/claim", json={"agent_id": agent_id}).status_code)

    threads = [threading.Thread(target=claim, args=(a,)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200] + [409] * (len(agents) - 1)
    assert d.get(f"/api/tasks/{task['id']}").json()["claimed_by"] in agents



def test_deletes_completions_and_reads_racing_on_one_task(agent_daemon) -> None:
    """A task deleted while others complete and read it: one delete and at most one completion
    win, every other answer is 404 or 409, never 500."""
    d = agent_daemon
    worker, _ = _agent(d)
    for _ in range(20):
        task = d.post("/api/tasks", json={"title": "going away", "description": "soon"}).json()
        assert d.post(f"/api/tasks/{task['id']}/claim", json={"agent_id": worker}).status_code == 200
        calls = [("DELETE", "", None)] * 3 + [("POST", "/complete", {"result": "done"})] * 3 + [("GET", "", None)] * 6
        answers: list[tuple[str, int]] = []
        start = threading.Barrier(len(calls))

        def hit(method: str, path: str, body: dict | None) -> None:
            start.wait()
            r = d.request(method, f"/api/tasks/{task['id']}{path}", json=body)
            answers.append((method + path, r.status_code))

        threads = [threading.Thread(target=hit, args=c) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        by = {kind: sorted(s for k, s in answers if k == kind) for kind in ("DELETE", "POST/complete", "GET")}
        assert by["DELETE"] == [200, 404, 404], answers
        assert set(by["POST/complete"]) <= {200, 404, 409} and by["POST/complete"].count(200) <= 1, answers
        assert set(by["GET"]) <= {200, 404}, answers
        assert d.get(f"/api/tasks/{task['id']}").status_code == 404

def test_task_tools_through_the_loop(agent_daemon) -> None:
    d = agent_daemon
    boss, _ = _agent(d)
    worker, worker_name = _agent(d)
    posted = json.loads(_tool(d, boss, "task_post", title="Summarise the report", description="two lines",
                              assigned_to=worker_name))
    assert list(posted) == ["task_id", "status", "assigned_to"]
    assert posted["status"] == "pending" and posted["assigned_to"] == worker
    task = d.get(f"/api/tasks/{posted['task_id']}").json()
    assert task["created_by"] == boss and task["title"] == "Summarise the report"
    assert _tool(d, boss, "task_post", title="x", description="y", assigned_to="ghost") == (
        "error: no agent with id or name 'ghost'")
    listed = json.loads(_tool(d, boss, "task_list", status="pending"))
    assert posted["task_id"] in [t["id"] for t in listed]
    assert _tool(d, boss, "task_list", status="nonsense") == (
        "error: status: must be one of pending, in_progress, completed")
    # The worker claims the oldest pending task it may take: its own or an unassigned one.
    claimed = json.loads(_tool(d, worker, "task_claim"))
    pending_before = [t for t in listed if t["assigned_to"] in (None, worker)]
    assert claimed["id"] == pending_before[0]["id"] and claimed["status"] == "in_progress"
    assert claimed["claimed_by"] == worker
    assert _tool(d, boss, "task_complete", task_id=claimed["id"], result="done") == (
        f"error: task {claimed['id']} was claimed by another agent")
    assert _tool(d, worker, "task_complete", task_id=claimed["id"], result="done") == f"completed task {claimed['id']}"
    assert d.get(f"/api/tasks/{claimed['id']}").json()["result"] == "done"
    assert _tool(d, worker, "task_complete", task_id=claimed["id"], result="again") == (
        f"error: task {claimed['id']} is completed, not in_progress")
    while (out := _tool(d, worker, "task_claim")) != "no pending task to claim":
        _tool(d, worker, "task_complete", task_id=json.loads(out)["id"], result="swept")
    listing = next(e for e in _audit(d, "tool.task_list") if e["detail"]["agent_id"] == boss)
    assert listing["detail"]["status"] is None or listing["detail"]["status"] == "pending"
    for event in ("tool.task_post", "tool.task_claim", "tool.task_complete"):
        assert any(e["detail"]["task_id"] == claimed["id"] or e["detail"]["task_id"] == posted["task_id"]
                   for e in _audit(d, event)), event


def test_observe_mode_lists_but_does_not_post(agent_daemon) -> None:
    d = agent_daemon
    watcher, _ = _agent(d)
    assert d.put(f"/api/agents/{watcher}/mode", json={"mode": "Observe"}).status_code == 200
    out = _tool(d, watcher, "task_post", title="t", description="d")
    assert out.startswith("permission denied: tool 'task_post' is not available to this agent"), out
    for tool in ("task_claim", "event_publish", "agent_activate", "task_complete"):
        assert "permission denied" in _tool(d, watcher, tool, **({"event_type": "x"} if tool == "event_publish"
                                                                else {"agent_id": watcher}
                                                                if tool == "agent_activate" else {}))
    assert _tool(d, watcher, "task_list").startswith(("[", "no tasks"))


def test_event_publish_and_agent_activate(agent_daemon) -> None:
    d = agent_daemon
    caller, _ = _agent(d)
    target, target_name = _agent(d)
    out = _tool(d, caller, "event_publish", event_type="build_done", payload={"ok": True})
    assert out.startswith("published event ") and out.endswith(" (build_done)")
    event_id = out.split()[2]
    entry = next(e for e in _audit(d, "tool.event_publish") if e["detail"]["event_id"] == event_id)
    assert entry["detail"]["agent_id"] == caller and entry["detail"]["event_type"] == "build_done"
    assert json.loads(_tool(d, caller, "agent_activate", agent_id=target_name)) == {
        "agent_id": target, "name": target_name, "state": "Running", "was": "Running"}
    assert _tool(d, caller, "agent_activate", agent_id="ghost") == (
        "error: no agent with id or name 'ghost' (terminated agents cannot be revived)")
    assert any(e["detail"]["target"] == target for e in _audit(d, "tool.agent_activate"))


def test_a_keys_run_sees_and_reaches_only_the_tasks_and_agents_of_the_key(keyed) -> None:
    d = keyed
    mine, mine_name = _agent(d)
    outside, outside_name = _agent(d)
    secret = d.post("/api/tasks", json={"title": "secret plan", "description": "classified",
                                        "assigned_to": outside_name}).json()
    # Posted by the agent outside the list (older than the shared one: an admin's claim takes it first).
    theirs = json.loads(_tool(d, outside, "task_post", title="their chore", description="theirs"))["task_id"]
    shared = d.post("/api/tasks", json={"title": "shared chore", "description": ""}).json()
    key = new_key(d, scopes=["read", "message", "manage"], agents=[mine_name])

    # The tool lists what GET /api/tasks shows the key.
    listed = json.loads(_key_tool(d, key, mine, "task_list"))
    assert [t["id"] for t in listed] == [t["id"] for t in as_key(d, key, "GET", "/api/tasks").json()] == [shared["id"]]
    # A task for an agent outside the list is refused as the API refuses it: as for an unknown agent.
    refused = as_key(d, key, "POST", "/api/tasks", json={"title": "t", "assigned_to": outside_name})
    assert refused.status_code == 404
    assert _key_tool(d, key, mine, "task_post", title="t", description="d", assigned_to=outside_name) == (
        f"error: {refused.json()['error']}") == f"error: no agent with id or name '{outside_name}'"
    assert [t["title"] for t in d.get("/api/tasks").json()].count("t") == 0
    # A claim takes the oldest task the key sees; completing a task it does not see finds none.
    assert json.loads(_key_tool(d, key, mine, "task_claim"))["id"] == shared["id"]
    assert d.get(f"/api/tasks/{theirs}").json()["status"] == "pending"
    assert _key_tool(d, key, mine, "task_complete", task_id=secret["id"], result="x") == "error: task not found"
    assert _key_tool(d, key, mine, "task_claim") == "no pending task to claim"
    assert _key_tool(d, key, mine, "task_complete", task_id=shared["id"], result="done") == (
        f"completed task {shared['id']}")
    # agent_activate: an agent outside the list is an unknown one.
    assert _key_tool(d, key, mine, "agent_activate", agent_id=outside_name) == (
        f"error: no agent with id or name '{outside_name}' (terminated agents cannot be revived)")
    assert not any(e["detail"]["target"] == outside for e in _audit(d, "tool.agent_activate"))
    assert json.loads(_key_tool(d, key, mine, "agent_activate", agent_id=mine_name))["agent_id"] == mine
    # The admin's run sees the whole board, as before.
    assert secret["id"] in _tool(d, mine, "task_list", status="pending")  # (the model sees 500 characters)


def test_a_keys_run_changes_the_board_only_with_the_scope_the_api_needs(keyed) -> None:
    d = keyed
    caller, caller_name = _agent(d)
    task = d.post("/api/tasks", json={"title": "for the talker", "description": "", "assigned_to": caller}).json()
    talker = new_key(d, scopes=["message"], agents=[caller_name])
    r = as_key(d, talker, "POST", "/api/tasks", json={"title": "by the talker"})
    missing = f"error: forbidden: API key '{talker['name']}' is missing scope"
    assert r.status_code == 403 and f"error: {r.json()['error']}" == f"{missing} 'manage'"
    assert _key_tool(d, talker, caller, "task_post", title="by the talker", description="x") == f"{missing} 'manage'"
    assert _key_tool(d, talker, caller, "task_claim") == f"{missing} 'manage'"
    assert _key_tool(d, talker, caller, "task_complete", task_id=task["id"], result="x") == f"{missing} 'manage'"
    assert _key_tool(d, talker, caller, "task_list") == f"{missing} 'read'"
    assert d.get(f"/api/tasks/{task['id']}").json()["status"] == "pending"
    assert "by the talker" not in [t["title"] for t in d.get("/api/tasks").json()]
    # With `manage`, the same run posts and claims.
    manager = new_key(d, scopes=["message", "manage"], agents=[caller_name])
    assert json.loads(_key_tool(d, manager, caller, "task_post", title="by the manager", description="x"))[
        "status"] == "pending"
    assert json.loads(_key_tool(d, manager, caller, "task_claim"))["id"] == task["id"]
