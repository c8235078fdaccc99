"""agentd/memory/service.py in process: the real MemoryService on a real SQLite store with a
scripted embedder (tests/memsupport.py; every new text gets its own axis, so a query vector
chooses exactly which fragments score and in which order). Argument defaults and limits, the
recall block the model reads, the skip of exchanges still in the session's window, the per-run
context cache, the background worker's batches, forget, the schedule, close."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Any, Callable

import numpy as np
import pytest
from pony import orm

from agentd.config import MemoryConfig
from agentd.errors import BadRequest
from agentd.memory import exchanges as exchanges_mod, fields, fragment_rows, service as service_mod
from agentd.memory.service import MemoryService
from agentd.store import open_store

from memsupport import ScriptedEmbedder, add_agent, add_agents
from support import wait_until

DIMS = 1536
WAIT = 20.0




class AxisEmbedder(ScriptedEmbedder):
    """Each text not scripted gets the next basis vector; `query(text, {stored: weight})`
    scripts a query whose cosine with each stored text is its weight."""

    def __init__(self) -> None:
        super().__init__(dims=DIMS)
        self.next_axis = 0
        self.gate: threading.Event | None = None  # when set: embed waits for it
        self.entered = threading.Event()
        self.fail = False
        self.hooks: dict[str, Callable[[], None]] = {}  # text -> called once when it is embedded

    def axis(self, text: str) -> int:
        if text not in self.vectors:
            v = np.zeros(DIMS, dtype=np.float32)
            v[self.next_axis] = 1.0
            self.next_axis += 1
            self.vectors[text] = v
        return int(np.argmax(self.vectors[text]))

    def query(self, text: str, weights: dict[str, float]) -> None:
        v = np.zeros(DIMS, dtype=np.float32)
        for stored, w in weights.items():
            v[self.axis(stored)] = w
        rest = 1.0 - float(np.sum(v * v))
        v[DIMS - 1] = np.sqrt(max(rest, 0.0))  # the last axis is never given to a text
        self.vectors[text] = v

    def embed(self, texts: list[str]) -> np.ndarray:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(WAIT)
        if self.fail:
            raise RuntimeError("embedder down")
        for t in texts:
            hook = self.hooks.pop(t, None)
            if hook is not None:
                hook()
        for t in texts:
            self.axis(t)
        return super().embed(texts)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = add_agents(open_store(tmp_path_factory.mktemp("svc") / "agentd.db"))
    yield s
    s.close()


def make(store, **config: Any) -> tuple[MemoryService, AxisEmbedder]:
    svc = MemoryService(MemoryConfig(**config), store)
    emb = AxisEmbedder()
    svc._embedder = emb  # the embedder the service would build (the local model) is scripted
    return svc, emb


@pytest.fixture()
def svc(store):
    s, emb = make(store)
    s.emb = emb  # type: ignore[attr-defined]
    yield s
    s.close()


def bad(fn: Callable[[], Any]) -> str:
    with pytest.raises(BadRequest) as info:
        fn()
    return info.value.message if hasattr(info.value, "message") else str(info.value)


def count_rows(store, agent_id: str, table: str = "memory_fragments") -> int:
    with orm.db_session:
        return store.db.select(f"SELECT COUNT(*) FROM {table} WHERE agent_id = $a", {"a": agent_id})[0]


# -- constants, construction, lazily built parts ----------------------------------------------

def test_constants() -> None:
    assert service_mod.QUEUE_LIMIT == 1000
    assert service_mod.WORKER_BATCH == 32
    assert exchanges_mod.WORKER_WAIT_SECS == 0.02
    assert service_mod.CONTEXT_HEADING == "## Relevant memories"
    assert (service_mod.ASKED, service_mod.ANSWERED) == ("User asked: ", "\nI responded: ")


def test_fresh_service_loads_nothing(store) -> None:
    s = MemoryService(MemoryConfig(), store)
    assert s.loaded is False and s._semantic is None and s._embedder is None
    assert s._queue.maxsize == 1000
    assert s.on_change is None and s._worker is None and s._scheduler is None
    assert s._cache_empty is True, "BUG: a database of its own caches empty counts"
    shared = MemoryService(MemoryConfig(), dataclasses.replace(store, backend="postgres"))
    assert shared._cache_empty is False, "BUG: a shared database must not cache empty counts"


def test_provider_embedder_needs_the_endpoint_lookup(store) -> None:
    s = MemoryService(MemoryConfig(embedding_provider="openai", embedding_model="m1"), store)
    with pytest.raises(RuntimeError) as info:
        s.embedder
    assert str(info.value) == "provider embeddings need the kernel's endpoint lookup"
    asked: list[str] = []
    s = MemoryService(MemoryConfig(embedding_provider="openai", embedding_model="m1"), store,
                      endpoint=lambda p: asked.append(p) or "EP", retries=7)
    from agentd.memory.embedder import LocalEmbedder, ProviderEmbedder

    emb = s.embedder
    assert isinstance(emb, ProviderEmbedder)
    assert (emb.provider, emb.model, emb.name, emb._retries) == ("openai", "m1", "openai/m1", 7)
    assert emb._endpoint() == "EP" and asked == ["openai"]
    assert s.embedder is emb, "BUG: the embedder must be built once"
    local = MemoryService(MemoryConfig(embed_threads=3), store).embedder
    assert isinstance(local, LocalEmbedder) and local._threads == 3
    s = MemoryService(MemoryConfig(embedding_provider="p", embedding_model="m"), store, endpoint=lambda p: "EP")
    assert s.embedder._retries == 3, "BUG: three retries by default"


def test_semantic_is_built_once_and_reports_writes(svc) -> None:
    changed: list[str] = []
    svc.on_change = changed.append
    sem = svc.semantic
    assert svc.loaded is True and svc.semantic is sem
    assert sem.embedder is svc.emb
    a = add_agent(svc.store)
    sem.remember(a, "hello there")
    assert changed == [a]


# -- argument defaults and limits -------------------------------------------------------------

def test_remember_defaults_and_explicit_values(svc) -> None:
    a = add_agent(svc.store)
    fid = svc.remember(a, "the sky is blue")["id"]
    got = svc.get(a, fid)
    assert (got["content"], got["source"], got["scope"], got["metadata"], got["confidence"]) == \
        ("the sky is blue", "user_provided", "semantic", {}, 1.0)
    fid = svc.remember(a, "grass is green", source="observation", scope="s" * fields.MAX_NAME,
                       metadata={"k": 1}, confidence=0.25)["id"]
    got = svc.get(a, fid)
    assert (got["source"], got["scope"], got["metadata"], got["confidence"]) == \
        ("observation", "s" * fields.MAX_NAME, {"k": 1}, 0.25)
    fid = svc.remember(a, "x" * fields.MAX_CONTENT)["id"]
    assert len(svc.get(a, fid)["content"]) == fields.MAX_CONTENT
    assert bad(lambda: svc.remember(a, "")) == "content must be a non-empty string"
    assert bad(lambda: svc.remember(a, "x" * (fields.MAX_CONTENT + 1))) == \
        f"content is too long ({fields.MAX_CONTENT + 1} characters, limit {fields.MAX_CONTENT})"
    assert bad(lambda: svc.remember(a, "c", scope="s" * (fields.MAX_NAME + 1))) == \
        f"scope is too long ({fields.MAX_NAME + 1} characters, limit {fields.MAX_NAME})"
    assert bad(lambda: svc.remember(a, "c", source="nope")).startswith("source must be one of ")
    assert bad(lambda: svc.remember(a, "c", metadata=[1])) == "metadata must be a JSON object"
    assert bad(lambda: svc.remember(a, "c", confidence=2)) == "confidence must be a number between 0 and 1"
    assert bad(lambda: svc.remember(a, "c", scope="")) == "scope must be a non-empty string"
    assert svc.page(a, 10, 0)["total"] == 3


def test_recall_defaults_limits_and_filter(svc) -> None:
    a = add_agent(svc.store)
    texts = [f"fact number {i}" for i in range(8)]
    for t in texts:
        svc.remember(a, t)
    svc.emb.query("which facts", {t: 0.4 - 0.03 * i for i, t in enumerate(texts)})  # apart by more than a near tie
    got = svc.recall(a, "which facts")
    assert [f["content"] for f in got] == texts[:5], "BUG: the default limit is 5, best first"
    got = svc.recall(a, "which facts", limit=1)
    assert [f["content"] for f in got] == texts[:1]
    got = svc.recall(a, "which facts", limit=100)
    assert [f["content"] for f in got] == texts
    got = svc.recall(a, "which facts", limit=100, min_score=0.3)
    assert [f["content"] for f in got] == texts[:4]
    got = svc.recall(a, "which facts", limit=100, flt={"source": "observation"})
    assert got == []
    assert bad(lambda: svc.recall(a, "which facts", limit=0)) == "limit must be an integer between 1 and 100"
    assert bad(lambda: svc.recall(a, "which facts", limit=101)) == "limit must be an integer between 1 and 100"
    assert bad(lambda: svc.recall(a, "which facts", min_score=2)) == "min_score must be a number between -1 and 1"
    assert bad(lambda: svc.recall(a, "")) == "query must be a non-empty string"
    assert bad(lambda: svc.recall(a, "q", flt={"nope": 1})).startswith("filter has unknown field(s) nope")
    # The spec's agent_id filter: the agent's own id matches, another's matches nothing.
    got = svc.recall(a, "which facts", limit=100, flt={"agent_id": a})
    assert [f["content"] for f in got] == texts
    assert svc.recall(a, "which facts", limit=100, flt={"agent_id": add_agent(svc.store)}) == []
    assert bad(lambda: svc.recall(a, "q", flt={"agent_id": 5})) == "filter.agent_id must be a non-empty string"
    assert bad(lambda: svc.recall(a, "", flt={"agent_id": "other"})) == "query must be a non-empty string"


def test_recall_without_min_score_keeps_zero_scores(svc) -> None:
    a = add_agent(svc.store)
    svc.remember(a, "unrelated thing")
    svc.emb.query("orthogonal question", {})
    got = svc.recall(a, "orthogonal question")
    assert [(f["content"], f["score"]) for f in got] == [("unrelated thing", 0.0)]


def test_page_get_delete_and_their_limits(svc) -> None:
    a = add_agent(svc.store)
    ids = [svc.remember(a, f"page item {i}")["id"] for i in range(3)]
    page = svc.page(a, 1000, 2**31)
    assert page["total"] == 3 and page["memories"] == []
    assert len(svc.page(a, 1, 0)["memories"]) == 1
    assert len(svc.page(a, 2, 1)["memories"]) == 2
    assert bad(lambda: svc.page(a, 0, 0)) == "limit must be an integer between 1 and 1000"
    assert bad(lambda: svc.page(a, 1001, 0)) == "limit must be an integer between 1 and 1000"
    assert bad(lambda: svc.page(a, 1, -1)) == f"offset must be an integer between 0 and {2**31}"
    assert bad(lambda: svc.page(a, 1, 2**31 + 1)) == f"offset must be an integer between 0 and {2**31}"
    svc.delete(a, ids[0])
    assert svc.page(a, 10, 0)["total"] == 2
    assert svc.get(a, ids[1])["content"] == "page item 1"


def test_graph_arguments(svc) -> None:
    a = add_agent(svc.store)
    assert svc.add_entity(a, "person", "  Alice  ")["created"] is True
    assert svc.add_entity(a, {"custom": "robot"}, "R2", {"color": "blue"})["created"] is True
    svc.add_entity(a, "person", "Bob")
    svc.add_relation(a, "Alice", "knows", "R2")
    svc.add_relation(a, "R2", "knows", "Bob", {"since": 1}, 0.5)
    doc = svc.export(a)
    assert sorted((e["name"], e["entity_type"], e["properties"]) for e in doc["entities"]) == \
        [("Alice", "person", {}), ("Bob", "person", {}), ("R2", "robot", {"color": "blue"})]
    [first] = svc.query_graph(a, "Alice")
    assert (first["relation"]["properties"], first["relation"]["confidence"]) == ({}, 1.0)
    [second] = svc.query_graph(a, "R2")
    assert (second["relation"]["properties"], second["relation"]["confidence"]) == ({"since": 1}, 0.5)
    assert bad(lambda: svc.add_entity(a, "person", "n" * (fields.MAX_NAME + 1))) == \
        f"name is too long ({fields.MAX_NAME + 1} characters, limit {fields.MAX_NAME})"
    assert bad(lambda: svc.add_entity(a, "", "x")) == "entity_type must be a non-empty string"
    assert bad(lambda: svc.add_entity(a, "person", "x", [1])) == "properties must be a JSON object"
    long = "n" * (fields.MAX_NAME + 1)
    assert bad(lambda: svc.add_relation(a, long, "knows", "Bob")) == \
        f"source is too long ({fields.MAX_NAME + 1} characters, limit {fields.MAX_NAME})"
    assert bad(lambda: svc.add_relation(a, "Alice", "knows", long)) == \
        f"target is too long ({fields.MAX_NAME + 1} characters, limit {fields.MAX_NAME})"
    assert bad(lambda: svc.add_relation(a, "", "knows", "Bob")) == "source must be a non-empty string"
    assert bad(lambda: svc.add_relation(a, "Alice", "", "Bob")) == "relation must be a non-empty string"
    assert bad(lambda: svc.add_relation(a, "Alice", "knows", "")) == "target must be a non-empty string"
    assert bad(lambda: svc.add_relation(a, "Alice", "knows", "Bob", [1])) == "properties must be a JSON object"
    assert bad(lambda: svc.add_relation(a, "Alice", "knows", "Bob", None, 3)) == \
        "confidence must be a number between 0 and 1"

    def names(result):
        return sorted((m["source"]["name"], m["relation"]["relation"], m["target"]["name"]) for m in result)

    assert names(svc.query_graph(a, "Alice")) == [("Alice", "knows", "R2")], "BUG: the default depth is 1"
    assert names(svc.query_graph(a, "Alice", max_depth=2)) == [("Alice", "knows", "R2"), ("R2", "knows", "Bob")]
    assert names(svc.query_graph(a, target="Bob")) == [("R2", "knows", "Bob")]
    assert names(svc.query_graph(a, relation="knows")) == [("Alice", "knows", "R2"), ("R2", "knows", "Bob")]
    assert names(svc.query_graph(a)) == [("Alice", "knows", "R2"), ("R2", "knows", "Bob")]
    assert svc.query_graph(a, relation="likes") == []
    assert len(svc.query_graph(a, "Alice", max_depth=fields.MAX_DEPTH)) == 2
    assert len(svc.query_graph(a, "Alice", max_depth=fields.MAX_DEPTH + 1)) == 2, "clamped, not refused"
    msg = "max_depth must be an integer of at least 1"
    assert bad(lambda: svc.query_graph(a, "Alice", max_depth=0)) == msg
    assert bad(lambda: svc.query_graph(a, "Alice", max_depth=1.5)) == msg
    assert bad(lambda: svc.query_graph(a, "Alice", max_depth=0.0)) == msg
    assert bad(lambda: svc.query_graph(a, "Alice", max_depth=float("inf"))) == msg
    assert len(svc.query_graph(a, "Alice", max_depth=2.0)) == 2, "2.0 is the integer 2"
    assert bad(lambda: svc.query_graph(a, "")) == "source must be a non-empty string"
    assert bad(lambda: svc.query_graph(a, target="")) == "target must be a non-empty string"
    assert bad(lambda: svc.query_graph(a, relation="")) == "relation must be a non-empty string"
    assert bad(lambda: svc.query_graph(a, "n" * (fields.MAX_NAME + 1))) == \
        f"source is too long ({fields.MAX_NAME + 1} characters, limit {fields.MAX_NAME})"


def test_consolidate_is_of_the_agent(store) -> None:
    s, emb = make(store, decay_days=-1)  # every fragment counts as not recalled for a day
    a, b = add_agent(store), add_agent(store)
    s.remember(a, "decaying fact")
    s.remember(b, "other fact")
    report = s.consolidate(a)
    assert (report["memories_merged"], report["memories_decayed"], report["memories_dropped"]) == (0, 1, 0)
    assert s.page(a, 10, 0)["memories"][0]["confidence"] == 0.9
    assert s.page(b, 10, 0)["memories"][0]["confidence"] == 1.0


def test_consolidate_export_import_report_changes(svc) -> None:
    changed: list[str] = []
    svc.on_change = changed.append
    a, b = add_agent(svc.store), add_agent(svc.store)
    svc.remember(a, "portable fact")
    svc.add_entity(a, "person", "Carol")
    changed.clear()
    report = svc.consolidate(a)
    assert set(report) == {"memories_merged", "memories_decayed", "memories_dropped", "duration_ms"}
    assert changed == [a]
    doc = svc.export(a)
    assert [m["content"] for m in doc["memories"]] == ["portable fact"]
    assert [e["name"] for e in doc["entities"]] == ["Carol"]
    assert changed == [a], "BUG: an export changes nothing"
    result = svc.import_doc(b, doc)
    assert result["memories_imported"] == 1 and changed == [a, b]
    assert [f["content"] for f in svc.page(b, 10, 0)["memories"]] == ["portable fact"]
    with pytest.raises(BadRequest):
        svc.import_doc(b, {"bad": 1})
    assert changed == [a, b, b], "BUG: a failed import still reports a (possible) change"


# -- forget -----------------------------------------------------------------------------------

def test_forget_agent_loaded_and_not_loaded(store, svc) -> None:
    a, b = add_agent(store), add_agent(store)
    for agent in (a, b):
        svc.remember(agent, f"fact of {agent}", metadata={"k": "v"})
        svc.add_entity(agent, "person", "Dana")
    changed: list[str] = []
    svc.on_change = changed.append
    svc._exchanges[a] = {"x": "y"}
    svc.forget_agent(a)
    assert a in svc._dead and a not in svc._exchanges and changed == [a]
    assert count_rows(store, a) == 0 and count_rows(store, a, "memory_metadata") == 0
    assert count_rows(store, a, "kg_entities") == 0
    assert svc.page(a, 10, 0)["total"] == 0
    assert count_rows(store, b) == 1 and count_rows(store, b, "kg_entities") == 1
    # a daemon that never loaded semantic memory deletes in SQL, without loading it
    fresh = MemoryService(MemoryConfig(), store)
    fresh.forget_agent(b)
    assert fresh.loaded is False
    assert count_rows(store, b) == 0 and count_rows(store, b, "memory_metadata") == 0
    assert count_rows(store, b, "kg_entities") == 0
    assert b in fresh._dead


# -- recall before model calls ----------------------------------------------------------------

def block(*contents: str) -> str:
    lines = "\n".join(f"- {c}" for c in contents)
    return ("## Relevant memories\nFacts remembered from earlier conversations, most relevant first "
            f"(newer facts override older ones):\n{lines}")


def test_system_context_block_exact(svc) -> None:
    a = add_agent(svc.store)
    svc.remember(a, "Alice likes tea")
    svc.remember(a, "Bob likes coffee")
    svc.remember(a, "weather is nice")
    svc.emb.query("what do they like?", {"Alice likes tea": 0.5, "Bob likes coffee": 0.9})
    assert svc.system_context(a, "what do they like?", [], "You are helpful.") == \
        "You are helpful.\n\n" + block("Bob likes coffee", "Alice likes tea")
    assert svc.system_context(a, "what do they like?", [], "") == block("Bob likes coffee", "Alice likes tea")
    svc.emb.query("nothing related", {"weather is nice": 0.29})
    assert svc.system_context(a, "nothing related", [], "S") == "S", "BUG: min_score 0.3 is the default"
    svc.emb.query("barely", {"weather is nice": 0.31})
    assert svc.system_context(a, "barely", [], "S") == "S\n\n" + block("weather is nice")


def test_system_context_limit_and_min_score_from_config(store) -> None:
    s, emb = make(store, recall_limit=2, min_score=0.5)
    a = add_agent(store)
    for t in ("t1", "t2", "t3"):
        s.remember(a, t)
    emb.query("q", {"t1": 0.4, "t2": 0.55, "t3": 0.6})
    assert s.system_context(a, "q", [], "S") == "S\n\n" + block("t3", "t2")
    emb.query("q3", {"t1": 0.52, "t2": 0.55, "t3": 0.6})
    s2, emb2 = make(store, recall_limit=3, min_score=0.5)
    s2._embedder = emb
    assert s2.system_context(a, "q3", [], "S") == "S\n\n" + block("t3", "t2", "t1")
    s3, _ = make(store, recall_limit=0)
    s3._embedder = emb
    assert s3.system_context(a, "q3", [], "S") == "S"
    assert s3.loaded is False, "BUG: recall_limit 0 must not load memory"
    s4, _ = make(store, recall_limit=1)
    s4._embedder = emb
    assert s4.system_context(a, "q3", [], "S") == "S\n\n" + block("t3")


def test_blank_user_text_recalls_nothing(svc) -> None:
    a = add_agent(svc.store)
    svc.remember(a, "something")
    calls = len(svc.emb.calls)
    assert svc.system_context(a, "  \n", [], "S") == "S"
    assert len(svc.emb.calls) == calls


def test_no_fragments_no_model_run(store) -> None:
    s, emb = make(store)
    a = add_agent(store)
    assert s.system_context(a, "hello", [], "S") == "S"
    assert s.loaded is False and emb.calls == [], "BUG: an agent without memories loads the model"
    assert a in s._empty
    # a write for the agent (here: by another service on the store, reported as invalidate)
    s2, emb2 = make(store)
    s2.remember(a, "hello fact")
    assert s.system_context(a, "hello", [], "S") == "S", "cached empty count"
    s.invalidate(a)
    assert a not in s._empty
    s._embedder = emb2
    emb2.query("hello", {"hello fact": 0.8})
    assert s.system_context(a, "hello", [], "S") == "S\n\n" + block("hello fact")


def test_invalidate_all_and_changed_clear_the_empty_cache(store) -> None:
    s, emb = make(store)
    a, b = add_agent(store), add_agent(store)
    assert s.system_context(a, "x", [], "S") == "S"
    assert s.system_context(b, "x", [], "S") == "S"
    assert s._empty == {a, b}
    s.invalidate(None)
    assert s._empty == set() and s._writes == 1
    s.system_context(a, "x", [], "S")
    s.system_context(b, "x", [], "S")
    s.invalidate(a)
    assert s._empty == {b} and s._writes == 2
    s._changed(b)
    assert s._empty == set() and s._writes == 3
    shared = MemoryService(MemoryConfig(), dataclasses.replace(store, backend="postgres"))
    assert shared.system_context(a, "x", [], "S") == "S"
    assert shared._empty == set(), "BUG: a shared database must not cache empty counts"


def test_invalidate_reaches_the_loaded_index(svc) -> None:
    a, b = add_agent(svc.store), add_agent(svc.store)
    svc.remember(a, "one")
    svc.remember(b, "two")
    assert svc.semantic.version(a) is not None and svc.semantic.version(b) is not None
    svc.invalidate(a)
    assert svc.semantic.version(a) is None and svc.semantic.version(b) is not None
    svc.remember(a, "one more")
    svc.invalidate()
    assert svc.semantic.version(a) is None and svc.semantic.version(b) is None


def test_a_count_racing_a_write_is_not_cached(store) -> None:
    s, emb = make(store)
    a = add_agent(store)
    real = s._count

    def count_then_write(agent_id: str) -> int:
        n = real(agent_id)
        s.invalidate(agent_id)  # another daemon's write reported while counting
        return n

    s._count = count_then_write  # type: ignore[method-assign]
    assert s.system_context(a, "x", [], "S") == "S"
    assert s._empty == set(), "BUG: an empty count that raced a write was cached"


def exchange(user: str, answer: str) -> str:
    return f"User asked: {user}\nI responded: {answer}"


def test_exchanges_in_the_window_are_skipped_and_older_ones_recalled(svc) -> None:
    a = add_agent(svc.store)
    svc.after_exchange(a, "s1", "my name is Ann", "Hello Ann")
    svc.after_exchange(a, "s1", "I live in Oslo", "Nice city")
    svc.drain()
    e1, e2 = exchange("my name is Ann", "Hello Ann"), exchange("I live in Oslo", "Nice city")
    assert [f["content"] for f in svc.page(a, 10, 0)["memories"]] == [e2, e1]
    # (an exchange's vector is its question's)
    svc.emb.query("who am I?", {"my name is Ann": 0.9, "I live in Oslo": 0.8})
    window = [{"role": "user", "content": "my name is Ann"}, {"role": "assistant", "content": "Hello Ann"},
              {"role": "user", "content": "I live in Oslo"}, {"role": "assistant", "content": "Nice city"}]
    calls = len(svc.emb.calls)
    assert svc.system_context(a, "who am I?", window, "S") == "S", "BUG: exchanges still in the window"
    assert len(svc.emb.calls) == calls, "BUG: only in-window exchanges: no model run"
    # the first exchange left the window: it is recalled again
    assert svc.system_context(a, "who am I?", window[2:], "S") == "S\n\n" + block(e1)
    assert list(svc._exchanges[a].values()) == ["I live in Oslo"]
    # an assistant message with the same text, or a non-text user content, is not the question
    odd = [{"role": "assistant", "content": "I live in Oslo"},
           {"role": "user", "content": [{"type": "text", "text": "I live in Oslo"}]}]
    assert svc.system_context(a, "who am I?", odd, "S") == "S\n\n" + block(e1, e2)


def test_in_session_skip_compares_the_whole_question(svc) -> None:
    a = add_agent(svc.store)
    svc.after_exchange(a, "s1", "tea", "yes")
    svc.drain()
    e = exchange("tea", "yes")
    svc.remember(a, "User asked: tea time")  # a fact that starts like the exchange
    svc.emb.query("drinks?", {"tea": 0.9, "User asked: tea time": 0.8})
    assert svc.system_context(a, "drinks?", [{"role": "user", "content": "tea"}], "S") == \
        "S\n\n" + block("User asked: tea time")
    assert svc.system_context(a, "drinks?", [{"role": "user", "content": "te"}], "S") == \
        "S\n\n" + block(e, "User asked: tea time")
    assert svc.system_context(a, "drinks?", [{"role": "user", "content": "tea\nI responded: yes"}], "S") == \
        "S\n\n" + block(e, "User asked: tea time")


def test_an_answer_holding_the_separator_is_still_the_same_exchange(svc) -> None:
    a = add_agent(svc.store)
    svc.after_exchange(a, "s1", "q", "x\nI responded: y")
    svc.drain()
    e = exchange("q", "x\nI responded: y")
    svc.remember(a, "a fact")
    svc.emb.query("recall", {e: 0.9, "a fact": 0.5})
    assert svc.system_context(a, "recall", [{"role": "user", "content": "q"}], "S") == "S\n\n" + block("a fact")


def test_a_deleted_exchange_does_not_hide_other_fragments(svc, caplog) -> None:
    a = add_agent(svc.store)
    svc.after_exchange(a, "s1", "q1", "a1")
    svc.after_exchange(a, "s1", "q2", "a2")
    svc.drain()
    window = [{"role": "user", "content": "q1"}, {"role": "user", "content": "q2"}]
    with caplog.at_level(logging.ERROR, logger="agentd.memory"):
        assert svc.system_context(a, "recall", window, "S") == "S"
    assert caplog.records == [], "BUG: the window check failed (and was logged as a failed recall)"
    e2 = [m for m in svc.page(a, 10, 0)["memories"] if m["content"] == exchange("q2", "a2")][0]
    svc.delete(a, e2["id"])
    svc.remember(a, "a fact")  # as many fragments as exchanges in the window, but not all of them
    svc.emb.query("recall", {exchange("q1", "a1"): 0.9, "a fact": 0.5})
    assert svc.system_context(a, "recall", window, "S") == "S\n\n" + block("a fact")


def test_other_fragments_are_recalled_beside_exchanges_in_the_window(svc) -> None:
    a = add_agent(svc.store)
    svc.after_exchange(a, "s1", "hi", "hello")
    svc.drain()
    svc.remember(a, "a fact")
    svc.emb.query("recall", {exchange("hi", "hello"): 0.9, "a fact": 0.5})
    assert svc.system_context(a, "recall", [{"role": "user", "content": "hi"}], "S") == "S\n\n" + block("a fact")


def test_a_failed_recall_returns_the_system_text(svc, caplog) -> None:
    a = add_agent(svc.store)
    svc.remember(a, "fact")
    svc.emb.fail = True
    with caplog.at_level(logging.ERROR, logger="agentd.memory"):
        assert svc.system_context(a, "unknown question", [], "S") == "S"
    assert [r.getMessage() for r in caplog.records] == [f"memory recall for agent {a} failed"]
    assert caplog.records[0].exc_info is not None


def test_context_for_run_searches_again_only_after_a_change(svc) -> None:
    a = add_agent(svc.store)
    first = svc.remember(a, "first fact")["id"]
    svc.emb.query("q", {"first fact": 0.9, "second fact": 0.8})
    svc.semantic.invalidate(a)  # not loaded: the first call loads it
    current = svc.context_for_run(a, "q", [], "S")
    assert current() == "S\n\n" + block("first fact")
    embeds = len(svc.emb.calls)
    assert current() == "S\n\n" + block("first fact")
    assert len(svc.emb.calls) == embeds, "BUG: unchanged memory embedded again"
    second = svc.remember(a, "second fact")["id"]
    assert current() == "S\n\n" + block("first fact", "second fact")
    assert current() == "S\n\n" + block("first fact", "second fact")
    assert svc.get(a, first)["access_count"] == 0, "BUG: counted before the run's write"
    svc.store.write(current.count_accesses)
    # Searched twice (at the start and after the change), not once per call.
    assert (svc.get(a, first)["access_count"], svc.get(a, second)["access_count"]) == (2, 1)


def test_a_write_racing_the_recall_is_searched_next_time(svc) -> None:
    a = add_agent(svc.store)
    fid = svc.remember(a, "first fact")["id"]
    svc.emb.query("race q", {"first fact": 0.9, "racing fact": 0.3})
    current = svc.context_for_run(a, "race q", [], "S")
    svc.emb.hooks["race q"] = lambda: svc.remember(a, "racing fact")  # lands while the recall runs
    assert current() == "S\n\n" + block("first fact", "racing fact")
    assert current() == "S\n\n" + block("first fact", "racing fact")
    assert current() == "S\n\n" + block("first fact", "racing fact")
    svc.store.write(current.count_accesses)
    assert svc.get(a, fid)["access_count"] == 2, "BUG: a write during the recall is taken as seen"


def test_a_run_counts_what_it_recalled_in_the_write_it_is_given(svc) -> None:
    a = add_agent(svc.store)
    fid = svc.remember(a, "the fact")["id"]
    untouched = svc.get(a, fid)["accessed_at"]
    svc.emb.query("q", {"the fact": 0.9})
    current = svc.context_for_run(a, "q", [], "S")
    assert current() == "S\n\n" + block("the fact")
    assert svc.get(a, fid)["access_count"] == 0
    statements: list = []

    class Tx:
        def execute(self, sql: str, params: dict) -> int:
            statements.append((sql, params))
            return 1

    current.count_accesses(Tx())
    assert [(sql, {k: v for k, v in params.items() if k != "now"}) for sql, params in statements] == [
        ("UPDATE memory_fragments SET accessed_at = $now, access_count = access_count + $n "
         "WHERE agent_id = $a AND id IN ($i0)", {"a": a, "n": 1, "i0": fid})]
    svc.store.write(current.count_accesses)
    got = svc.get(a, fid)
    assert got["access_count"] == 1 and got["accessed_at"] > untouched


def test_a_runs_count_on_postgresql_leaves_out_the_fragments_another_transaction_holds(tmp_path) -> None:
    import psycopg2
    import pgtest
    from agentd.store.backend import parse_database_url

    if pgtest.pg_bindir() is None and not os.environ.get("AGENTD_TEST_DATABASE_URL"):
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    url = pgtest.databases().new_url()
    store = add_agents(open_store(tmp_path / "agentd.db", parse_database_url(url, "test", allow_password=True)))
    svc, emb = make(store)
    try:
        a = add_agent(store)
        held, free = (svc.remember(a, text)["id"] for text in ("held fact", "free fact"))
        emb.query("q", {"held fact": 0.9, "free fact": 0.8})
        current = svc.context_for_run(a, "q", [], "S")
        assert current() == "S\n\n" + block("held fact", "free fact")
        other = psycopg2.connect(url)
        try:
            other.cursor().execute("SELECT id FROM memory_fragments WHERE id = %s FOR UPDATE", (held,))
            written = threading.Event()
            threading.Thread(target=lambda: (store.write(current.count_accesses), written.set()), daemon=True).start()
            assert written.wait(10), "BUG: the run's write waited on a row another transaction holds"
        finally:
            other.rollback()
            other.close()
        assert (svc.get(a, held)["access_count"], svc.get(a, free)["access_count"]) == (0, 1)
        # A recall asked for through the API counts every fragment it returns: it waits for
        # the row instead.
        other = psycopg2.connect(url)
        try:
            other.cursor().execute("SELECT id FROM memory_fragments WHERE id = %s FOR UPDATE", (held,))
            recalled: list = []
            asked = threading.Thread(target=lambda: recalled.append(svc.recall(a, "q")), daemon=True)
            asked.start()
            asked.join(0.5)
            assert asked.is_alive(), "the recall did not wait for the row it counts"
        finally:
            other.rollback()
            other.close()
        asked.join(10)
        assert [(f["content"], f["access_count"]) for f in recalled[0]] == [("held fact", 1), ("free fact", 2)]
        assert (svc.get(a, held)["access_count"], svc.get(a, free)["access_count"]) == (1, 2)
    finally:
        svc.close()
        store.close()


def test_a_runs_recall_sees_its_persons_exchanges_and_not_anothers(svc) -> None:
    a = add_agent(svc.store)
    for text, owner in (("alice's exchange", "user:alice"), ("bob's exchange", "user:bob")):
        svc.remember(a, text, source="conversation", scope="episodic", metadata={"owner": owner})
    svc.emb.query("q", {"alice's exchange": 0.9, "bob's exchange": 0.8})
    assert svc.context_for_run(a, "q", [], "S", owner="user:alice")() == "S\n\n" + block("alice's exchange")
    assert svc.context_for_run(a, "q", [], "S")() == "S\n\n" + block("alice's exchange", "bob's exchange")


def test_a_keys_recall_sees_its_own_and_its_peoples_exchanges_and_agent_wide_facts(svc) -> None:
    a = add_agent(svc.store)
    scores = {}
    for n, (text, owner) in enumerate((("the key's own", "key:k1"), ("its person's", "key:k1:user:ann"),
                                       ("another key's", "key:k12"), ("the agent's own session", ""))):
        svc.remember(a, text, source="conversation", scope="episodic", metadata={"owner": owner})
        scores[text] = 0.9 - n / 10
    # Not exchanges, whoever they name: agent-wide.
    svc.remember(a, "a fact for all", metadata={"owner": "key:k12"})
    svc.remember(a, "a summary for all", source="conversation", scope="semantic", metadata={"owner": "key:k12"})
    scores.update({"a fact for all": 0.4, "a summary for all": 0.35})
    svc.emb.query("q", scores)
    assert [m["content"] for m in svc.recall(a, "q", 10, 0, owner="key:k1")] == [
        "the key's own", "its person's", "a fact for all", "a summary for all"]
    assert [m["content"] for m in svc.recall(a, "q", 10, 0)] == list(scores)


def test_a_run_that_recalled_nothing_writes_nothing(svc) -> None:
    a = add_agent(svc.store)
    svc.remember(a, "unrelated fact")
    current = svc.context_for_run(a, "nothing like it", [], "S")
    assert current() == "S"

    class Tx:
        def execute(self, sql: str, params: dict) -> int:
            raise AssertionError(f"nothing to count, yet: {sql}")

    current.count_accesses(Tx())


def test_context_for_run_of_an_agent_without_memories(svc) -> None:
    a = add_agent(svc.store)
    current = svc.context_for_run(a, "q", [], "S")
    assert current() == "S"
    svc.emb.query("q", {"late fact": 0.9})
    svc.remember(a, "late fact")
    assert current() == "S\n\n" + block("late fact"), "BUG: a fact stored mid-run must reach the next call"


def test_context_for_run_when_nothing_is_loaded(store) -> None:
    s, emb = make(store)
    a = add_agent(store)
    current = s.context_for_run(a, "q", [], "S")
    assert current() == "S" and current() == "S"
    assert s.loaded is False


# -- the background worker --------------------------------------------------------------------

def test_after_exchange_stores_an_episodic_fragment(svc) -> None:
    a = add_agent(svc.store)
    changed: list[str] = []
    svc.on_change = changed.append
    svc.after_exchange(a, "sess-1", "question?", "answer!")
    svc.drain()
    [item] = svc.page(a, 10, 0)["memories"]
    assert (item["content"], item["source"], item["scope"], item["metadata"], item["confidence"]) == \
        ("User asked: question?\nI responded: answer!", "conversation", "episodic", {"session_id": "sess-1"}, 1.0)
    assert svc._exchanges[a] == {item["id"]: "question?"}
    assert changed == [a]
    assert svc._worker.name == "agentd-memory" and svc._worker.daemon is True
    worker = svc._worker
    svc.after_exchange(a, "sess-1", "again?", "again!")
    svc.drain()
    assert svc._worker is worker, "BUG: one worker per service"


def test_after_exchange_truncates_and_skips_blank_parts(svc) -> None:
    a = add_agent(svc.store)
    svc.after_exchange(a, "s", " ", "answer")
    svc.after_exchange(a, "s", "question", "\n")
    svc.drain()
    assert svc._worker is None and svc.page(a, 10, 0)["total"] == 0
    long = "y" * fields.MAX_CONTENT
    svc.after_exchange(a, "s", "q", long)
    svc.drain()
    [item] = svc.page(a, 10, 0)["memories"]
    assert item["content"] == ("User asked: q\nI responded: " + long)[:fields.MAX_CONTENT]
    assert len(item["content"]) == fields.MAX_CONTENT


def test_auto_remember_off(store) -> None:
    s, emb = make(store, auto_remember=False)
    a = add_agent(store)
    s.after_exchange(a, "s", "q", "a")
    assert s._worker is None and s._queue.qsize() == 0


def test_worker_batches_of_32_per_model_run(svc) -> None:
    a = add_agent(svc.store)
    svc.emb.gate = threading.Event()
    svc.after_exchange(a, "s", "first", "one")
    assert svc.emb.entered.wait(WAIT)
    for i in range(40):
        svc.after_exchange(a, "s", f"q{i}", f"a{i}")
    svc.emb.gate.set()
    svc.drain()
    assert [len(c) for c in svc.emb.calls] == [1, 32, 8]
    assert svc.page(a, 100, 0)["total"] == 41
    assert len(svc._exchanges[a]) == 41


def test_exchanges_sent_close_together_are_stored_in_one_pass(svc, monkeypatch) -> None:
    monkeypatch.setattr(exchanges_mod, "WORKER_WAIT_SECS", 1.0)
    a, b = add_agent(svc.store), add_agent(svc.store)
    calls = len(svc.emb.calls)
    started = time.monotonic()
    svc.after_exchange(a, "s", "one", "1")
    svc.after_exchange(b, "s", "two", "2")
    svc.after_exchange(a, "s", "three", "3")
    svc.drain()
    assert time.monotonic() - started >= 1.0, "BUG: the worker did not wait for more exchanges"
    assert svc.emb.calls[calls:] == [["one", "two", "three"]], "BUG: one model run per exchange"
    assert svc.page(a, 10, 0)["total"] == 2 and svc.page(b, 10, 0)["total"] == 1


def test_an_exchange_reuses_the_vector_its_recall_made(svc) -> None:
    a = add_agent(svc.store)
    svc.remember(a, "a fact to recall against")
    svc.emb.query("where do I live?", {"a fact to recall against": 0.5})
    svc.system_context(a, "where do I live?", [], "S")
    calls = len(svc.emb.calls)
    svc.after_exchange(a, "s", "where do I live?", "In Oslo")
    svc.drain()
    assert len(svc.emb.calls) == calls, "BUG: the exchange ran the model again"
    stored = svc.semantic.recall(a, "where do I live?", 5, touch=False)
    assert [(f["content"], f["score"]) for f in stored][0] == \
        ("User asked: where do I live?\nI responded: In Oslo", 1.0)


def test_exchanges_not_recalled_first_embed_their_questions_once_per_batch(svc) -> None:
    a = add_agent(svc.store)
    svc.emb.gate = threading.Event()
    svc.after_exchange(a, "s", "first", "one")
    assert svc.emb.entered.wait(WAIT)
    for answer in ("x", "y", "y"):
        svc.after_exchange(a, "s", "same question", answer)
    svc.after_exchange(a, "s", "other question", "z")
    svc.emb.gate.set()
    svc.drain()
    assert svc.emb.calls[-2:] == [["first"], ["same question", "other question"]]
    # The same question with another answer is a fragment of its own (the vector stands for
    # the question only); the very same exchange again merges.
    contents = sorted(f["content"] for f in svc.page(a, 10, 0)["memories"])
    assert contents == ["User asked: first\nI responded: one", "User asked: other question\nI responded: z",
                        "User asked: same question\nI responded: x", "User asked: same question\nI responded: y"]


def test_the_same_exchange_again_only_moves_accessed_at_unless_it_brings_more(svc, monkeypatch) -> None:
    a = add_agent(svc.store)
    svc.after_exchange(a, "s1", "hi", "hello")
    svc.drain()
    (first,) = svc.page(a, 10, 0)["memories"]
    svc.after_exchange(a, "s2", "hi", "hello")  # a new session id: merged into the metadata
    svc.drain()
    (second,) = svc.page(a, 10, 0)["memories"]
    assert second["id"] == first["id"] and second["metadata"] == {"session_id": "s2"}
    assert svc.semantic._metadata_ids(a, {"session_id": "s2"}) == {first["id"]}
    time.sleep(0.01)
    svc.after_exchange(a, "s2", "hi", "hello")
    svc.drain()
    assert svc.page(a, 10, 0)["memories"] == [second], "BUG: written again within RESTATED_SECS"
    monkeypatch.setattr(fragment_rows, "RESTATED_SECS", 0.0)
    svc.after_exchange(a, "s2", "hi", "hello")
    svc.drain()
    (third,) = svc.page(a, 10, 0)["memories"]
    assert third["metadata"] == {"session_id": "s2"} and third["accessed_at"] > second["accessed_at"]
    assert (third["created_at"], third["confidence"], third["access_count"]) == \
        (first["created_at"], 1.0, 0)


def test_exchanges_in_the_session_are_dropped_before_their_rows_are_read(svc, monkeypatch) -> None:
    a = add_agent(svc.store)
    svc.after_exchange(a, "s1", "where is my car?", "in the garage")
    svc.drain()
    svc.remember(a, "The car is blue")
    svc.emb.query("my car?", {"where is my car?": 0.9, "The car is blue": 0.8})
    read: list[list[str]] = []
    rows = svc.semantic._rows
    monkeypatch.setattr(svc.semantic, "_rows", lambda agent, ids: read.append(ids) or rows(agent, ids))
    window = [{"role": "user", "content": "where is my car?"}, {"role": "assistant", "content": "in the garage"}]
    assert svc.system_context(a, "my car?", window, "S") == "S\n\n" + block("The car is blue")
    (fact,) = [f["id"] for f in svc.page(a, 10, 0)["memories"] if f["content"] == "The car is blue"]
    assert read == [[fact]]


def test_embed_whole_exchange_runs_the_model_on_question_and_answer(store) -> None:
    s, emb = make(store, embed_whole_exchange=True)
    try:
        a = add_agent(store)
        s.after_exchange(a, "s", "where do I live?", "In Oslo")
        s.after_exchange(a, "s", "where do I live?", "In Oslo")
        s.drain()
        assert [t for call in emb.calls for t in call] == ["User asked: where do I live?\nI responded: In Oslo"] * 2
        assert s.page(a, 10, 0)["total"] == 1
    finally:
        s.close()


def test_a_full_queue_drops_the_exchange_with_a_warning(svc, caplog) -> None:
    a = add_agent(svc.store)
    svc.emb.gate = threading.Event()
    svc.after_exchange(a, "s", "first", "one")
    assert svc.emb.entered.wait(WAIT)
    with caplog.at_level(logging.WARNING, logger="agentd.memory"):
        for i in range(1000):
            svc.after_exchange(a, "s", f"q{i}", "a")
        assert caplog.records == []
        svc.after_exchange(a, "s", "one too many", "a")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == \
        [(logging.WARNING, f"memory queue full; exchange of agent {a} not remembered")]
    svc.emb.gate.set()
    svc.drain(60)
    assert svc.page(a, 10, 0)["total"] == 1001


def test_a_failed_batch_is_logged_and_the_worker_goes_on(svc, caplog) -> None:
    a, b = add_agent(svc.store), add_agent(svc.store)
    svc.emb.gate = threading.Event()
    svc.after_exchange(a, "s", "first", "one")
    assert svc.emb.entered.wait(WAIT)
    svc.after_exchange(a, "s", "q2", "a2")
    svc.after_exchange(b, "s", "q3", "a3")
    svc.emb.fail = True
    with caplog.at_level(logging.ERROR, logger="agentd.memory"):
        svc.emb.gate.set()
        svc.drain()
    assert sorted(r.getMessage() for r in caplog.records) == sorted([
        f"remembering 1 exchange(s) of agent {a} failed",
        f"remembering 1 exchange(s) of agent {a} failed",
        f"remembering 1 exchange(s) of agent {b} failed"])
    svc.emb.fail = False
    svc.after_exchange(b, "s", "q4", "a4")
    svc.drain()
    assert [i["content"] for i in svc.page(b, 10, 0)["memories"]] == [exchange("q4", "a4")]
    assert a not in svc._exchanges


def test_a_batch_whose_transaction_fails_is_stored_agent_by_agent(svc, monkeypatch) -> None:
    a, b = add_agent(svc.store), add_agent(svc.store)
    tried: list[list[str]] = []

    def fail(groups: Any, same_text_only: bool = False) -> Any:
        tried.append([agent for agent, _, _ in groups])
        raise RuntimeError("database busy")

    monkeypatch.setattr(exchanges_mod, "WORKER_WAIT_SECS", 1.0)
    monkeypatch.setattr(svc.semantic, "remember_groups", fail)
    svc.after_exchange(a, "s", "q1", "a1")
    svc.after_exchange(b, "s", "q2", "a2")
    svc.drain()
    assert tried == [[a, b]]
    assert [i["content"] for i in svc.page(a, 10, 0)["memories"]] == [exchange("q1", "a1")]
    assert [i["content"] for i in svc.page(b, 10, 0)["memories"]] == [exchange("q2", "a2")]
    assert set(svc._exchanges[a].values()) == {"q1"} and set(svc._exchanges[b].values()) == {"q2"}


def test_exchanges_of_a_forgotten_agent_are_not_stored(svc) -> None:
    a, b = add_agent(svc.store), add_agent(svc.store)
    svc.emb.gate = threading.Event()
    svc.after_exchange(b, "s", "first", "one")
    assert svc.emb.entered.wait(WAIT)
    svc.after_exchange(a, "s", "q", "a")
    svc.after_exchange(b, "s", "q", "a")
    svc.forget_agent(a)
    svc.emb.gate.set()
    svc.drain()
    assert svc.page(a, 10, 0)["total"] == 0 and a not in svc._exchanges
    assert svc.page(b, 10, 0)["total"] == 2


def test_close_stores_what_is_queued_then_stops_the_worker(store) -> None:
    s, emb = make(store)
    a = add_agent(store)
    emb.gate = threading.Event()
    s.after_exchange(a, "s", "first", "one")
    assert emb.entered.wait(WAIT)
    s.after_exchange(a, "s", "second", "two")
    worker = s._worker
    closer = threading.Thread(target=s.close)
    closer.start()
    time.sleep(0.2)
    emb.gate.set()
    closer.join(WAIT)
    worker.join(WAIT)
    assert not worker.is_alive(), "BUG: close leaves the worker running"
    assert s.page(a, 10, 0)["total"] == 2
    s.close()  # again: harmless


def test_close_gives_up_on_a_stuck_worker_after_five_seconds(store) -> None:
    s, emb = make(store)
    a = add_agent(store)
    emb.gate = threading.Event()
    s.after_exchange(a, "s", "stuck", "one")
    assert emb.entered.wait(WAIT)
    closer = threading.Thread(target=s.close)
    started = time.monotonic()
    closer.start()
    closer.join(WAIT)
    try:
        assert not closer.is_alive(), "BUG: shutdown waits for a stuck embedder without limit"
        assert time.monotonic() - started >= 4.9, "BUG: close must give queued exchanges 5 s"
    finally:
        emb.gate.set()
        closer.join(WAIT)
    s._worker.join(WAIT)
    assert s.page(a, 10, 0)["total"] == 1


def test_close_with_exchanges_still_queued_behind_the_sentinel(store) -> None:
    s, emb = make(store)
    a = add_agent(store)
    emb.gate = threading.Event()
    s.after_exchange(a, "s", "first", "one")
    assert emb.entered.wait(WAIT)
    s._stop.set()
    s._queue.put_nowait(None)  # what close() puts after its drain
    s.after_exchange(a, "s", "late", "two")  # queued behind the sentinel, same batch
    worker = s._worker
    emb.gate.set()
    worker.join(WAIT)
    assert not worker.is_alive()
    assert sorted(i["content"] for i in s.page(a, 10, 0)["memories"]) == \
        sorted([exchange("first", "one"), exchange("late", "two")])


def test_drain_returns_after_its_timeout(svc) -> None:
    before = set(threading.enumerate())   # (other tests' pools in this process are not ours)
    a = add_agent(svc.store)
    svc.emb.gate = threading.Event()
    svc.after_exchange(a, "s", "q", "a")
    started = time.monotonic()
    svc.drain(0.3)
    assert time.monotonic() - started < 5
    waiting = [t for t in threading.enumerate() if t not in before and not t.daemon]
    assert waiting == [], "BUG: a drain that gave up leaves a thread that keeps the process from exiting"
    svc.emb.gate.set()
    svc.drain()
    assert svc.page(a, 10, 0)["total"] == 1


# -- the schedule -----------------------------------------------------------------------------

def test_start_without_schedule(store) -> None:
    s, _ = make(store, consolidate_every_hours=0)
    s.start()
    assert s._scheduler is None
    s2, _ = make(store, consolidate_every_hours=-1)
    s2.start()
    assert s2._scheduler is None


def test_scheduled_consolidation_runs_every_period(tmp_path, caplog) -> None:
    st = open_store(tmp_path / "agentd.db")
    try:
        s, emb = make(st, consolidate_every_hours=0.6 / 3600, decay_days=-1)
        a, b = add_agent(st), add_agent(st)
        with caplog.at_level(logging.INFO, logger="agentd.memory"):
            s.start()
            thread = s._scheduler
            assert thread.name == "agentd-memory-consolidate" and thread.daemon is True
            s.start()
            assert s._scheduler is thread, "BUG: a second start makes a second scheduler"
            time.sleep(1.0)
            assert [r for r in caplog.records if "consolidated" in r.getMessage()] == [], \
                "BUG: no memories, nothing consolidated"
            s.remember(a, "fact a")  # one fragment in the database
            wait_until(lambda: any(r.getMessage().startswith("consolidated") for r in caplog.records), "a report")
            s.remember(b, "fact b")
            wait_until(lambda: len({r.getMessage().split(":")[0] for r in caplog.records
                                  if r.getMessage().startswith("consolidated")}) >= 2, "two reports")
            s.close()
            thread.join(WAIT)
        assert not thread.is_alive()
        import re

        reports = [r.getMessage() for r in caplog.records if r.getMessage().startswith("consolidated")]
        pattern = re.compile(r"consolidated memory of agent (\S+): \{'memories_merged': 0, 'memories_decayed': 1, "
                             r"'memories_dropped': 0, 'duration_ms': \d+\}")
        assert all(pattern.fullmatch(m) for m in reports), reports
        assert {pattern.fullmatch(m).group(1) for m in reports} == {a, b}
        assert reports[0].startswith(f"consolidated memory of agent {a}: ")
    finally:
        st.close()


def test_scheduled_consolidation_failure_is_logged(tmp_path, caplog) -> None:
    st = open_store(tmp_path / "agentd.db")
    try:
        s, emb = make(st, consolidate_every_hours=0.3 / 3600)
        with caplog.at_level(logging.ERROR, logger="agentd.memory"):
            import sqlite3

            raw = sqlite3.connect(tmp_path / "agentd.db")
            raw.execute("DROP TABLE memory_metadata")
            raw.execute("DROP TABLE memory_fragments")  # every count now fails
            raw.commit()
            raw.close()
            s.start()
            wait_until(lambda: caplog.records, "the failure")
            s.close()
            s._scheduler.join(WAIT)
        assert caplog.records[0].getMessage() == "scheduled memory consolidation failed"
    finally:
        pass
