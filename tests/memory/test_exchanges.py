"""Auto-remember (agentd/memory/exchanges.py) in process: the real MemoryService on a real
SQLite store with a scripted embedder that can be held mid-run. Whose session an exchange
came from, the question's vector made once, the heap handed back after a model run only, and
a full queue dropping the exchange with a warning while keeping the queued ones (on a small
queue: the default thousand is the service's own test, tests/memory/test_service.py), and a
batch the database refuses for one agent stored agent by agent, merging as it would have."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import pytest
from pony import orm
from pony.orm.dbapiprovider import IntegrityError

from agentd.config import MemoryConfig
from agentd.memory import service as service_mod
from agentd.memory.service import MemoryService
from agentd.store import open_store

from memsupport import ScriptedEmbedder, add_agent, add_agents

WAIT = 20.0


class HeldEmbedder(ScriptedEmbedder):
    """Each new text gets its own axis; `gate`, when set, holds each model run until opened."""

    def __init__(self) -> None:
        super().__init__(dims=64)
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def embed(self, texts: list[str]) -> np.ndarray:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(WAIT)
        for text in texts:
            if text not in self.vectors:
                v = np.zeros(self.dims, dtype=np.float32)
                v[len(self.vectors) % self.dims] = 1.0
                self.vectors[text] = v
        return super().embed(texts)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = add_agents(open_store(tmp_path_factory.mktemp("exchanges") / "agentd.db"))
    yield s
    s.close()


def service(store, **config) -> MemoryService:  # type: ignore[no-untyped-def]
    svc = MemoryService(MemoryConfig(**config), store)
    svc._embedder = svc.emb = HeldEmbedder()  # type: ignore[attr-defined]
    svc.trims = []  # type: ignore[attr-defined]
    svc._trim = lambda: svc.trims.append(1)  # (glibc's malloc_trim: agentd/memory/trim.py)
    return svc


@pytest.fixture()
def svc(store):
    s = service(store)
    yield s
    s.close()


def contents(svc: MemoryService, agent: str) -> dict[str, dict]:
    return {m["content"]: m["metadata"] for m in svc.page(agent, 10, 0)["memories"]}


def test_the_exchange_keeps_whose_session_it_came_from(svc) -> None:
    a = add_agent(svc.store)
    svc.after_exchange(a, "s1", "hello there", "hi", owner="alice")
    svc.after_exchange(a, "s1", "from the agent's own session", "ok", owner="")
    svc.after_exchange(a, "s2", "no owner given", "fine")
    svc.drain()
    assert contents(svc, a) == {
        "User asked: hello there\nI responded: hi": {"session_id": "s1", "owner": "alice"},
        "User asked: from the agent's own session\nI responded: ok": {"session_id": "s1", "owner": ""},
        "User asked: no owner given\nI responded: fine": {"session_id": "s2"}}


def test_a_nul_character_is_remembered_as_the_replacement_character(svc) -> None:
    a = add_agent(svc.store)
    svc.after_exchange(a, "s", "a\x00b", "c\x00")   # (PostgreSQL stores no U+0000 in text)
    svc.drain()
    assert list(contents(svc, a)) == ["User asked: a\ufffdb\nI responded: c\ufffd"]


def test_a_question_is_embedded_once_and_the_heap_handed_back_after_that_run_only(svc) -> None:
    a = add_agent(svc.store)
    svc.after_exchange(a, "s", "a question never recalled", "x")
    svc.drain()
    assert svc.emb.calls[-1] == ["a question never recalled"] and svc.trims == [1]
    runs = len(svc.emb.calls)
    svc.after_exchange(a, "s", "a question never recalled", "y")   # its vector is in the query cache now
    svc.drain()
    assert len(svc.emb.calls) == runs, "BUG: the same question ran the model again"
    assert svc.trims == [1], "no model run: nothing to hand back"
    assert len(contents(svc, a)) == 2


def test_the_whole_exchange_embedded_is_a_model_run_each_batch(store) -> None:
    svc = service(store, embed_whole_exchange=True)
    try:
        a = add_agent(store)
        for answer in ("x", "y"):
            svc.after_exchange(a, "s", "same question", answer)
            svc.drain()
        assert svc.emb.calls[-2:] == [["User asked: same question\nI responded: x"],
                                      ["User asked: same question\nI responded: y"]]
        assert svc.trims == [1, 1]
    finally:
        svc.close()


@pytest.fixture()
def small_queue(store, monkeypatch):
    monkeypatch.setattr(service_mod, "QUEUE_LIMIT", 3)
    svc = service(store)
    yield svc
    svc.close()


def test_a_full_queue_drops_the_exchange_with_a_warning_and_keeps_the_queued_ones(small_queue, caplog) -> None:
    svc = small_queue
    a = add_agent(svc.store)
    svc.emb.gate = threading.Event()
    svc.after_exchange(a, "s", "first", "one")          # taken by the worker, held in the model
    assert svc.emb.entered.wait(WAIT)
    with caplog.at_level(logging.WARNING, logger="agentd.memory"):
        for i in range(3):
            svc.after_exchange(a, "s", f"q{i}", f"a{i}")
        assert caplog.records == []
        svc.after_exchange(a, "s", "one too many", "a")  # never blocks, never raises
        svc.after_exchange(a, "s", "", "")               # (blank: not queued, no warning)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == \
        [(logging.WARNING, f"memory queue full; exchange of agent {a} not remembered")]
    svc.emb.gate.set()
    svc.drain()
    contents = sorted(m["content"] for m in svc.page(a, 10, 0)["memories"])
    assert contents == ["User asked: first\nI responded: one", "User asked: q0\nI responded: a0",
                        "User asked: q1\nI responded: a1", "User asked: q2\nI responded: a2"]


def test_a_batch_of_forgotten_agents_only_runs_no_model_and_hands_nothing_back(svc) -> None:
    a, b = add_agent(svc.store), add_agent(svc.store)
    svc.emb.gate = threading.Event()
    svc.after_exchange(b, "s", "first", "one")          # held in the model
    assert svc.emb.entered.wait(WAIT)
    svc.after_exchange(a, "s", "q", "a")
    svc.forget_agent(a)
    svc.emb.gate.set()
    svc.drain()
    assert svc.emb.calls == [["first"]] and svc.trims == [1]
    assert contents(svc, a) == {} and len(contents(svc, b)) == 1


def test_whole_exchanges_close_in_meaning_merge_and_question_vectors_need_the_same_text(store) -> None:
    one, other = "User asked: the sky?\nI responded: blue", "User asked: the sky?\nI responded: blue indeed"
    for whole, expected in ((True, [other]), (False, None)):
        svc = service(store, embed_whole_exchange=whole)
        try:
            same = np.zeros(svc.emb.dims, dtype=np.float32)
            same[-1] = 1.0
            svc.emb.vectors.update({one: same, other: same})
            a = add_agent(store)
            for answer in ("blue", "blue indeed"):
                svc.after_exchange(a, "s", "the sky?", answer)
                svc.drain()
            # (by default both have the question's vector: an answer of its own is a fragment of its own)
            assert sorted(contents(svc, a)) == (expected or sorted([one, other]))
        finally:
            svc.close()


def test_a_failed_model_run_is_logged_and_still_hands_the_heap_back(svc, caplog) -> None:
    a = add_agent(svc.store)
    real = svc.emb.embed

    def down(texts):  # type: ignore[no-untyped-def]
        raise RuntimeError("embedder down")

    svc.emb.embed = down
    with caplog.at_level(logging.ERROR, logger="agentd.memory"):
        svc.after_exchange(a, "s", "q", "a")
        svc.drain()
    assert [r.getMessage() for r in caplog.records] == [f"remembering 1 exchange(s) of agent {a} failed"]
    assert svc.trims == [1], "the failed run's scratch memory is handed back too"
    svc.emb.embed = real
    svc.after_exchange(a, "s", "q2", "a2")
    svc.drain()
    assert list(contents(svc, a)) == ["User asked: q2\nI responded: a2"]


@pytest.fixture()
def no_room_for(store):  # type: ignore[no-untyped-def]
    """`no_room_for(agent)`: the database refuses every new fragment of `agent` (and with it
    the batch's one transaction), as a full table or a broken constraint would."""
    triggers: list[str] = []

    def refuse(agent: str) -> None:
        name = "no_room_" + agent.replace("-", "_")
        with orm.db_session:
            store.db.execute(f"CREATE TRIGGER {name} BEFORE INSERT ON memory_fragments "
                             f"WHEN NEW.agent_id = '{agent}' BEGIN SELECT RAISE(ABORT, 'no room'); END")
        triggers.append(name)

    yield refuse
    with orm.db_session:
        for name in triggers:
            store.db.execute(f"DROP TRIGGER {name}")


def behind_a_held_one(svc: MemoryService, held: str, exchanges: list[tuple[str, str, str]]) -> None:
    """Queue `exchanges` (agent, question, answer) while an exchange of `held` is held in the
    model (until `svc.emb.gate` is set): they are stored together, as the next batch."""
    svc.emb.gate = threading.Event()
    svc.emb.entered.clear()
    svc.after_exchange(held, "s", "first", "one")
    assert svc.emb.entered.wait(WAIT)
    for agent, question, answer in exchanges:
        svc.after_exchange(agent, "s", question, answer)


def test_a_failed_store_of_one_agent_is_logged_with_its_cause_and_the_others_are_stored(svc, caplog,
                                                                                        no_room_for) -> None:
    a, b, c = add_agent(svc.store), add_agent(svc.store), add_agent(svc.store)
    # The batch's one transaction fails too; agent by agent, only a's exchanges are lost.
    no_room_for(a)
    behind_a_held_one(svc, c, [(a, "q1", "a1"), (b, "q2", "a2"), (a, "q3", "a3")])
    with caplog.at_level(logging.ERROR, logger="agentd.memory"):
        svc.emb.gate.set()
        svc.drain()
    [record] = caplog.records
    assert (record.levelno, record.getMessage()) == (logging.ERROR, f"remembering 2 exchange(s) of agent {a} failed")
    assert isinstance(record.exc_info[1], IntegrityError) and str(record.exc_info[1]) == "no room"
    assert list(contents(svc, b)) == ["User asked: q2\nI responded: a2"] and contents(svc, a) == {}
    assert a not in svc._exchanges and list(svc._exchanges[b].values()) == ["q2"]


@pytest.mark.parametrize("whole", [False, True], ids=["question vectors", "whole exchanges"])
def test_stored_agent_by_agent_near_duplicates_merge_as_in_one_transaction(store, caplog, no_room_for,
                                                                             whole) -> None:
    one, other = "User asked: the sky?\nI responded: blue", "User asked: the sky?\nI responded: blue indeed"
    svc = service(store, embed_whole_exchange=whole)
    try:
        same = np.zeros(svc.emb.dims, dtype=np.float32)
        same[-1] = 1.0
        svc.emb.vectors.update({one: same, other: same})
        a, b, c = add_agent(store), add_agent(store), add_agent(store)
        svc.after_exchange(b, "s0", "the sky?", "blue")
        svc.drain()
        [kept] = svc.page(b, 10, 0)["memories"]
        no_room_for(a)  # the batch's one transaction fails: b's exchanges are stored on their own
        behind_a_held_one(svc, c, [(a, "q1", "a1"), (b, "the sky?", "blue"), (b, "the sky?", "blue indeed")])
        with caplog.at_level(logging.DEBUG, logger="agentd.memory"):
            svc.emb.gate.set()
            svc.drain()
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
            (logging.DEBUG, "one transaction for 3 exchange(s) failed; storing them agent by agent"),
            (logging.ERROR, f"remembering 1 exchange(s) of agent {a} failed")]
        assert all(isinstance(r.exc_info[1], IntegrityError) for r in caplog.records)
        stored = {m["content"]: (m["id"], m["metadata"]) for m in svc.page(b, 10, 0)["memories"]}
        if whole:  # close in meaning: the newer wording replaces the older one
            assert stored == {other: (kept["id"], {"session_id": "s"})}
        else:  # the same question only: the very same exchange merges, another answer is its own
            assert stored[one] == (kept["id"], {"session_id": "s"})
            assert list(stored) == [other, one] and stored[other][1] == {"session_id": "s"}
        assert list(svc._exchanges[b].values()) == ["the sky?"] * len(stored)
        assert contents(svc, a) == {} and list(contents(svc, c)) == ["User asked: first\nI responded: one"]
    finally:
        svc.close()


@pytest.mark.parametrize("together", [True, False], ids=["one transaction", "agent by agent"])
def test_exchanges_of_an_agent_deleted_meanwhile_are_dropped_quietly(svc, caplog, no_room_for, together) -> None:
    a, b, c, d = (add_agent(svc.store) for _ in range(4))
    if not together:  # the batch's transaction fails for d: the others are stored one agent at a time
        no_room_for(d)
    behind_a_held_one(svc, c, [(a, "q1", "a1"), (b, "q2", "a2"), (d, "q3", "a3")])
    with orm.db_session:  # deleted by another daemon: this one never heard of it
        svc.store.db.execute("DELETE FROM agents WHERE id = $a", {"a": a})
    with caplog.at_level(logging.DEBUG, logger="agentd.memory"):
        svc.emb.gate.set()
        svc.drain()
    dropped = [r for r in caplog.records if a in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in dropped] == [
        (logging.DEBUG, f"1 exchange(s) of deleted agent {a} not remembered")]
    failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert failed == ([] if together else [f"remembering 1 exchange(s) of agent {d} failed"])
    assert list(contents(svc, b)) == ["User asked: q2\nI responded: a2"]
    with orm.db_session:
        assert svc.store.db.select("SELECT COUNT(*) FROM memory_fragments WHERE agent_id = $a", {"a": a}) == [0]
    assert a not in svc._exchanges


def test_the_agents_whose_exchanges_are_known_are_bounded_oldest_out(svc, monkeypatch) -> None:
    from agentd.memory import exchanges

    monkeypatch.setattr(exchanges, "AGENTS_KEPT", 2)
    agents = [add_agent(svc.store) for _ in range(3)]
    for n, agent in enumerate(agents):
        svc.after_exchange(agent, "s", f"question {n}", "answer")
        svc.drain(WAIT)
    assert list(svc._exchanges) == agents[1:]
    assert list(svc._exchanges[agents[2]].values()) == ["question 2"]
    svc.after_exchange(agents[2], "s", "another", "answer")   # a known agent: nobody is dropped
    svc.drain(WAIT)
    assert list(svc._exchanges) == agents[1:]
