"""What tools may do to other agents (agentd/agents/ops.py), through a real manager.

Listing and finding (near-miss queries), sends (unknown target, self-send, nested
runs, a refused target), spawn and kill on behalf of an agent, KV and memory access.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentd.agents.ops import AgentOpsImpl
from agentd.agents.tools import ToolError
from mgrsupport import Env, llm_config, manifest, run, fake  # noqa: F401 (fake: a fixture)


@pytest.fixture()
def mgr(tmp_path: Path, fake, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    e = Env(tmp_path, llm_config(fake))
    yield e.manager()
    e.close()


def spawn(mgr, name: str, description: str = "", tags: str = "[]", extra: str = ""):
    return mgr.spawn(f'name = "{name}"\ndescription = "{description}"\ntags = {tags}\n{extra}'
                     '[model]\nprovider = "openai"\nmodel = "gpt-4o"\n')


def test_list_agents_exact(mgr) -> None:
    a = spawn(mgr, "alpha", "Writes Code", '["Dev", "py"]')
    b = spawn(mgr, "beta")
    mgr.set_mode(b, "Observe")
    ops = mgr.runs.ops_for(a)
    assert isinstance(ops, AgentOpsImpl)
    assert (ops.registry, ops.runs, ops.kv, ops.memory) == (mgr.registry, mgr.runs, mgr.runs.kv, None)
    assert ops.list_agents() == [
        {"id": a.id, "name": "alpha", "state": "Running", "mode": "Auto", "model": "openai/gpt-4o",
         "description": "Writes Code", "tags": ["Dev", "py"]},
        {"id": b.id, "name": "beta", "state": "Running", "mode": "Observe", "model": "openai/gpt-4o",
         "description": "", "tags": []}]
    mgr.kill(b)
    assert [x["name"] for x in ops.list_agents()] == ["alpha"]


def test_find_agents_matches_name_description_or_a_tag(mgr) -> None:
    spawn(mgr, "Alpha", "writes code", '["Dev"]')
    spawn(mgr, "beta", "reviews", '["qa", "ops"]')
    ops = mgr.runs.ops_for(mgr.by_name("Alpha"))
    names = lambda q: [x["name"] for x in ops.find_agents(q)]   # noqa: E731
    assert names("ALPH") == ["Alpha"] and names("CODE") == ["Alpha"] and names("dev") == ["Alpha"]
    assert names("QA") == ["beta"] and names("view") == ["beta"] and names("op") == ["beta"]
    assert names("") == ["Alpha", "beta"] and names("zzz") == [] and names("alphax") == []


def test_send_to_another_agent_runs_it(mgr) -> None:
    a = spawn(mgr, "a")
    b = spawn(mgr, "b")
    ops = mgr.runs.ops_for(a)
    assert ops.send_to_agent(a.id, "b", "hello b") == "echo: hello b"
    assert ops.send_to_agent(a.id, b.id, "by id") == "echo: by id"
    assert b.session_tail[-1] == {"role": "assistant", "content": "echo: by id"}
    assert AgentOpsImpl.NESTED_LOCK_TIMEOUT == 30.0


def test_send_near_misses(mgr) -> None:
    a = spawn(mgr, "a")
    spawn(mgr, "b")
    ops = mgr.runs.ops_for(a)
    for target in ("B", "b ", "", "c"):
        with pytest.raises(ToolError) as err:
            ops.send_to_agent(a.id, target, "x")
        assert str(err.value) == f"no agent with id or name {target!r}"
    for target in ("a", a.id):
        with pytest.raises(ToolError) as err:
            ops.send_to_agent(a.id, target, "x")
        assert str(err.value) == "an agent cannot send a message to itself"


def test_a_refused_nested_run_is_a_tool_error(mgr) -> None:
    a = spawn(mgr, "a")
    spawn(mgr, "limited", extra="[capabilities]\nmax_llm_tokens_per_hour = 1\n")
    ops = mgr.runs.ops_for(a)
    ops.send_to_agent(a.id, "limited", "one")
    with pytest.raises(ToolError) as err:
        ops.send_to_agent(a.id, "limited", "two")
    assert str(err.value).startswith("message delivery failed: quota exceeded: ")


def test_a_nested_send_through_the_loop(mgr) -> None:
    a = spawn(mgr, "a", extra='profile = "messaging"\n')
    spawn(mgr, "b")
    result = run(mgr, a, '[[tool:agent_send {"agent_id": "b", "message": "nested hi"}]]')
    assert result.response == "tool said: echo: nested hi"


def test_spawn_and_kill_on_behalf_of_an_agent(mgr) -> None:
    a = spawn(mgr, "a")
    ops = mgr.runs.ops_for(a)
    got = ops.spawn_agent(a.id, 'name = "child"\n[model]\nprovider = "openai"\nmodel = "gpt-4o"\n')
    child = mgr.by_name("child")
    assert got == {"agent_id": child.id, "name": "child"}
    with pytest.raises(ToolError) as err:
        ops.spawn_agent(a.id, 'name = "child"\n')
    assert str(err.value) == "an agent named 'child' already exists"
    with pytest.raises(ToolError) as err:
        ops.kill_agent(a.id, "nobody")
    assert str(err.value) == "no agent with id or name 'nobody'"
    for me in ("a", a.id):
        with pytest.raises(ToolError) as err:
            ops.kill_agent(a.id, me)
        assert str(err.value) == "an agent cannot kill itself"
    assert ops.kill_agent(a.id, "child") is None
    assert mgr.find("child") is None and child.killed and mgr.find("a") is a


def test_kv_and_memory(mgr) -> None:
    a = spawn(mgr, "a")
    b = spawn(mgr, "b")
    ops = mgr.runs.ops_for(a)
    ops.kv_set(a.id, "k", {"v": 1})
    assert ops.kv_get(a.id, "k") == (True, {"v": 1}) and ops.kv_get(b.id, "k") == (False, None)
    assert mgr.runs.kv.get(a.id, "k") == (True, {"v": 1})
    with pytest.raises(ToolError) as err:
        ops.memory_service()
    assert str(err.value) == "semantic memory is not available here"
    marker = object()
    assert AgentOpsImpl(mgr.registry, mgr.runs, mgr.runs.kv, marker).memory_service() is marker
