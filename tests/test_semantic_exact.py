"""Semantic memory's write path (agentd/memory/semantic.py) with exact values: the dedup
threshold at 0.92 and just under it, the supersede threshold at 0.85, numbers and negation
keeping fragments apart, what a merge keeps, the metadata side table, deletes, the index
rebuilt from the store, and the change notifications other daemons rely on.

In-process on a real SQLite store; vectors come from a scripted embedder so scores are exact.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from memsupport import ScriptedEmbedder, at, new_memory, sql, unit

from agentd.errors import NotFound
from agentd.memory.semantic import DEDUP_THRESHOLD, SUPERSEDE_THRESHOLD, contradicts


@pytest.fixture()
def mem(tmp_path: Path):  # type: ignore[no-untyped-def]
    return new_memory(tmp_path)


def rows(memory, agent: str) -> list[tuple]:  # type: ignore[no-untyped-def]
    return sql(memory, "SELECT id, content, source, scope, confidence, access_count, superseded_by, model, metadata "
                       "FROM memory_fragments WHERE agent_id = ? ORDER BY key", agent)


def meta(memory, agent: str, fid: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return dict(sql(memory, "SELECT key, value FROM memory_metadata WHERE agent_id = ? AND memory_id = ?", agent, fid))


def test_thresholds_are_the_documented_values() -> None:
    assert DEDUP_THRESHOLD == 0.92, "BUG: dedup threshold is not cosine 0.92"
    assert SUPERSEDE_THRESHOLD == 0.85


@pytest.mark.parametrize("word", ["not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "cannot",
                                  "without", "nowhere", "isn't", "can’t"])
def test_each_negation_word(word: str) -> None:
    assert contradicts("the shop opens on sundays", f"the shop {word} opens on sundays"), word
    assert not contradicts(f"{word} shop opens", f"the shop {word} opens"), word


@pytest.mark.parametrize("number,word", list(enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())))
def test_each_number_word(number: int, word: str) -> None:
    assert not contradicts(f"I have {word} apples", f"I have {number} apples"), word
    assert contradicts(f"I have {word} apples", f"I have {number + 1} apples"), word
    assert contradicts(f"I have {word} apples", "I have apples"), word


@pytest.mark.parametrize("a,b,expected", [
    ("The meeting is at 3", "The meeting is at 4", True),
    ("The meeting is at 3", "The meeting is at three", False),   # number words count as numbers
    ("Rent is 1,200 a month", "Rent is 1,200 a month!", False),
    ("Rent is 1,200 a month", "Rent is 1,300 a month", True),
    ("Alice likes tea", "Alice does not like tea", True),
    ("Alice likes tea", "Alice doesn't like tea", True),          # n't is a negation
    ("Alice likes tea", "Alice doesn’t like tea", True),          # typographic apostrophe too
    ("Alice likes tea", "Alice never drinks tea", True),
    ("Alice likes tea", "No, Alice likes tea", True),
    ("Alice is not unhappy", "Alice is not unhappy at all", False),
    ("It is not true that Bob never calls", "Bob calls", False),  # two negations cancel out
    ("Nobody never does not call", "They call", True),  # three negations: negated
    ("Bob has 2 cats and 10 dogs", "Bob has 10 dogs and 2 cats", False),  # same numbers, any order
    ("Bob has 2 cats", "Bob has 2 cats and 2 dogs", True),
    ("Bob's cat", "Bob’s cat", False),
    ("Versions 1.2 and 1.10", "Versions 1.10 and 1.2", False),
    ("Train at 10:30", "Train at 10:45", True),
    ("twelve eggs", "12 eggs", False),
    ("eleven eggs", "twelve eggs", True),
    ("zero errors", "0 errors", False),
])
def test_contradiction_signature(a: str, b: str, expected: bool) -> None:
    assert contradicts(a, b) is expected, f"BUG: contradicts({a!r}, {b!r}) should be {expected}"


def test_remember_defaults_and_row(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, changed = mem
    emb.vectors["Alice likes tea"] = unit(1)
    out = memory.remember("a1", "Alice likes tea")
    assert out["merged"] is False and len(out["id"]) == 36
    assert rows(memory, "a1") == [(out["id"], "Alice likes tea", "user_provided", "semantic", 1.0, 0, None,
                                   "test/scripted", "{}")]
    blob = sql(memory, "SELECT embedding FROM memory_fragments WHERE id = ?", out["id"])[0][0]
    assert np.frombuffer(blob, dtype="<f4").tolist() == unit(1).tolist()
    assert changed == ["a1"]
    assert memory.count("a1") == 1 and memory.count("other") == 0


def test_dedup_threshold_boundary(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"base": unit(1), "at": at(0.92), "under": at(0.919, 0, 2)})
    first = memory.remember("a", "base")["id"]
    under = memory.remember("a", "under")
    assert under["merged"] is False and under["id"] != first, "BUG: cosine 0.919 merged (threshold is 0.92)"
    # "under" is not within 0.92 of anything else either; "at" is exactly 0.92 from "base"
    # (and 0.919*0.92 from "under"): it merges into "base".
    assert memory.remember("a", "at") == {"id": first, "merged": True}, "BUG: cosine 0.92 not merged"
    assert [r[1] for r in rows(memory, "a")] == ["at", "under"]


def test_merge_keeps_id_takes_newer_wording_max_confidence_and_merged_metadata(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, changed = mem
    emb.vectors.update({"Rex is the dog": unit(1), "The dog is Rex": at(0.95)})
    fid = memory.remember("a", "Rex is the dog", source="document", scope="pets",
                          metadata={"topic": "pets", "gone": 1, "n": [1, 2]}, confidence=0.6)["id"]
    before = sql(memory, "SELECT accessed_at FROM memory_fragments WHERE id = ?", fid)[0][0]
    out = memory.remember("a", "The dog is Rex", source="inference", scope="pets",
                          metadata={"checked": True, "topic": "animals"}, confidence=0.4)
    assert out == {"id": fid, "merged": True}
    (row,) = rows(memory, "a")
    # Newer wording; source and scope of the kept row; confidence is the max, not the newer one;
    # a merge is not an access.
    assert row[:6] == (fid, "The dog is Rex", "document", "pets", 0.6, 0)
    assert json.loads(row[8]) == {"topic": "animals", "gone": 1, "n": [1, 2], "checked": True}
    assert meta(memory, "a", fid) == {"topic": '"animals"', "gone": "1", "n": "[1,2]", "checked": "true"}
    blob, model, accessed = sql(memory, "SELECT embedding, model, accessed_at FROM memory_fragments WHERE id = ?",
                                fid)[0]
    assert np.frombuffer(blob, dtype="<f4").tolist() == at(0.95).tolist(), "BUG: merge kept the old vector"
    assert model == "test/scripted" and accessed > before
    # A higher confidence wins.
    emb.vectors["Rex is our dog"] = at(0.97)
    memory.remember("a", "Rex is our dog", scope="pets", confidence=0.9)
    assert rows(memory, "a")[0][4] == 0.9
    # The index holds the new vector: a recall for it scores 1.0.
    assert memory.index("a").search(at(0.97), 1)[0].score == pytest.approx(1.0, abs=1e-6)
    assert changed == ["a", "a", "a"]
    # Another fragment's metadata rows are not touched by the merge.
    emb.vectors["Tom is the cat"] = unit(0, 0, 1)
    cat = memory.remember("a", "Tom is the cat", metadata={"topic": "pets", "other": 1})["id"]
    emb.vectors["The dog is named Rex"] = at(0.96)
    memory.remember("a", "The dog is named Rex", scope="pets", metadata={"topic": "dogs"})
    assert meta(memory, "a", cat) == {"topic": '"pets"', "other": "1"}


def test_dedup_is_per_scope_and_per_agent(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"x": unit(1), "xx": at(0.99)})
    a = memory.remember("a", "x", scope="one")["id"]
    assert memory.remember("a", "xx", scope="two")["merged"] is False
    assert memory.remember("b", "xx", scope="one")["merged"] is False
    assert memory.remember("a", "xx", scope="one") == {"id": a, "merged": True}


def test_contradiction_is_kept_apart_and_supersedes(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"Meeting at 3": unit(1), "Meeting at 4": at(0.99), "Meeting not at 3": at(0.85, 0, 2),
                        "Meeting at 5": at(0.84, 0, 3)})
    old = memory.remember("a", "Meeting at 3")["id"]
    new = memory.remember("a", "Meeting at 4")
    assert new["merged"] is False, "BUG: a fragment with another number was merged"
    by_id = {r[0]: r for r in rows(memory, "a")}
    assert by_id[old][6] == new["id"] and by_id[new["id"]][6] is None
    # Exactly at 0.85 from the first one, a contradiction supersedes it too; at 0.84 it does not.
    third = memory.remember("a", "Meeting not at 3")["id"]
    by_id = {r[0]: r for r in rows(memory, "a")}
    assert by_id[old][6] == third
    fourth = memory.remember("a", "Meeting at 5")["id"]
    by_id = {r[0]: r for r in rows(memory, "a")}
    assert by_id[old][6] == third and by_id[fourth][6] is None
    assert len(by_id) == 4


def test_contradicting_best_match_is_skipped_for_the_next_one(mem) -> None:  # type: ignore[no-untyped-def]
    """The best match (>= 0.92) contradicts, the second best (>= 0.92) does not: merged into the second."""
    import math
    memory, emb, _ = mem
    emb.vectors.update({"We have 2 cats": unit(1), "We own cats": at(0.9),
                        "We keep cats": unit(math.cos(math.radians(8)), math.sin(math.radians(8)))})
    first = memory.remember("a", "We have 2 cats")["id"]
    second = memory.remember("a", "We own cats")
    assert second["merged"] is False  # 0.9: under the dedup threshold
    out = memory.remember("a", "We keep cats")  # 0.990 to the first (contradicts), 0.952 to the second
    assert out == {"id": second["id"], "merged": True}
    assert {r[0]: r[1] for r in rows(memory, "a")} == {first: "We have 2 cats", second["id"]: "We keep cats"}


def test_remember_many_dedups_within_the_batch_with_defaults(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, changed = mem
    assert memory.remember_many("a", []) == [] and changed == [] and emb.calls == []
    emb.vectors.update({"one": unit(1), "one again": at(0.93), "two": unit(0, 0, 1)})
    out = memory.remember_many("a", [{"content": "one", "metadata": {"k": 1}},
                                     {"content": "one again", "confidence": 0.5, "metadata": {"j": 2}},
                                     {"content": "two", "source": "system", "scope": "s2", "confidence": 0.25}])
    assert out[0]["merged"] is False and out[1] == {"id": out[0]["id"], "merged": True}
    assert out[2]["merged"] is False
    assert emb.calls == [["one", "one again", "two"]], "one model run for the batch"
    got = {r[0]: r for r in rows(memory, "a")}
    assert got[out[0]["id"]][1:5] == ("one again", "user_provided", "semantic", 1.0)
    assert got[out[2]["id"]][1:5] == ("two", "system", "s2", 0.25)
    assert meta(memory, "a", out[0]["id"]) == {"k": "1", "j": "2"}
    assert changed == ["a"]


def test_delete_removes_row_metadata_and_index_entry(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, changed = mem
    emb.vectors.update({"p": unit(1), "q": unit(0, 1)})
    p = memory.remember("a", "p", metadata={"k": "v"})["id"]
    q = memory.remember("a", "q", metadata={"k": "v"})["id"]
    other = memory.remember("b", "p", metadata={"k": "v"})["id"]
    changed.clear()
    with pytest.raises(NotFound) as err:
        memory.delete("b", q)
    assert str(err.value) == f"memory not found: {q}" and changed == []
    memory.delete("a", p)
    assert changed == ["a"]
    assert [r[0] for r in rows(memory, "a")] == [q] and meta(memory, "a", p) == {}
    assert meta(memory, "a", q) == {"k": '"v"'} and meta(memory, "b", other) == {"k": '"v"'}
    assert memory.loaded_ids("a") == [q] and memory.count("a") == 1
    with pytest.raises(NotFound):
        memory.delete("a", p)


def test_forget_agent_removes_only_that_agent(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, changed = mem
    emb.vectors.update({"p": unit(1)})
    memory.remember("a", "p", metadata={"k": 1})
    keep = memory.remember("b", "p", metadata={"k": 1})["id"]
    changed.clear()
    memory.forget_agent("a")
    assert changed == ["a"]
    assert rows(memory, "a") == [] and sql(memory, "SELECT COUNT(*) FROM memory_metadata WHERE agent_id = 'a'") == [(0,)]
    assert [r[0] for r in rows(memory, "b")] == [keep] and meta(memory, "b", keep) == {"k": "1"}
    assert memory.loaded_ids("a") is None and memory.count("a") == 0
    assert memory.version("a") is None


def test_loaded_ids_version_and_count(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    assert memory.loaded_ids("a") is None and memory.version("a") is None
    for i in range(4):
        emb.vectors[f"t{i}"] = unit(*([0] * i), 1.0)
    ids = [memory.remember("a", f"t{i}")["id"] for i in range(3)]
    assert memory.loaded_ids("a") == ids
    v1 = memory.version("a")
    assert isinstance(v1, int)
    memory.remember("a", "t3")
    assert memory.version("a") != v1 and memory.count("a") == 4
    assert memory.loaded_ids("b") is None and memory.count("b") == 0


def test_invalidate_drops_indexes_and_rebuild_reads_the_store(tmp_path: Path) -> None:
    memory, emb, _ = new_memory(tmp_path)
    emb.vectors.update({"p": unit(1), "q": unit(0, 1)})
    p = memory.remember("a", "p", source="system", scope="s", confidence=0.5)["id"]
    memory.remember("b", "q")
    memory.invalidate("a")
    assert memory.loaded_ids("a") is None and memory.loaded_ids("b") is not None
    assert memory.count("a") == 1  # from the store while unloaded
    index = memory.index("a")
    assert index.ids == [p] and index.search(unit(1), 1)[0].score == pytest.approx(1.0, abs=1e-6)
    assert index.mask(source="system", scope="s", min_confidence=0.5).tolist() == [True]
    assert memory.index("a") is index, "the rebuilt index is kept"
    memory.invalidate()
    assert memory.loaded_ids("a") is None and memory.loaded_ids("b") is None


def test_rebuild_reembeds_rows_of_another_model(tmp_path: Path) -> None:
    first = ScriptedEmbedder(name="model/one")
    first.vectors.update({"p": unit(1), "q": unit(0, 1), "r": unit(0, 0, 1)})
    memory, _, _ = new_memory(tmp_path, first)
    ids = [memory.remember("a", t)["id"] for t in ("p", "q", "r")]
    # A row without a vector (an import of a fragment that had none) is embedded as well.
    sql_rw = sqlite3.connect(str(tmp_path / "m.db"))
    sql_rw.execute("UPDATE memory_fragments SET embedding = NULL WHERE id = ?", (ids[2],))
    sql_rw.commit()
    sql_rw.close()
    second = ScriptedEmbedder(name="model/two")
    second.vectors.update({"p": unit(0, 0, 0, 1), "q": unit(0, 1), "r": unit(0, 0, 0, 0, 1)})
    again, _, _ = new_memory(tmp_path, second)
    index = again.index("a")
    assert second.calls == [["p", "q", "r"]]
    assert index.ids == ids
    assert index.search(unit(0, 0, 0, 1), 1)[0].id == ids[0]
    assert index.search(unit(0, 0, 0, 0, 1), 1)[0].id == ids[2]
    stored = sql(again, "SELECT id, model, embedding FROM memory_fragments ORDER BY key")
    assert [(i, m) for i, m, _ in stored] == [(i, "model/two") for i in ids]
    assert np.frombuffer(stored[0][2], dtype="<f4").tolist() == unit(0, 0, 0, 1).tolist()
    assert np.frombuffer(stored[2][2], dtype="<f4").tolist() == unit(0, 0, 0, 0, 1).tolist()
    # Same model: nothing is embedded again.
    third_emb = ScriptedEmbedder(name="model/two")
    third, _, _ = new_memory(tmp_path, third_emb)
    assert third.index("a").ids == ids and third_emb.calls == []


def test_rebuild_of_an_agent_without_rows(tmp_path: Path) -> None:
    memory, emb, _ = new_memory(tmp_path)
    index = memory.index("nobody")
    assert len(index) == 0 and index.dimensions == 8 and emb.calls == []


def test_lock_is_one_reentrant_lock_per_agent(mem) -> None:  # type: ignore[no-untyped-def]
    memory, _, _ = mem
    lock = memory.lock("a")
    assert memory.lock("a") is lock and memory.lock("b") is not lock
    with lock:
        with memory.lock("a"):  # re-entrant
            pass


def test_an_index_built_while_another_daemon_writes_is_not_kept(tmp_path: Path) -> None:
    """invalidate() during a rebuild (another daemon's write arriving): the rebuilt index is
    used for that call but not kept, so the next call reads the rows again."""
    first = ScriptedEmbedder(name="model/one")
    first.vectors["p"] = unit(1)
    writer, _, _ = new_memory(tmp_path, first)
    writer.remember("a", "p")

    class Racing(ScriptedEmbedder):
        def embed(self, texts):  # type: ignore[no-untyped-def]
            memory.invalidate("a")  # arrives while the rows are being read
            return super().embed(texts)

    racing = Racing(name="model/two")
    racing.vectors["p"] = unit(1)
    memory, _, _ = new_memory(tmp_path, racing)
    for _ in range(2):  # a second invalidation during a second rebuild is noticed too
        db = sqlite3.connect(str(tmp_path / "m.db"))
        db.execute("UPDATE memory_fragments SET model = 'model/one'")  # stale again: embed() runs
        db.commit()
        db.close()
        assert memory.index("a").ids == writer.loaded_ids("a")
        assert memory.loaded_ids("a") is None, "BUG: an index read during another daemon's write was kept"
    plain, _, _ = new_memory(tmp_path, ScriptedEmbedder(name="model/two"))
    plain.invalidate("a")
    plain.invalidate("a")
    index = plain.index("a")
    assert plain.index("a") is index and plain.loaded_ids("a") == index.ids


def test_forget_agent_whose_index_is_not_loaded(mem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors["p"] = unit(1)
    memory.remember("a", "p")
    fresh, _, changed = new_memory(tmp_path, emb)
    fresh.forget_agent("a")
    assert changed == ["a"] and rows(fresh, "a") == [] and fresh.loaded_ids("a") is None


@pytest.mark.parametrize("operation", ["forget_agent", "delete", "remember", "remember_many"])
def test_writes_wait_for_the_agents_lock(mem, operation: str) -> None:  # type: ignore[no-untyped-def]
    import threading

    memory, emb, _ = mem
    emb.vectors.update({"p": unit(1), "q": unit(0, 1)})
    fid = memory.remember("a", "p")["id"]
    calls = {"forget_agent": lambda: memory.forget_agent("a"), "delete": lambda: memory.delete("a", fid),
             "remember": lambda: memory.remember("a", "q"),
             "remember_many": lambda: memory.remember_many("a", [{"content": "q"}])}
    worker = threading.Thread(target=calls[operation])
    with memory.lock("a"):
        worker.start()
        worker.join(0.3)
        assert worker.is_alive(), f"BUG: {operation} ran while another write held the agent's lock"
    worker.join(60)
    assert not worker.is_alive()


def index_row(memory, agent: str, fid: str) -> tuple:  # type: ignore[no-untyped-def]
    """(created, confidence, source, scope) of a fragment as its agent's index holds them."""
    from agentd.memory.vectors import _SOURCE_CODE

    index = memory.index(agent)
    row = index.pos[fid]
    source = {c: s for s, c in _SOURCE_CODE.items()}[int(index.source[row])]
    scope = {c: s for s, c in index.scope_codes.items()}[int(index.scope[row])]
    return float(index.created[row]), round(float(index.confidence[row]), 6), source, scope


def stored_epoch(memory, fid: str) -> float:  # type: ignore[no-untyped-def]
    return datetime.fromisoformat(memory.get(memory_agent(memory, fid), fid)["created_at"]).timestamp()


def memory_agent(memory, fid: str) -> str:  # type: ignore[no-untyped-def]
    return sql(memory, "SELECT agent_id FROM memory_fragments WHERE id = ?", fid)[0][0]


def test_the_index_holds_each_fragments_filter_columns(mem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"p": unit(1), "pp": at(0.95), "r": unit(0, 0, 1), "s": unit(0, 0, 0, 1)})
    p = memory.remember("a", "p", source="document", scope="work", confidence=0.25)["id"]
    r = memory.remember_many("a", [{"content": "r", "source": "system", "scope": "home", "confidence": 0.5}])[0]["id"]
    assert index_row(memory, "a", p) == (stored_epoch(memory, p), 0.25, "document", "work")
    assert index_row(memory, "a", r) == (stored_epoch(memory, r), 0.5, "system", "home")
    # A merge: the kept row's time, source and scope, the higher confidence.
    assert memory.remember("a", "pp", source="inference", scope="work", confidence=0.75)["merged"] is True
    assert index_row(memory, "a", p) == (stored_epoch(memory, p), 0.75, "document", "work")
    # The same columns after a rebuild from the store.
    again, _, _ = new_memory(tmp_path, emb)
    assert index_row(again, "a", p) == (stored_epoch(memory, p), 0.75, "document", "work")
    assert index_row(again, "a", r) == (stored_epoch(memory, r), 0.5, "system", "home")


def test_a_row_without_a_vector_is_embedded_on_rebuild(tmp_path: Path) -> None:
    memory, emb, _ = new_memory(tmp_path)
    emb.vectors.update({"p": unit(1), "q": unit(0, 1)})
    p = memory.remember("a", "p")["id"]
    q = memory.remember("a", "q")["id"]
    db = sqlite3.connect(str(tmp_path / "m.db"))
    db.execute("UPDATE memory_fragments SET embedding = NULL WHERE id = ?", (q,))
    db.commit()
    db.close()
    fresh_emb = ScriptedEmbedder()
    fresh_emb.vectors.update({"q": unit(0, 0, 1)})
    again, _, _ = new_memory(tmp_path, fresh_emb)
    index = again.index("a")
    assert fresh_emb.calls == [["q"]], "only the row without a vector is embedded"
    assert index.ids == [p, q]
    assert index.search(unit(1), 1)[0].id == p and index.search(unit(0, 0, 1), 1)[0].id == q
    assert index.search(unit(0, 0, 1), 1)[0].score == pytest.approx(1.0, abs=1e-6)


class Undeclared(ScriptedEmbedder):
    """An embedder that learns its size from its first answer (a provider's)."""

    @property
    def dimensions(self):  # type: ignore[no-untyped-def]
        return None


def test_rebuild_sizes_without_a_declared_dimension(tmp_path: Path) -> None:
    seed = ScriptedEmbedder(dims=6)
    seed.vectors["p"] = unit(1, dims=6)
    writer, _, _ = new_memory(tmp_path, seed)
    writer.remember("a", "p")
    same = Undeclared(dims=6)  # same name: the stored vectors are kept; their size is the index's
    reader, _, _ = new_memory(tmp_path, same)
    assert reader.index("a").dimensions == 6 and same.calls == []
    other = Undeclared(name="model/other", dims=5)  # re-embedded: the new vectors' size
    other.vectors["p"] = unit(1, dims=5)
    third, _, _ = new_memory(tmp_path, other)
    assert third.index("a").dimensions == 5
    assert third.index("nobody").dimensions == 384, "no rows, no size: the local model's 384"


def test_without_a_change_listener(tmp_path: Path) -> None:
    from agentd.memory.semantic import SemanticMemory
    from agentd.store import open_store

    emb = ScriptedEmbedder()
    emb.vectors["p"] = unit(1)
    memory = SemanticMemory(open_store(tmp_path / "n.db"), lambda: emb)
    assert memory.changed is None
    fid = memory.remember("a", "p")["id"]
    memory.remember_many("a", [{"content": "p"}])
    memory.delete("a", fid)
    memory.forget_agent("a")
    assert memory.count("a") == 0


def test_a_match_deleted_behind_the_index_is_passed_over(mem) -> None:  # type: ignore[no-untyped-def]
    """Two close rows in one scope; another daemon deleted the best one: the next one takes the merge."""
    memory, emb, _ = mem
    emb.vectors.update({"tea": unit(1), "green tea": at(0.9), "tea again": at(0.97)})
    keep = memory.remember("a", "tea")["id"]
    gone = memory.remember("a", "green tea")["id"]  # 0.9 from "tea": kept apart
    db = sqlite3.connect(str(memory.store.db.provider.pool.filename))
    db.execute("DELETE FROM memory_fragments WHERE id = ?", (gone,))
    db.commit()
    db.close()
    # "tea again": 0.993 to the deleted row, 0.97 to "tea": merged into "tea".
    assert memory.remember("a", "tea again") == {"id": keep, "merged": True}


def test_merge_into_a_fragment_id_another_agent_also_has(mem) -> None:  # type: ignore[no-untyped-def]
    """Import keeps ids, so two agents can hold the same fragment id: a merge touches only its own."""
    from agentd.memory.graph import KnowledgeGraph
    from agentd.memory.portable import import_doc

    memory, emb, _ = mem
    emb.vectors.update({"Rex is the dog": unit(1), "The dog is Rex": at(0.95)})
    doc = {"format": "agentd.memory", "version": 1, "embedding_model": "test/scripted", "entities": [],
           "relations": [], "memories": [{"id": "same", "content": "Rex is the dog", "source": "document",
                                          "scope": "semantic", "confidence": 0.5, "metadata": {"k": 1},
                                          "created_at": "2024-01-01T00:00:00Z", "embedding": unit(1).tolist()}]}
    graph = KnowledgeGraph(memory.store)
    for agent in ("a", "b"):
        assert import_doc(memory, graph, agent, json.loads(json.dumps(doc)))["memories_imported"] == 1
    # An empty metadata column (a row written by another tool) merges as {}.
    db = sqlite3.connect(str(memory.store.db.provider.pool.filename))
    db.execute("UPDATE memory_fragments SET metadata = '' WHERE agent_id = 'b'")
    db.commit()
    db.close()
    assert memory.remember("b", "The dog is Rex", metadata={"j": 2}) == {"id": "same", "merged": True}
    assert rows(memory, "b")[0][1] == "The dog is Rex" and json.loads(rows(memory, "b")[0][8]) == {"j": 2}
    assert rows(memory, "a")[0][1] == "Rex is the dog" and json.loads(rows(memory, "a")[0][8]) == {"k": 1}
    assert meta(memory, "a", "same") == {"k": "1"} and meta(memory, "b", "same") == {"j": "2"}


def test_supersede_marks_only_the_agents_own_row(mem) -> None:  # type: ignore[no-untyped-def]
    from agentd.memory.graph import KnowledgeGraph
    from agentd.memory.portable import import_doc

    memory, emb, _ = mem
    emb.vectors.update({"Meeting at 3": unit(1), "Meeting at 4": at(0.9)})
    doc = {"format": "agentd.memory", "version": 1, "embedding_model": "test/scripted", "entities": [],
           "relations": [], "memories": [{"id": "same", "content": "Meeting at 3", "source": "document",
                                          "scope": "semantic", "confidence": 1.0,
                                          "created_at": "2024-01-01T00:00:00.5Z", "embedding": unit(1).tolist()}]}
    graph = KnowledgeGraph(memory.store)
    for agent in ("a", "b"):
        import_doc(memory, graph, agent, json.loads(json.dumps(doc)))
    new = memory.remember("b", "Meeting at 4")["id"]
    assert rows(memory, "b")[0][6] == new
    assert rows(memory, "a")[0][6] is None, "BUG: another agent's fragment was marked superseded"


def test_rebuild_reembeds_only_the_agents_own_row(tmp_path: Path) -> None:
    from agentd.memory.graph import KnowledgeGraph
    from agentd.memory.portable import import_doc

    memory, emb, _ = new_memory(tmp_path)
    emb.vectors["p"] = unit(1)
    doc = {"format": "agentd.memory", "version": 1, "embedding_model": "test/scripted", "entities": [],
           "relations": [], "memories": [{"id": "same", "content": "p", "source": "document", "scope": "semantic",
                                          "confidence": 1.0, "created_at": "2024-01-01T00:00:00.5Z",
                                          "embedding": unit(1).tolist()}]}
    for agent in ("a", "b"):
        import_doc(memory, KnowledgeGraph(memory.store), agent, json.loads(json.dumps(doc)))
    db = sqlite3.connect(str(tmp_path / "m.db"))
    db.execute("UPDATE memory_fragments SET model = 'model/old'")
    db.commit()
    db.close()
    again, _, _ = new_memory(tmp_path, emb)
    assert again.index("a").ids == ["same"]
    assert sql(again, "SELECT agent_id, model FROM memory_fragments ORDER BY agent_id") == \
        [("a", "test/scripted"), ("b", "model/old")]
