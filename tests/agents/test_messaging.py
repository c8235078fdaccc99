"""Agent-to-agent tools through the running daemon's agent manager (no stand-ins): several
agents in one daemon, the fake LLM scripted to call agent_send / agent_list / agent_find."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.agents.test_agents import say, spawn

MESSAGING = 'profile = "messaging"'


def _name() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"


def _tools(d, agent_id: str) -> list[dict]:
    messages = d.get(f"/api/agents/{agent_id}/session").json()["messages"]
    return [t for m in messages for t in m.get("tools", [])]


def _send(target: str, message: str) -> str:
    return "[[tool:agent_send " + json.dumps({"agent_id": target, "message": message}) + "]]"


@pytest.fixture()
def trio(agent_daemon):
    names = [_name() for _ in range(3)]
    ids = [spawn(agent_daemon, n, MESSAGING) for n in names]
    return list(zip(ids, names))


def test_agent_send_reaches_the_other_agent(agent_daemon, trio) -> None:
    d = agent_daemon
    (a, _), (b, b_name), _ = trio
    body = say(d, a, _send(b_name, "hello from a")).json()
    assert body["response"] == "tool said: echo: hello from a"
    [call] = _tools(d, a)
    assert call["name"] == "agent_send" and call["is_error"] is False and call["result"] == "echo: hello from a"
    b_session = d.get(f"/api/agents/{b}/session").json()["messages"]
    assert b_session == [{"role": "User", "content": "hello from a"},
                         {"role": "Assistant", "content": "echo: hello from a"}], \
        "the target agent's own session holds the conversation"
    # By id as well as by name.
    body = say(d, a, _send(b, "by id")).json()
    assert body["response"] == "tool said: echo: by id"


def test_agent_send_to_itself_is_refused(agent_daemon, trio) -> None:
    d = agent_daemon
    (a, a_name), _, _ = trio
    for target in (a_name, a):
        body = say(d, a, _send(target, "talking to myself")).json()
        assert body["response"] == "tool said: error: an agent cannot send a message to itself", \
            "BUG: an agent is allowed to send a message to itself"
    calls = _tools(d, a)
    assert all(c["is_error"] for c in calls) and len(calls) == 2
    session = d.get(f"/api/agents/{a}/session").json()["messages"]
    assert not any(m["content"] == "talking to myself" for m in session if m["role"] == "User"), \
        "BUG: a self-sent message reached the agent's own session"


def test_agent_send_to_unknown_target(agent_daemon, trio) -> None:
    d = agent_daemon
    (a, _), _, _ = trio
    ghost = _name()
    body = say(d, a, _send(ghost, "anyone?")).json()
    assert body["response"] == f"tool said: error: no agent with id or name '{ghost}'"
    missing = str(uuid.uuid4())
    body = say(d, a, _send(missing, "anyone?")).json()
    assert body["response"] == f"tool said: error: no agent with id or name '{missing}'"


def test_nested_agent_send(agent_daemon, trio) -> None:
    d = agent_daemon
    (a, _), (b, b_name), (c, c_name) = trio
    # a asks b to ask c: b's model (the fake) follows the directive in the message it receives.
    body = say(d, a, _send(b_name, _send(c_name, "deep message"))).json()
    assert body["response"] == "tool said: tool said: echo: deep message", body
    assert [t["result"] for t in _tools(d, b)] == ["echo: deep message"]
    assert d.get(f"/api/agents/{c}/session").json()["messages"][0] == {"role": "User", "content": "deep message"}
    assert d.get(f"/api/agents/{a}").json()["state"] in ("Running", "Idle", "running", "idle")


def test_nested_self_send_is_refused(agent_daemon, trio) -> None:
    """a asks b to message b itself: the nested call is refused with a tool error."""
    d = agent_daemon
    (a, _), (b, b_name), _ = trio
    body = say(d, a, _send(b_name, _send(b_name, "loop"))).json()
    assert body["response"] == "tool said: tool said: error: an agent cannot send a message to itself"


def test_agent_list_and_find_show_the_daemons_agents(agent_daemon, trio) -> None:
    d = agent_daemon
    (a, a_name), (b, b_name), (c, c_name) = trio
    say(d, a, "[[tool:agent_list]]")
    [call] = _tools(d, a)
    assert call["is_error"] is False, call
    listed = json.loads(call["result"])
    by_name = {x["name"]: x for x in listed}
    assert {a_name, b_name, c_name} <= set(by_name)
    assert by_name[b_name]["id"] == b and by_name[b_name]["description"] == f"test agent {b_name}"
    assert by_name[b_name]["tags"] == ["test"] and by_name[b_name]["model"] == "openai/gpt-4o"
    assert len(listed) == len(d.get("/api/agents").json())
    finder = spawn(d, _name(), 'profile = "full"')   # agent_find is not in the messaging profile
    say(d, finder, "[[tool:agent_find " + json.dumps({"query": c_name.upper()}) + "]]")
    found = json.loads(_tools(d, finder)[-1]["result"])
    assert [x["id"] for x in found] == [c], "agent_find matches names case-insensitively"
    say(d, finder, "[[tool:agent_find " + json.dumps({"query": "no-such-" + uuid.uuid4().hex}) + "]]")
    assert json.loads(_tools(d, finder)[-1]["result"]) == []


def test_agent_send_needs_the_grant(agent_daemon) -> None:
    d = agent_daemon
    target = _name()
    spawn(d, target, MESSAGING)
    lonely = spawn(d, _name(), 'profile = "minimal"')
    body = say(d, lonely, _send(target, "hi")).json()
    assert "permission denied" in body["response"]
    assert d.get(f"/api/agents/{lonely}").json()["name"] != target
