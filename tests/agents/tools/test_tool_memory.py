"""Memory tools and system_time in process, on the real memory stack: the agent operations the
daemon gives tools (agents/ops.py) over a real store's KV memory and a real MemoryService
(local embedding model, SQLite). Exact tool answers, what reaches the store, per-agent isolation.
The daemon's loop runs the same tools in tests/memory/test_semantic.py::test_memory_tools_in_the_loop.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pony import orm

from agentd.agents.ops import AgentOpsImpl
from agentd.agents.tools import ToolContext, ToolError, get_tool, validate_args
from agentd.config import MemoryConfig, ToolsConfig
from agentd.timestamps import utcnow
from agentd.memory.kv import KvMemory
from agentd.memory.service import MemoryService
from agentd.store import open_store


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    store = open_store(tmp_path_factory.mktemp("mem") / "agentd.db")
    ids = []
    for name in ("alpha", "beta"):
        agent_id = str(uuid.uuid4())
        with orm.db_session:
            store.e.AgentRow(id=agent_id, name=name, manifest_toml="x", manifest={}, created_at=utcnow(),
                             last_active=utcnow(), session_id=str(uuid.uuid4()))
        ids.append(agent_id)
    service = MemoryService(MemoryConfig(), store)
    return SimpleNamespace(store=store, service=service, kv=KvMemory(store), a=ids[0], b=ids[1])


def ctx_for(stack, agent_id: str, tmp_path: Path) -> ToolContext:
    return ToolContext(agent_id, tmp_path, {}, ToolsConfig(), ops=AgentOpsImpl(None, None, stack.kv, stack.service),
                       cancel=threading.Event())


@pytest.fixture()
def a(stack, tmp_path):
    return ctx_for(stack, stack.a, tmp_path)


@pytest.fixture()
def b(stack, tmp_path):
    return ctx_for(stack, stack.b, tmp_path)


def run(ctx: ToolContext, tool_name: str, /, **args: Any) -> str:
    tool = get_tool(tool_name)
    validate_args(tool, args)
    return tool.run(ctx, args)


def error(ctx: ToolContext, tool_name: str, /, **args: Any) -> str:
    with pytest.raises(ToolError) as info:
        run(ctx, tool_name, **args)
    return str(info.value)


def test_kv_store_and_recall_are_per_agent(stack, a, b) -> None:
    key = "k-" + uuid.uuid4().hex[:6]
    assert run(a, "memory_recall", key=key) == f"no value stored under {key}"
    assert run(a, "memory_store", key=key, value="tea") == f"stored {key}"
    assert stack.kv.get(stack.a, key) == (True, "tea")
    assert run(a, "memory_recall", key=key) == "tea", "a text value comes back as is, not JSON-quoted"
    assert run(b, "memory_recall", key=key) == f"no value stored under {key}", "BUG: KV leaks between agents"
    assert run(b, "memory_store", key=key, value={"a": [1, 2], "ü": None}) == f"stored {key}"
    assert run(b, "memory_recall", key=key) == '{"a": [1, 2], "\\u00fc": null}'
    assert run(a, "memory_recall", key=key) == "tea"
    assert run(a, "memory_store", key=key, value=None) == f"stored {key}"
    assert run(a, "memory_recall", key=key) == "null", "a stored null is found, not 'no value stored'"
    assert run(a, "memory_store", key=key, value=7) == f"stored {key}"
    assert run(a, "memory_recall", key=key) == "7"


def test_remember_stores_what_the_model_gave(stack, a) -> None:
    out = run(a, "memory_remember", content="The staging server is in Frankfurt", scope="episodic",
              metadata={"team": "ops"}, confidence=0.5)
    match = re.fullmatch(r"remembered as memory ([0-9a-f-]{36})", out)
    assert match, out
    got = stack.service.get(stack.a, match.group(1))
    assert (got["content"], got["source"], got["scope"], got["metadata"], got["confidence"]) == (
        "The staging server is in Frankfurt", "inference", "episodic", {"team": "ops"}, 0.5)
    again = run(a, "memory_remember", content="The staging server is in Frankfurt", scope="episodic")
    assert again == f"merged into memory {match.group(1)}", "a near-duplicate is merged into the first"
    plain = run(a, "memory_remember", content="Invoices are due on the fifth of each month")
    got = stack.service.get(stack.a, plain.rsplit(" ", 1)[1])
    assert (got["source"], got["scope"], got["metadata"], got["confidence"]) == ("inference", "semantic", {}, 1.0)


def test_remember_refusals_reach_the_model_as_tool_errors(a) -> None:
    assert error(a, "memory_remember", content="x", confidence=2) == "confidence must be a number between 0 and 1"
    assert error(a, "memory_remember", content="") == "content must be a non-empty string"


def test_search_answers_exact_fields_with_limit_and_scope(stack, b) -> None:
    facts = {"Der Zähler steht in Köln": "places", "The cat sleeps on the sofa": "pets",
             "The dog sleeps in the garden": "pets"}
    ids = {run(b, "memory_remember", content=text, scope=scope).rsplit(" ", 1)[1]: text
           for text, scope in facts.items()}
    out = run(b, "memory_search", query="Where does the cat sleep?")
    found = json.loads(out)
    assert len(found) == 3 and {f["id"] for f in found} == set(ids)
    assert all(list(f) == ["id", "content", "score", "scope", "created_at"] for f in found)
    assert found[0]["content"] == "The cat sleeps on the sofa" and found[0]["scope"] == "pets"
    assert found[0]["score"] >= found[1]["score"] >= found[2]["score"]
    assert "Zähler" in out and "Köln" in out, "the answer keeps non-ASCII text readable"
    stored = stack.service.get(stack.b, found[0]["id"])
    assert found[0]["created_at"] == stored["created_at"]
    assert len(json.loads(run(b, "memory_search", query="Where does the cat sleep?", limit=2))) == 2
    pets = json.loads(run(b, "memory_search", query="Where does the cat sleep?", scope="pets"))
    assert sorted(f["content"] for f in pets) == ["The cat sleeps on the sofa", "The dog sleeps in the garden"]
    everything = json.loads(run(b, "memory_search", query="Where does the cat sleep?", scope=""))
    assert len(everything) == 3, "an empty scope is no filter"
    assert run(b, "memory_search", query="cats", scope="nothing-here") == "no memories found"
    assert error(b, "memory_search", query="cats", limit=0) == "limit must be an integer between 1 and 100"


def test_search_default_limit_is_five(stack, tmp_path) -> None:
    agent_id = str(uuid.uuid4())
    with orm.db_session:
        stack.store.e.AgentRow(id=agent_id, name="gamma", manifest_toml="x", manifest={}, created_at=utcnow(),
                               last_active=utcnow(), session_id=str(uuid.uuid4()))
    c = ctx_for(stack, agent_id, tmp_path)
    for i, word in enumerate(["apples", "bridges", "clouds", "drums", "engines", "forests"]):
        run(c, "memory_remember", content=f"Note {i}: the report mentions {word} many times")
    assert len(json.loads(run(c, "memory_search", query="report"))) == 5


def test_knowledge_graph_tools(stack, a) -> None:
    dana = run(a, "knowledge_add_entity", name="Dana", entity_type="person", properties={"role": "cto"})
    assert re.fullmatch(r"entity Dana has id [0-9a-f-]{36}", dana), dana
    run(a, "knowledge_add_entity", name="Globex", entity_type="organization")
    run(a, "knowledge_add_entity", name="Berlin", entity_type="location")
    out = run(a, "knowledge_add_relation", source="Dana", relation="works_at", target="Globex",
              properties={"since": 2020}, confidence=0.4)
    assert re.fullmatch(r"relation Dana works_at Globex has id [0-9a-f-]{36}", out), out
    run(a, "knowledge_add_relation", source="Globex", relation="located_in", target="Berlin")
    [match] = stack.service.query_graph(stack.a, "Dana", None, None, 1)
    assert (match["source"]["entity_type"], match["source"]["properties"]) == ("person", {"role": "cto"})
    assert (match["relation"]["properties"], match["relation"]["confidence"]) == ({"since": 2020}, 0.4)
    assert match["target"]["entity_type"] == "organization"
    assert json.loads(run(a, "knowledge_query", source="Dana")) == [
        {"source": "Dana", "relation": "works_at", "target": "Globex", "depth": 1}], "the default depth is 1"
    assert json.loads(run(a, "knowledge_query", source="Dana", max_depth=2)) == [
        {"source": "Dana", "relation": "works_at", "target": "Globex", "depth": 1},
        {"source": "Globex", "relation": "located_in", "target": "Berlin", "depth": 2}]
    assert json.loads(run(a, "knowledge_query", relation="located_in")) == [
        {"source": "Globex", "relation": "located_in", "target": "Berlin", "depth": 1}]
    assert json.loads(run(a, "knowledge_query", target="Globex")) == [
        {"source": "Dana", "relation": "works_at", "target": "Globex", "depth": 1}]
    assert run(a, "knowledge_query", source="Dana", relation="knows") == "no matches"
    assert error(a, "knowledge_add_relation", source="Dana", relation="knows", target="Nobody") == (
        "entity not found: Nobody")
    assert error(a, "knowledge_query", source="Dana", max_depth=0) == "max_depth must be an integer of at least 1"


def test_unicode_entity_names_stay_readable(stack, b) -> None:
    run(b, "knowledge_add_entity", name="Zoë", entity_type="person")
    run(b, "knowledge_add_entity", name="Café Ünter", entity_type="organization")
    run(b, "knowledge_add_relation", source="Zoë", relation="owns", target="Café Ünter")
    assert run(b, "knowledge_query", source="Zoë") == (
        '[{"source": "Zoë", "relation": "owns", "target": "Café Ünter", "depth": 1}]')


def test_without_semantic_memory(stack, tmp_path) -> None:
    ctx = ToolContext(stack.a, tmp_path, {}, ToolsConfig(), ops=AgentOpsImpl(None, None, stack.kv, None))
    for name, args in (("memory_remember", {"content": "x"}), ("memory_search", {"query": "x"}),
                       ("knowledge_add_entity", {"name": "x", "entity_type": "person"}),
                       ("knowledge_query", {})):
        assert error(ctx, name, **args) == "semantic memory is not available here"
    ctx.ops = None
    assert error(ctx, "memory_remember", content="x") == "agent operations are not available here"


def test_system_time_is_utc_iso_and_unix_of_the_same_moment(a) -> None:
    before = time.time()
    out = run(a, "system_time")
    after = time.time()
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)Z \(unix (\d+)\)", out)
    assert match, f"BUG: system_time format changed: {out!r}"
    stamp = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    unix = int(match.group(2))
    assert int(before) <= unix <= after and int(before) <= stamp <= after, (out, before, after)
