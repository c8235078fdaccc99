"""Semantic memory's read path (agentd/memory/recall.py) with exact values: scores, limits,
min_score at its boundary, every filter exactly at its value (after/before exclusive at a
fragment's own timestamp, min_confidence inclusive), metadata filters as JSON values, newer
facts winning near-ties and superseded ones, access counting, listing order and the fragment
shape.

In-process on a real SQLite store; vectors come from a scripted embedder so scores are exact.
"""

from __future__ import annotations

import math
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from memsupport import at, new_memory, sql, unit
from pony import orm

from agentd.errors import NotFound
from agentd.memory.fields import MemoryFilter
from agentd.memory.recall import NEAR_TIE, canonical, epoch, fragment, stamp


@pytest.fixture()
def mem(tmp_path: Path):  # type: ignore[no-untyped-def]
    return new_memory(tmp_path)


def ids(items: list[dict]) -> list[str]:
    return [m["id"] for m in items]


def created(memory, agent: str, fid: str) -> float:  # type: ignore[no-untyped-def]
    return datetime.fromisoformat(memory.get(agent, fid)["created_at"]).timestamp()


def test_time_and_value_helpers() -> None:
    assert epoch(datetime(2024, 1, 1)) == 1704067200.0, "a naive time is UTC"
    assert epoch("2024-01-01 00:00:00") == 1704067200.0, "Pony's raw text of a whole-second time"
    assert epoch("2024-01-01 02:00:00+02:00") == 1704067200.0
    assert epoch(datetime(2024, 1, 1, 2, tzinfo=timezone(timedelta(hours=2)))) == 1704067200.0
    assert stamp(datetime(2024, 1, 1, 0, 0, 0, 5)) == "2024-01-01T00:00:00.000005+00:00"
    assert stamp("2024-01-01 10:00:00") == "2024-01-01T10:00:00+00:00"  # Pony's raw text
    assert canonical({"b": 1, "a": [1, 2.5], "c": {"y": None, "x": True}}) == \
        '{"a":[1,2.5],"b":1,"c":{"x":true,"y":null}}'
    assert canonical("v") == '"v"' and canonical(1) == "1" and canonical(True) == "true"
    assert NEAR_TIE == 0.01


def test_get_shape_and_not_found(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors["Bob is vegetarian"] = unit(1)
    fid = memory.remember("a", "Bob is vegetarian", source="document", scope="people",
                          metadata={"k": [1, "x"]}, confidence=0.75)["id"]
    got = memory.get("a", fid)
    assert set(got) == {"id", "agent_id", "content", "metadata", "source", "scope", "confidence", "created_at",
                        "accessed_at", "access_count"}
    assert {k: got[k] for k in ("id", "agent_id", "content", "metadata", "source", "scope", "confidence",
                                "access_count")} == \
        {"id": fid, "agent_id": "a", "content": "Bob is vegetarian", "metadata": {"k": [1, "x"]},
         "source": "document", "scope": "people", "confidence": 0.75, "access_count": 0}
    assert got["created_at"] == got["accessed_at"] and got["created_at"].endswith("+00:00")
    with pytest.raises(NotFound) as err:
        memory.get("b", fid)
    assert str(err.value) == f"memory not found: {fid}"


def test_fragment_with_its_vector(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors["p"] = unit(1, 1)
    fid = memory.remember("a", "p")["id"]
    with orm.db_session:
        row = memory.store.e.MemoryRow.get(agent_id="a", id=fid)
        full = fragment(row, embedding=True)
        plain = fragment(row)
        assert full["embedding"] == unit(1, 1).tolist() and full["embedding_model"] == "test/scripted"
        assert "embedding" not in plain and "embedding_model" not in plain
        assert {k: v for k, v in full.items() if not k.startswith("embedding")} == plain
        row.embedding = None
        assert fragment(row, embedding=True)["embedding"] == []
        orm.rollback()


def test_page_newest_first_with_total_offset_and_limit(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    for i in range(5):
        emb.vectors[f"t{i}"] = unit(*([0] * i), 1)
    made = [memory.remember("a", f"t{i}")["id"] for i in range(5)]
    memory.remember("b", "t0")
    page = memory.page("a", 2, 1)
    assert page["total"] == 5 and ids(page["memories"]) == [made[3], made[2]]
    assert ids(memory.page("a", 10, 0)["memories"]) == made[::-1]
    assert memory.page("a", 10, 5) == {"memories": [], "total": 5}
    # Same creation time: the later row first.
    db = sqlite3.connect(str(memory.store.db.provider.pool.filename))
    db.execute("UPDATE memory_fragments SET created_at = '2024-01-01 00:00:00.000000' WHERE agent_id = 'a'")
    db.commit()
    db.close()
    assert ids(memory.page("a", 10, 0)["memories"]) == made[::-1]
    # Creation time first (an imported fragment can be older than rows written before it).
    db = sqlite3.connect(str(memory.store.db.provider.pool.filename))
    db.execute("UPDATE memory_fragments SET created_at = '2020-01-01 00:00:00.000000' WHERE id = ?", (made[4],))
    db.execute("UPDATE memory_fragments SET created_at = '2025-01-01 00:00:00.000000' WHERE id = ?", (made[0],))
    db.commit()
    db.close()
    assert ids(memory.page("a", 10, 0)["memories"]) == [made[0], made[3], made[2], made[1], made[4]]


def test_a_page_for_a_session_label_leaves_out_other_peoples_exchanges(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    made: dict[str, str] = {}
    for i, (name, source, scope, owner) in enumerate([
            ("own", "conversation", "episodic", "key:k1"), ("person", "conversation", "episodic", "key:k1:user:ann"),
            ("longer", "conversation", "episodic", "key:k12"), ("agent", "conversation", "episodic", ""),
            ("user", "conversation", "episodic", "user:bob"), ("ownerless", "conversation", "episodic", None),
            ("fact", "user_provided", "episodic", "key:k12"), ("kept", "conversation", "semantic", "key:k12"),
            ("zoe", "conversation", "episodic", "user:zo\u00eb"), ("zoe2", "conversation", "episodic", "user:zo\u00eb2")]):
        emb.vectors[name] = unit(*([0] * i), 1) if i < 8 else unit(*([0] * (i - 8)), 1, -1)  # none alike
        metadata = {"session_id": "s"} if owner is None else {"owner": owner}
        made[memory.remember("a", name, source=source, scope=scope, metadata=metadata)["id"]] = name

    def seen(owner: str | None) -> list[str]:
        page = memory.page("a", 20, 0, owner)
        assert page["total"] == len(page["memories"])
        return sorted(made[m["id"]] for m in page["memories"])

    assert seen("key:k1") == ["fact", "kept", "own", "ownerless", "person"]
    assert seen("key:k12") == ["fact", "kept", "longer", "ownerless"]
    assert seen("user:zo\u00eb") == ["fact", "kept", "ownerless", "zoe"]
    assert seen(None) == sorted(made.values())
    assert memory.page("a", 2, 1, "key:k1")["total"] == 5 and len(memory.page("a", 2, 4, "key:k1")["memories"]) == 1


def test_empty_agent_recalls_nothing_without_embedding(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    assert memory.recall("a", "anything") == [] and emb.calls == []


def test_scores_are_cosines_rounded_to_six_places_best_first(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"one": at(0.1234567, 0, 1), "two": at(0.75, 0, 2), "three": at(-0.5, 0, 3), "q": unit(1)})
    made = {t: memory.remember("a", t)["id"] for t in ("one", "two", "three")}
    out = memory.recall("a", "q", limit=5)
    assert [(m["content"], m["score"]) for m in out] == [("two", 0.75), ("one", 0.123457), ("three", -0.5)]
    assert set(out[0]) == {"id", "agent_id", "content", "metadata", "source", "scope", "confidence", "created_at",
                           "accessed_at", "access_count", "score"}, "no superseded_by or vector in a recall"
    assert out[0]["id"] == made["two"] and out[0]["agent_id"] == "a"


def test_limit_and_min_score_boundaries(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"half": at(0.5, 0, 1), "quarter": at(0.25, 0, 2), "eighth": at(0.125, 0, 3), "q": unit(1)})
    for t in ("half", "quarter", "eighth"):
        memory.remember("a", t)
    assert [m["content"] for m in memory.recall("a", "q", limit=2)] == ["half", "quarter"], "BUG: limit not kept"
    assert [m["content"] for m in memory.recall("a", "q", limit=1)] == ["half"]
    assert [m["content"] for m in memory.recall("a", "q", min_score=0.25)] == ["half", "quarter"], \
        "BUG: min_score is inclusive"
    assert [m["content"] for m in memory.recall("a", "q", min_score=0.2500001)] == ["half"]
    assert memory.recall("a", "q", min_score=0.6) == []
    assert len(memory.recall("a", "q", min_score=-1.0)) == 3
    for i in range(4):
        emb.vectors[f"more{'x' * i}"] = at(0.1 - 0.01 * i, 0, 4 + i)
        memory.remember("a", f"more{'x' * i}")
    assert len(memory.recall("a", "q")) == 5, "limit defaults to 5"


def test_recall_counts_accesses_unless_told_not_to(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"p": at(0.9, 0, 1), "r": at(0.1, 0, 2), "q": unit(1)})
    p = memory.remember("a", "p", source="observation", scope="room", metadata={"k": [1, {"x": None}]},
                        confidence=0.625)["id"]
    r = memory.remember("a", "r")["id"]
    before = memory.get("a", p)["accessed_at"]
    out = memory.recall("a", "q", limit=1)
    assert {k: v for k, v in out[0].items() if k not in ("created_at", "accessed_at")} == \
        {"id": p, "agent_id": "a", "content": "p", "metadata": {"k": [1, {"x": None}]}, "source": "observation",
         "scope": "room", "confidence": 0.625, "access_count": 1, "score": 0.9}
    assert out[0]["created_at"] == memory.get("a", p)["created_at"]
    assert ids(out) == [p] and out[0]["access_count"] == 1 and out[0]["accessed_at"] > before
    stored = memory.get("a", p)
    assert stored["access_count"] == 1 and stored["accessed_at"] == out[0]["accessed_at"]
    assert memory.get("a", r)["access_count"] == 0, "only what recall returned is touched"
    assert memory.recall("a", "q", limit=1)[0]["access_count"] == 2
    quiet = memory.recall("a", "q", limit=2, touch=False)
    assert [m["access_count"] for m in quiet] == [2, 0]
    assert memory.get("a", p)["access_count"] == 2 and memory.get("a", r)["access_count"] == 0
    # Everything skipped: nothing returned, nothing touched (and no empty UPDATE).
    assert memory.recall("a", "q", skip=lambda text: True) == []


def test_candidates_are_twice_the_limit_plus_eight(mem) -> None:  # type: ignore[no-untyped-def]
    """skip() drops fragments after the search: a recall with limit 1 looks at 10 candidates."""
    memory, emb, _ = mem
    emb.vectors["q"] = unit(1)
    for i in range(11):
        emb.vectors[f"f{i}"] = at(0.9 - 0.05 * i, 0, 1 + i % 7)  # f0 best ... f10 worst, no ties
        memory.remember("a", f"f{i}")
    dropped = {f"f{i}" for i in range(9)}
    assert [m["content"] for m in memory.recall("a", "q", limit=1, skip=dropped.__contains__)] == ["f9"]
    dropped.add("f9")
    assert memory.recall("a", "q", limit=1, skip=dropped.__contains__) == [], \
        "the 11th candidate is beyond limit * 2 + 8"
    assert [m["content"] for m in memory.recall("a", "q", limit=2, skip=dropped.__contains__)] == ["f10"]


def test_every_filter_at_its_boundary(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors["q"] = unit(1)
    specs = [("a1", "system", "s1", 0.5, {"topic": "x", "n": 1}),
             ("a2", "document", "s1", 0.7, {"topic": "x", "n": 2}),
             ("a3", "document", "s2", 0.9, {"topic": "y", "n": 1, "flag": True})]
    made = {}
    for i, (text, source, scope, conf, meta) in enumerate(specs):
        emb.vectors[text] = at(0.9 - 0.1 * i, 0, 1 + i)
        made[text] = memory.remember("a", text, source=source, scope=scope, metadata=meta, confidence=conf)["id"]

    def got(flt: MemoryFilter) -> list[str]:
        return [m["content"] for m in memory.recall("a", "q", limit=10, flt=flt, touch=False)]

    assert got(MemoryFilter()) == ["a1", "a2", "a3"]
    assert got(MemoryFilter(source="document")) == ["a2", "a3"]
    assert got(MemoryFilter(scope="s1")) == ["a1", "a2"]
    assert got(MemoryFilter(scope="none")) == []
    assert got(MemoryFilter(min_confidence=0.7)) == ["a2", "a3"], "BUG: min_confidence exactly at a value"
    assert got(MemoryFilter(min_confidence=0.7000001)) == ["a3"]
    t2 = created(memory, "a", made["a2"])
    assert got(MemoryFilter(after=t2)) == ["a3"], "BUG: after is exclusive at the timestamp"
    assert got(MemoryFilter(after=t2 - 1e-6)) == ["a2", "a3"]
    assert got(MemoryFilter(before=t2)) == ["a1"], "BUG: before is exclusive at the timestamp"
    assert got(MemoryFilter(before=t2 + 1e-6)) == ["a1", "a2"]
    assert got(MemoryFilter(after=t2 - 1e-6, before=t2 + 1e-6)) == ["a2"]
    assert got(MemoryFilter(metadata={"topic": "x"})) == ["a1", "a2"]
    assert got(MemoryFilter(metadata={"topic": "x", "n": 1})) == ["a1"], "metadata pairs are ANDed"
    assert got(MemoryFilter(metadata={"n": 1, "topic": "x"})) == ["a1"]
    assert got(MemoryFilter(metadata={"n": "1"})) == [], "the JSON value, not its text"
    assert got(MemoryFilter(metadata={"flag": True})) == ["a3"]
    assert got(MemoryFilter(metadata={"flag": 1})) == []
    assert got(MemoryFilter(metadata={"topic": "z", "n": 1})) == []
    assert got(MemoryFilter(metadata={"n": 2, "topic": "y"})) == []
    assert got(MemoryFilter(source="document", metadata={"n": 1})) == ["a3"]
    assert got(MemoryFilter(source="system", scope="s1", min_confidence=0.5, after=0.0, before=4e9,
                            metadata={"topic": "x"})) == ["a1"]
    # Another agent's fragment with the same metadata never matches.
    emb.vectors["b1"] = unit(1)
    memory.remember("b", "b1", metadata={"topic": "x"})
    assert got(MemoryFilter(metadata={"topic": "x"})) == ["a1", "a2"]
    assert [m["content"] for m in memory.recall("b", "q", flt=MemoryFilter(metadata={"topic": "x"}))] == ["b1"]


def test_near_ties_prefer_the_newer_fragment(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors["q"] = unit(1)
    # Oldest best, newest worst, each within 0.01 of the next: the newest ends up first.
    for i, score in enumerate((0.5, 0.497, 0.494)):
        emb.vectors[f"n{i}"] = at(score, 0, 1 + i)
        memory.remember("a", f"n{i}")
    assert [m["content"] for m in memory.recall("a", "q")] == ["n2", "n1", "n0"]


def test_a_gap_over_near_tie_keeps_the_better_score_first(tmp_path: Path) -> None:
    memory, emb, _ = new_memory(tmp_path)
    emb.vectors.update({"q": unit(1), "old": at(0.5, 0, 1), "new": at(0.4899, 0, 2), "newest": at(0.4901, 0, 3)})
    memory.remember("a", "old")
    memory.remember("a", "new")
    assert [m["content"] for m in memory.recall("a", "q")] == ["old", "new"], "0.0101 apart is not a near tie"
    memory.remember("a", "newest")
    assert [m["content"] for m in memory.recall("a", "q")] == ["newest", "old", "new"], \
        "0.0099 apart is a near tie: the newer first"


def test_an_older_better_match_stays_first_when_not_near(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"q": unit(1), "old": at(0.9, 0, 1), "new": at(0.6, 0, 2)})
    memory.remember("a", "old")
    memory.remember("a", "new")
    assert [m["content"] for m in memory.recall("a", "q")] == ["old", "new"]


def test_superseded_fact_ranks_after_the_newer_one(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"Meeting at 3": unit(1), "Meeting at 4": unit(0.86, math.sqrt(1 - 0.86 ** 2)),
                        "Lunch is served": unit(0.8, 0, 0.6), "q": unit(1, -0.5, 0.3)})
    old = memory.remember("a", "Meeting at 3")["id"]
    new = memory.remember("a", "Meeting at 4")["id"]
    mid = memory.remember("a", "Lunch is served")["id"]
    # Scores: old 0.864, mid 0.847, new 0.523; old is superseded by new, so it moves right after it.
    out = memory.recall("a", "q")
    assert ids(out) == [mid, new, old], "BUG: a superseded fact ranks above the fact that replaced it"
    assert [m["score"] for m in out] == [round(0.98 / math.sqrt(1.34), 6),
                                         pytest.approx(round((0.86 - 0.5 * math.sqrt(1 - 0.86 ** 2)) /
                                                             math.sqrt(1.34), 6), abs=2e-6),
                                         round(1 / math.sqrt(1.34), 6)]
    # Without the newer fact among the results the old one keeps its place.
    assert ids(memory.recall("a", "q", limit=2, flt=MemoryFilter(before=created(memory, "a", new)))) == [old]
    assert ids(memory.recall("a", "q", min_score=0.8)) == [old, mid]


def test_a_row_deleted_behind_the_index_is_left_out(mem) -> None:  # type: ignore[no-untyped-def]
    """Another daemon deleted a fragment this one's index still holds: recall skips it."""
    memory, emb, _ = mem
    emb.vectors.update({"q": unit(1), "p": at(0.9, 0, 1), "r": at(0.5, 0, 2)})
    p = memory.remember("a", "p")["id"]
    r = memory.remember("a", "r")["id"]
    db = sqlite3.connect(str(memory.store.db.provider.pool.filename))
    db.execute("DELETE FROM memory_fragments WHERE id = ?", (p,))
    db.commit()
    db.close()
    assert ids(memory.recall("a", "q")) == [r]
    assert sql(memory, "SELECT access_count FROM memory_fragments WHERE id = ?", r) == [(1,)]


def test_the_query_vector_is_cached_per_model_and_text(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"q": unit(1), "p": unit(1)})
    memory.remember("a", "p")
    emb.calls.clear()
    memory.recall("a", "q")
    memory.recall("a", "q")
    assert emb.calls == [["q"]]
    assert np.array_equal(memory.queries.get("test/scripted", "q", emb.embed), unit(1))
    assert emb.calls == [["q"]], "the query vector is cached under the model's name"


def test_a_row_with_an_empty_metadata_column_reads_as_empty(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"p": unit(1), "q": unit(1)})
    fid = memory.remember("a", "p", metadata={"k": 1})["id"]
    db = sqlite3.connect(str(memory.store.db.provider.pool.filename))
    db.execute("UPDATE memory_fragments SET metadata = '' WHERE id = ?", (fid,))
    db.commit()
    db.close()
    assert memory.get("a", fid)["metadata"] == {}
    assert memory.page("a", 5, 0)["memories"][0]["metadata"] == {}
    assert memory.recall("a", "q")[0]["metadata"] == {}


def test_near_tie_with_equal_creation_times_keeps_the_better_score(tmp_path: Path) -> None:
    memory, emb, _ = new_memory(tmp_path)
    emb.vectors.update({"q": unit(1), "a": at(0.5, 0, 1), "b": at(0.495, 0, 2)})
    memory.remember("a", "a")
    memory.remember("a", "b")
    db = sqlite3.connect(str(tmp_path / "m.db"))
    db.execute("UPDATE memory_fragments SET created_at = '2024-01-01 00:00:00.000000'")
    db.commit()
    db.close()
    memory.invalidate()
    assert [m["content"] for m in memory.recall("a", "q")] == ["a", "b"]


def test_naive_times_are_utc_whatever_the_machines_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        assert epoch(datetime(2024, 1, 1)) == 1704067200.0
        assert epoch("2024-01-01 00:00:00") == 1704067200.0
    finally:
        monkeypatch.undo()
        time.tzset()


def test_parallel_touches_of_overlapping_fragments_all_count(tmp_path: Path) -> None:
    # Runs recalling the same fragments at once (a workflow's parallel runs) must not fail
    # each other: on PostgreSQL the row locks are taken in id order (a deadlock before).
    # Under --db=postgres this runs on PostgreSQL.
    import threading

    import pgtest
    from memsupport import ScriptedEmbedder, add_agents

    from agentd.memory.semantic import SemanticMemory
    from agentd.store import open_store
    from agentd.store.backend import DatabaseUrl

    url = pgtest.url_for_home(tmp_path)
    emb = ScriptedEmbedder()
    memory = SemanticMemory(add_agents(open_store(tmp_path / "m.db", DatabaseUrl(url) if url else None)),
                            lambda: emb)
    emb.vectors.update({f"f{i}": unit(1) for i in range(12)})
    fids = [memory.remember("a", f"f{i}")["id"] for i in range(12)]
    errors: list = []

    def touch(order: list[str]) -> None:
        try:
            for _ in range(10):
                memory._touch("a", [{"id": f, "access_count": 0} for f in order])
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=touch, args=(fids if n % 2 else fids[::-1],)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [], f"BUG: parallel access counting failed: {errors[:1]}"
    assert {memory.get("a", f)["access_count"] for f in fids} == {60}


def test_a_failed_access_count_update_is_one_log_line_and_the_recall_stands(mem, caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    memory, emb, _ = mem
    emb.vectors.update({"p": unit(1), "r": unit(2)})
    p, r = (memory.remember("a", text)["id"] for text in ("p", "r"))
    items = [{"id": p, "access_count": 3, "accessed_at": "then"}, {"id": r, "access_count": 0, "accessed_at": "then"}]
    with orm.db_session:  # a real database error: the table is gone for the moment
        memory.store.db.execute("ALTER TABLE memory_fragments RENAME TO memory_fragments_away")
    try:
        with caplog.at_level(logging.WARNING, logger="agentd.memory"):
            memory._touch("agent-7", items)
    finally:
        with orm.db_session:
            memory.store.db.execute("ALTER TABLE memory_fragments_away RENAME TO memory_fragments")
    assert [(rec.name, rec.levelno, rec.getMessage()) for rec in caplog.records] == [
        ("agentd.memory", logging.WARNING,
         "access count of 2 fragments of agent agent-7 not updated: no such table: memory_fragments")]
    assert [(i["access_count"], i["accessed_at"]) for i in items] == [(3, "then"), (0, "then")], \
        "BUG: counts shown as updated when the update failed"
    assert memory.get("a", p)["access_count"] == 0
