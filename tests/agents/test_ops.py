"""What tools may do to other agents (agentd/agents/ops.py), through a real manager.

Listing and finding (near-miss queries), sends (unknown target, self-send, nested
runs, a refused target), spawn and kill on behalf of an agent, KV and memory access, and the
task board, events and activation on a real board and bus (what each call audits, exactly).
In a run paid by a scoped API key (real keys on the same store): only the key's agents are
listed, messaged and killed, the nested run is the key's, and a disabled key stops all three.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentd.agents.cooperation import Cooperation
from agentd.agents.ops import AgentOpsImpl
from agentd.agents.tools import ToolError
from agentd.apikeys import ApiKeys
from agentd.key_budgets import KeyBudgets
from agentd.key_runs import KeyRuns
from agentd.tasks.board import TaskBoard
from agentd.triggers.bus import CUSTOM, EventBus
from mgrsupport import Env, Recorder, llm_config, manifest, run, submit, fake  # noqa: F401 (fake: a fixture)
from support import wait_until


@pytest.fixture()
def env(tmp_path: Path, fake, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    e = Env(tmp_path, llm_config(fake))
    yield e
    e.close()


@pytest.fixture()
def mgr(env):
    return env.manager()


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


class Board:
    """A real task board and event bus as the kernel gives them to the agents' operations,
    with the audit callback recorded and the bus's events collected."""

    def __init__(self, env: Env, mgr) -> None:
        self.mgr = mgr
        self.tasks = TaskBoard(env.store, mgr.registry.find)
        self.bus = EventBus()
        self.events: list = []
        self.bus.subscribe(self.events.append)
        self.audit = Recorder()

    def ops(self, audit: bool = True, **kw) -> AgentOpsImpl:
        cooperation = Cooperation(self.tasks, self.bus, self.audit if audit else None)
        return AgentOpsImpl(self.mgr.registry, self.mgr.runs, self.mgr.runs.kv, cooperation=cooperation, **kw)


@pytest.fixture()
def board(env, mgr):
    b = Board(env, mgr)
    yield b
    b.bus.close()


def test_without_a_board_the_cooperation_calls_are_tool_errors(mgr) -> None:
    a = spawn(mgr, "a")
    ops = mgr.runs.ops_for(a)
    assert ops.cooperation is None and ops.origin == ""
    calls = [lambda: ops.task_post(a.id, "t", "d", None), lambda: ops.task_claim(a.id),
             lambda: ops.task_complete(a.id, "x", "r"), lambda: ops.task_list(a.id, None),
             lambda: ops.event_publish(a.id, "e", {})]
    for call in calls:
        with pytest.raises(ToolError) as err:
            call()
        assert str(err.value) == "the task board and events are not available here"


def test_task_post_claim_complete_and_list_audit_each_call(board) -> None:
    boss, worker = spawn(board.mgr, "boss"), spawn(board.mgr, "worker")
    ops = board.ops()
    posted = ops.task_post(boss.id, "Summarise", "two lines", "worker")
    assert (posted["title"], posted["description"], posted["status"], posted["assigned_to"], posted["created_by"]) == (
        "Summarise", "two lines", "pending", worker.id, boss.id)
    assert board.tasks.get(posted["id"]) == posted
    assert board.audit.calls == [("tool.task_post", "boss", {"agent_id": boss.id, "task_id": posted["id"]})]
    for bad, message in ((lambda: ops.task_post(boss.id, "x", "y", "ghost"), "no agent with id or name 'ghost'"),
                         (lambda: ops.task_post(boss.id, "", "y", None), "title: must be a non-empty string"),
                         (lambda: ops.task_list(boss.id, "nonsense"),
                          "status: must be one of pending, in_progress, completed")):
        with pytest.raises(ToolError) as err:
            bad()
        assert str(err.value) == message
    assert len(board.audit.calls) == 1, "a refused call is not audited"

    assert ops.task_list(boss.id, "pending") == [posted]
    assert ops.task_list(boss.id, "completed") == []
    assert board.audit.calls[1:] == [("tool.task_list", "boss", {"agent_id": boss.id, "status": "pending", "count": 1}),
                                     ("tool.task_list", "boss", {"agent_id": boss.id, "status": "completed",
                                                                 "count": 0})]
    del board.audit.calls[:]

    assert ops.task_claim(boss.id) is None, "a task assigned to another agent is not the boss's to claim"
    assert board.audit.calls == [], "claiming nothing is not audited"
    claimed = ops.task_claim(worker.id)
    assert (claimed["id"], claimed["status"], claimed["claimed_by"]) == (posted["id"], "in_progress", worker.id)
    assert board.audit.calls == [("tool.task_claim", "worker", {"agent_id": worker.id, "task_id": posted["id"]})]
    with pytest.raises(ToolError) as err:
        ops.task_complete(boss.id, posted["id"], "mine")
    assert str(err.value) == f"task {posted['id']} was claimed by another agent"
    done = ops.task_complete(worker.id, posted["id"], "done")
    assert (done["status"], done["result"]) == ("completed", "done")
    assert board.audit.calls[1:] == [("tool.task_complete", "worker", {"agent_id": worker.id,
                                                                      "task_id": posted["id"]})]
    with pytest.raises(ToolError) as err:
        ops.task_complete(worker.id, posted["id"], "again")
    assert str(err.value) == f"task {posted['id']} is completed, not in_progress"
    assert len(board.audit.calls) == 2


def test_event_publish_carries_the_agent_and_the_runs_origin(board) -> None:
    a = spawn(board.mgr, "a")
    event_id = board.ops(origin="trigger").event_publish(a.id, "build_done", {"ok": True})
    plain_id = board.ops().event_publish(a.id, "plain", {})
    deadline = time.monotonic() + 5
    while len(board.events) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    first, second = board.events
    assert (first.id, first.kind, first.type, first.payload, first.agent_id, first.origin) == (
        event_id, CUSTOM, "build_done", {"ok": True}, a.id, "trigger")
    assert (second.id, second.type, second.origin) == (plain_id, "plain", ""), "outside a run the origin is empty"
    assert board.audit.calls == [
        ("tool.event_publish", "a", {"agent_id": a.id, "event_id": event_id, "event_type": "build_done"}),
        ("tool.event_publish", "a", {"agent_id": a.id, "event_id": plain_id, "event_type": "plain"})]


def test_activate_agent_marks_it_running_and_says_what_it_was(board) -> None:
    a, b = spawn(board.mgr, "a"), spawn(board.mgr, "b")
    ops = board.ops()
    board.mgr.registry.set_state(b, "Suspended")
    assert ops.activate_agent(a.id, "b") == {"agent_id": b.id, "name": "b", "state": "Running", "was": "Suspended"}
    assert b.state == "Running" and board.mgr.registry.get(b.id).state == "Running"
    assert ops.activate_agent(a.id, b.id) == {"agent_id": b.id, "name": "b", "state": "Running", "was": "Running"}
    assert board.audit.calls == [("tool.agent_activate", "a", {"agent_id": a.id, "target": b.id, "was": "Suspended"}),
                                 ("tool.agent_activate", "a", {"agent_id": a.id, "target": b.id, "was": "Running"})]
    with pytest.raises(ToolError) as err:
        ops.activate_agent(a.id, "ghost")
    assert str(err.value) == "no agent with id or name 'ghost' (terminated agents cannot be revived)"
    assert len(board.audit.calls) == 2


def test_the_audit_names_a_caller_that_is_gone_by_its_id_and_is_optional(board) -> None:
    a = spawn(board.mgr, "a")
    board.ops().task_post("gone-agent", "t", "", None)
    assert board.audit.calls[0][:2] == ("tool.task_post", "gone-agent")
    assert board.audit.calls[0][2]["agent_id"] == "gone-agent"
    task = board.ops(audit=False).task_post(a.id, "quiet", "", None)
    assert board.tasks.get(task["id"])["title"] == "quiet" and len(board.audit.calls) == 1


def test_kv_writes_carry_the_origin_of_the_run_they_happen_in(mgr) -> None:
    a = spawn(mgr, "a")
    spawn(mgr, "b", extra='profile = "full"\n')
    heard = Recorder()
    mgr.runs.kv.on_change = heard
    mgr.runs.ops_for(a, "trigger").kv_set(a.id, "k", 1)
    AgentOpsImpl(mgr.registry, mgr.runs, mgr.runs.kv).kv_set(a.id, "k", 2)
    # A message one agent sends another starts a run of origin "agent": the target's writes say so.
    mgr.runs.ops_for(a).send_to_agent(a.id, "b", '[[tool:memory_store {"key": "n", "value": "v"}]]')
    b = mgr.by_name("b")
    assert heard.calls == [(a.id, "k", 1, False, "trigger"), (a.id, "k", 2, False, ""), (b.id, "n", "v", False, "agent")]


def test_a_nested_send_runs_on_the_calling_thread_and_waits_at_most_its_timeout(mgr, monkeypatch) -> None:
    a, b = spawn(mgr, "a"), spawn(mgr, "b")
    ops = mgr.runs.ops_for(a)
    # Both workers of the pool busy: a nested send does not queue for one.
    busy = [submit(mgr, spawn(mgr, f"busy{n}"), "[[slow:3]] busy") for n in range(2)]
    started = time.monotonic()
    assert ops.send_to_agent(a.id, "b", "now") == "echo: now"
    assert time.monotonic() - started < 2.5, "the nested run waited for a worker of the pool"
    # The target busy past the nested timeout: the send gives up, as a tool error.
    assert [f.result(10).response for f in busy] == ["echo: busy", "echo: busy"]
    monkeypatch.setattr(AgentOpsImpl, "NESTED_LOCK_TIMEOUT", 0.3)
    slow = submit(mgr, b, "[[slow:3]] long")
    wait_until(b.run_lock.locked, "b's run holds the agent")
    started = time.monotonic()
    with pytest.raises(ToolError) as err:
        ops.send_to_agent(a.id, "b", "later")
    assert str(err.value) == "agent b is busy with another run"
    assert time.monotonic() - started < 2.5, "the nested send waited past its timeout"
    assert slow.result(10).response == "echo: long"


def test_an_agents_message_is_not_held_to_the_clients_64_kb(mgr) -> None:
    a = spawn(mgr, "a")
    spawn(mgr, "b")
    text = "x" * (64 * 1024 + 1)
    assert mgr.runs.ops_for(a).send_to_agent(a.id, "b", text) == "echo: " + text


def test_without_a_registry_the_audit_names_the_caller_by_its_id(env, mgr) -> None:
    board = Board(env, mgr)
    try:
        ops = AgentOpsImpl(None, mgr.runs, mgr.runs.kv, cooperation=Cooperation(board.tasks, board.bus, board.audit))
        task = ops.task_post("caller-id", "t", "", None)
        assert board.audit.calls == [("tool.task_post", "caller-id", {"agent_id": "caller-id", "task_id": task["id"]})]
    finally:
        board.bus.close()


class Keyed:
    """A manager whose runs know scoped API keys as the kernel wires them (real keys and
    budgets on the test's store); each run's budget check is recorded."""

    def __init__(self, env: Env) -> None:
        self.budget = Recorder()
        self.mgr = env.manager(key_budget=self.budget)
        self.keys = ApiKeys(env.store, "admin-secret", env.audit, KeyBudgets(env.store, env.audit))
        self.mgr.runs.key_runs = KeyRuns(self.keys, self.mgr.find, lambda workflow_id: [])

    def key(self, agents: list[str], scopes: tuple[str, ...] = ("message",)) -> str:
        return self.keys.create({"name": f"k{len(self.keys.list())}", "scopes": list(scopes), "agents": agents})["id"]


def test_a_keys_run_lists_messages_and_kills_only_the_keys_agents(env) -> None:
    keyed = Keyed(env)
    mgr = keyed.mgr
    boss, mine, outside = spawn(mgr, "boss"), spawn(mgr, "minion-1", "helps"), spawn(mgr, "bystander", "helps")
    key_id = keyed.key(["boss", "minion-*"])   # `message` only: nothing beyond what started the run
    ops = mgr.runs.ops_for(boss, key_id=key_id)
    assert [a["name"] for a in ops.list_agents()] == ["boss", "minion-1"]
    assert [a["name"] for a in ops.find_agents("helps")] == ["minion-1"]
    # Without a key the same agent's operations see and reach everyone.
    assert [a["name"] for a in AgentOpsImpl(mgr.registry, mgr.runs, mgr.runs.kv).list_agents()] == [
        "boss", "minion-1", "bystander"]

    for target in ("bystander", outside.id):
        with pytest.raises(ToolError) as err:
            ops.send_to_agent(boss.id, target, "hi")
        assert str(err.value) == f"no agent with id or name {target!r}"
    assert keyed.budget.calls == [] and not outside.session_tail, "no run of an agent outside the key's list"
    assert ops.send_to_agent(boss.id, "minion-1", "hi there") == "echo: hi there"
    assert keyed.budget.calls == [(key_id,)], "the nested run is the key's: checked against its budget"
    assert mine.session_tail[-1] == {"role": "assistant", "content": "echo: hi there"}

    with pytest.raises(ToolError) as err:
        ops.kill_agent(boss.id, "bystander")
    assert str(err.value) == "no agent with id or name 'bystander'"
    assert mgr.find("bystander") is outside and not outside.killed
    ops.kill_agent(boss.id, "minion-1")
    assert mgr.find("minion-1") is None and mine.killed
    # An agent the key's run spawns is the key's (its manifest's schedules act as the key).
    child = ops.spawn_agent(boss.id, 'name = "minion-2"\n[model]\nprovider = "openai"\nmodel = "gpt-4o"\n')
    assert mgr.get(child["agent_id"]).key_id == key_id
    # One it could never reach is refused, and not made.
    with pytest.raises(ToolError) as err:
        ops.spawn_agent(boss.id, 'name = "stray"\n[model]\nprovider = "openai"\nmodel = "gpt-4o"\n')
    assert "may only spawn agents its list names (boss, minion-*), not 'stray'" in str(err.value)
    assert mgr.find("stray") is None
    admins = AgentOpsImpl(mgr.registry, mgr.runs, mgr.runs.kv).spawn_agent(
        boss.id, 'name = "minion-3"\n[model]\nprovider = "openai"\nmodel = "gpt-4o"\n')
    assert mgr.get(admins["agent_id"]).key_id == ""


def test_a_disabled_or_deleted_key_stops_its_runs_agent_operations(env) -> None:
    keyed = Keyed(env)
    mgr = keyed.mgr
    boss, _ = spawn(mgr, "boss"), spawn(mgr, "minion")
    key_id = keyed.key(["boss", "minion"])
    ops = mgr.runs.ops_for(boss, key_id=key_id)
    keyed.keys.update(key_id, {"enabled": False})
    name = keyed.keys.get(key_id)["name"]
    for call in (ops.list_agents, lambda: ops.send_to_agent(boss.id, "minion", "hi"),
                 lambda: ops.kill_agent(boss.id, "minion")):
        with pytest.raises(ToolError) as err:
            call()
        assert str(err.value) == f"API key '{name}' is disabled"
    assert mgr.find("minion") is not None and keyed.budget.calls == []
    keyed.keys.delete(key_id)
    with pytest.raises(ToolError) as err:
        ops.list_agents()
    assert str(err.value) == f"the API key that created it was deleted (key id {key_id})"


def test_a_key_where_keys_are_not_wired_is_a_tool_error(mgr) -> None:
    a, _ = spawn(mgr, "a"), spawn(mgr, "b")
    ops = mgr.runs.ops_for(a, key_id="some-key")
    for call in (ops.list_agents, lambda: ops.send_to_agent(a.id, "b", "hi"), lambda: ops.kill_agent(a.id, "b")):
        with pytest.raises(ToolError) as err:
            call()
        assert str(err.value) == "scoped API keys are not available here"
    assert mgr.find("b") is not None


def test_an_event_published_in_a_keys_run_is_the_keys(board) -> None:
    a = spawn(board.mgr, "a")
    keyed_id = board.ops(key_id="key-1").event_publish(a.id, "keyed", {})
    plain_id = board.ops().event_publish(a.id, "plain", {})
    deadline = time.monotonic() + 5
    while len(board.events) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [(e.id, e.key_id) for e in board.events] == [(keyed_id, "key-1"), (plain_id, "")]
