"""agent_spawn and agent_kill through the running daemon (no stand-ins): the fake LLM calls the
tools, the daemon's agent manager spawns and kills real agents, the answers are exact.
agent_send / agent_list / agent_find between several agents are in tests/agents/test_messaging.py."""

from __future__ import annotations

import json
import uuid

from tests.agents.test_agents import say, spawn

SPAWNER = 'profile = "full"\n[capabilities]\nagent_spawn = true'


def _name() -> str:
    return f"k-{uuid.uuid4().hex[:8]}"


def _call(tool: str, **args) -> str:
    return f"[[tool:{tool} " + json.dumps(args) + "]]"


def _answer(d, agent_id: str, text: str) -> str:
    r = say(d, agent_id, text)
    assert r.status_code == 200, r.text
    return r.json()["response"]


def test_agent_spawn_starts_a_real_agent_and_agent_kill_removes_it(agent_daemon) -> None:
    d = agent_daemon
    parent = spawn(d, _name(), SPAWNER)
    child = _name()
    out = _answer(d, parent, _call("agent_spawn", manifest_toml=f'name = "{child}"\ndescription = "spawned"\n'))
    assert out.startswith("tool said: ")
    made = json.loads(out[len("tool said: "):])
    assert list(made) == ["agent_id", "name"] and made["name"] == child
    got = d.get(f"/api/agents/{made['agent_id']}")
    assert got.status_code == 200 and got.json()["name"] == child
    assert _answer(d, parent, _call("agent_kill", agent_id=child)) == f"tool said: killed agent {child}"
    assert d.get(f"/api/agents/{made['agent_id']}").status_code == 404
    # By id as well.
    second = spawn(d, _name())
    assert _answer(d, parent, _call("agent_kill", agent_id=second)) == f"tool said: killed agent {second}"
    assert d.get(f"/api/agents/{second}").status_code == 404


def test_agent_kill_refusals(agent_daemon) -> None:
    d = agent_daemon
    name = _name()
    killer = spawn(d, name, SPAWNER)
    for target in (name, killer):
        assert _answer(d, killer, _call("agent_kill", agent_id=target)) == (
            "tool said: error: an agent cannot kill itself")
    assert d.get(f"/api/agents/{killer}").status_code == 200
    ghost = _name()
    assert _answer(d, killer, _call("agent_kill", agent_id=ghost)) == (
        f"tool said: error: no agent with id or name '{ghost}'")


def test_agent_spawn_refusals(agent_daemon) -> None:
    d = agent_daemon
    parent = spawn(d, _name(), SPAWNER)
    assert _answer(d, parent, _call("agent_spawn", manifest_toml="name = 5")) == (
        "tool said: error: invalid manifest format: name: Not a valid string.")
    taken = _name()
    spawn(d, taken)
    out = _answer(d, parent, _call("agent_spawn", manifest_toml=f'name = "{taken}"'))
    assert out.startswith("tool said: error: ") and taken in out, out
    # Named in the tool list, but the agent_spawn capability is not granted.
    without = spawn(d, _name(), '[capabilities]\ntools = ["agent_spawn", "agent_list"]')
    out = _answer(d, without, _call("agent_spawn", manifest_toml=f'name = "{_name()}"'))
    assert out.startswith("tool said: permission denied: tool 'agent_spawn' is not available to this agent"), out
