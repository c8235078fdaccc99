"""Consolidation (agentd/memory/maintenance.py) with exact values: which near-duplicates merge
(cosine 0.92 and up, same scope, no contradiction, fresh since the previous run), what the
merged fragment keeps, the decay arithmetic at the floor, what is dropped, and the report's
counts.

In-process on a real SQLite store. Near-duplicates that dedup on write would have merged are
made by rewriting a stored vector and rebuilding the index, as another daemon or an import
leaves them.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from memsupport import add_agent, add_agents, at, new_memory, sql, unit

from agentd.config import MemoryConfig
from agentd.memory.fields import MemoryFilter
from agentd.memory.maintenance import agents_with_memories, consolidate

CONFIG = MemoryConfig(decay_days=30.0, decay_factor=0.5, decay_floor=0.3)


@pytest.fixture()
def mem(tmp_path: Path):  # type: ignore[no-untyped-def]
    return new_memory(tmp_path)


def write(memory: Any, query: str, *args: Any) -> None:
    db = sqlite3.connect(str(memory.store.db.provider.pool.filename))
    db.execute(query, args)
    db.commit()
    db.close()


def set_vector(memory: Any, fid: str, vector: np.ndarray) -> None:
    write(memory, "UPDATE memory_fragments SET embedding = ? WHERE id = ?", vector.astype("<f4").tobytes(), fid)
    memory.invalidate()


def age(memory: Any, fid: str, days: float) -> None:
    when = (datetime.now(timezone.utc) - timedelta(days=days)).replace(tzinfo=None)
    write(memory, "UPDATE memory_fragments SET accessed_at = ? WHERE id = ?", when.isoformat(" "), fid)


def report(memory: Any, agent: str = "a", config: MemoryConfig = CONFIG) -> dict[str, int]:
    out = consolidate(memory, agent, config)
    assert isinstance(out["duration_ms"], int) and out["duration_ms"] >= 0
    assert set(out) == {"memories_merged", "memories_decayed", "memories_dropped", "duration_ms"}
    return {k: v for k, v in out.items() if k != "duration_ms"}


def contents(memory: Any, agent: str = "a") -> dict[str, tuple]:
    return {r[0]: r[1:] for r in sql(memory, "SELECT id, content, confidence, access_count, metadata "
                                             "FROM memory_fragments WHERE agent_id = ? ORDER BY key", agent)}


def test_empty_and_single_fragment(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    assert report(memory) == {"memories_merged": 0, "memories_decayed": 0, "memories_dropped": 0}
    emb.vectors["p"] = unit(1)
    memory.remember("a", "p")
    assert report(memory) == {"memories_merged": 0, "memories_decayed": 0, "memories_dropped": 0}


def test_a_near_duplicate_folds_into_the_older_fragment(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"The dog is Rex": unit(1), "Rex is our dog": unit(0, 1), "q": unit(1)})
    old = memory.remember("a", "The dog is Rex", scope="s", metadata={"a": 1, "b": 1}, confidence=0.9)["id"]
    new = memory.remember("a", "Rex is our dog", scope="s", metadata={"b": 2, "c": 3}, confidence=0.4)["id"]
    write(memory, "UPDATE memory_fragments SET access_count = 3 WHERE id = ?", new)
    write(memory, "UPDATE memory_fragments SET access_count = 2 WHERE id = ?", old)
    set_vector(memory, new, at(0.95))
    assert report(memory) == {"memories_merged": 1, "memories_decayed": 0, "memories_dropped": 0}
    got = contents(memory)
    assert list(got) == [old], "BUG: the newer fragment was kept instead of the older one"
    content, confidence, count, metadata = got[old]
    assert (content, confidence, count) == ("Rex is our dog", 0.9, 5)
    assert json.loads(metadata) == {"a": 1, "b": 2, "c": 3}
    assert dict(sql(memory, "SELECT key, value FROM memory_metadata WHERE memory_id = ?", old)) == \
        {"a": "1", "b": "2", "c": "3"}
    assert sql(memory, "SELECT COUNT(*) FROM memory_metadata WHERE memory_id = ?", new) == [(0,)]
    assert memory.loaded_ids("a") == [old]
    hit = memory.index("a").search(at(0.95), 1)[0]
    assert hit.id == old and hit.score == pytest.approx(1.0, abs=1e-6), "the kept row has the newer vector"
    assert report(memory) == {"memories_merged": 0, "memories_decayed": 0, "memories_dropped": 0}


def test_the_fold_takes_the_higher_confidence(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"p": unit(1), "pp": unit(0, 1)})
    old = memory.remember("a", "p", confidence=0.2)["id"]
    new = memory.remember("a", "pp", confidence=0.7)["id"]
    set_vector(memory, new, at(0.99))
    assert report(memory)["memories_merged"] == 1
    assert contents(memory)[old][:2] == ("pp", 0.7)


def test_merge_threshold_scope_and_contradiction(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    texts = ["base", "at threshold", "under threshold", "other scope", "base is not true"]
    for i, t in enumerate(texts):
        emb.vectors[t] = unit(*([0] * i), 1)
    made = {t: memory.remember("a", t, scope="other" if t == "other scope" else "s")["id"] for t in texts}
    set_vector(memory, made["at threshold"], at(0.92))
    set_vector(memory, made["under threshold"], at(0.919, 0, 2))
    set_vector(memory, made["other scope"], at(0.99, 0, 3))
    set_vector(memory, made["base is not true"], at(0.97, 0, 4))
    assert report(memory)["memories_merged"] == 1, "BUG: merged at the wrong cosine, scope or a contradiction"
    got = contents(memory)
    assert made["at threshold"] not in got and got[made["base"]][0] == "at threshold"
    assert {made["under threshold"], made["other scope"], made["base is not true"]} <= set(got)


def test_a_contradicting_best_match_is_passed_over(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    for i, t in enumerate(["We have 2 cats", "We own cats", "We keep cats"]):
        emb.vectors[t] = unit(*([0] * i), 1)
    first = memory.remember("a", "We have 2 cats")["id"]
    second = memory.remember("a", "We own cats")["id"]
    third = memory.remember("a", "We keep cats")["id"]
    set_vector(memory, second, at(0.93))
    set_vector(memory, third, at(0.99))
    # "We own cats" contradicts the first (a number); "We keep cats" best matches the first
    # (contradicts), then "We own cats" (0.93*0.99+...): folded into it.
    assert report(memory)["memories_merged"] == 1
    got = contents(memory)
    assert set(got) == {first, second} and got[second][0] == "We keep cats"


def test_only_fragments_since_the_previous_run_are_compared(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"p": unit(1), "pp": unit(0, 1)})
    memory.remember("a", "p")
    pp = memory.remember("a", "pp")["id"]
    assert report(memory)["memories_merged"] == 0
    set_vector(memory, pp, at(0.99))  # now duplicates, but both older than the last run
    assert report(memory)["memories_merged"] == 0
    # The time of the last run is kept per agent: another agent's first run compares everything.
    emb.vectors.update({"x": unit(0, 0, 1), "xx": unit(0, 0, 0, 1)})
    memory.remember("b", "x")
    xx = memory.remember("b", "xx")["id"]
    set_vector(memory, xx, at(0.99, 2, 3))
    assert report(memory, "b")["memories_merged"] == 1


def test_decay_arithmetic_floor_and_drop(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    spec = {"full": (1.0, 31), "drops": (0.5, 31), "at floor": (0.6, 31), "recent": (0.5, 29), "odd": (0.7, 31)}
    made = {}
    for i, (text, (confidence, days)) in enumerate(spec.items()):
        emb.vectors[text] = unit(*([0] * i), 1)
        made[text] = memory.remember("a", text, confidence=confidence, metadata={"k": i})["id"]
        age(memory, made[text], days)
    config = MemoryConfig(decay_days=30.0, decay_factor=0.5, decay_floor=0.3)
    assert report(memory, config=config) == {"memories_merged": 0, "memories_decayed": 4, "memories_dropped": 1}
    got = {text: contents(memory).get(fid, (None, None))[1] for text, fid in made.items()}
    assert got == {"full": 0.5, "drops": None, "at floor": 0.3, "recent": 0.5, "odd": 0.35}, \
        "BUG: decay arithmetic or the floor (a value exactly at the floor stays)"
    assert sql(memory, "SELECT COUNT(*) FROM memory_metadata WHERE memory_id = ?", made["drops"]) == [(0,)]
    assert made["drops"] not in memory.loaded_ids("a")
    # The index holds the decayed confidences.
    emb.vectors["q"] = unit(1, 1, 1, 1, 1)
    kept = memory.recall("a", "q", limit=10, flt=MemoryFilter(min_confidence=0.5), touch=False)
    assert sorted(m["content"] for m in kept) == ["full", "recent"]
    kept = memory.recall("a", "q", limit=10, flt=MemoryFilter(min_confidence=0.3), touch=False)
    assert sorted(m["content"] for m in kept) == ["at floor", "full", "odd", "recent"]


def test_decay_rounds_to_six_places_and_uses_decay_days(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"p": unit(1), "r": unit(0, 1)})
    p = memory.remember("a", "p", confidence=0.7)["id"]
    r = memory.remember("a", "r", confidence=0.7)["id"]
    age(memory, p, 6)
    age(memory, r, 4)
    config = MemoryConfig(decay_days=5.0, decay_factor=0.9, decay_floor=0.1)
    assert report(memory, config=config) == {"memories_merged": 0, "memories_decayed": 1, "memories_dropped": 0}
    assert contents(memory)[p][1] == 0.63 and contents(memory)[r][1] == 0.7  # 0.7 * 0.9 = 0.6300000000000001
    assert report(memory, config=MemoryConfig(decay_days=5.0, decay_factor=1 / 3, decay_floor=0.1))[
        "memories_decayed"] == 1
    assert contents(memory)[p][1] == 0.21
    assert report(memory, config=MemoryConfig(decay_days=5.0, decay_factor=0.5, decay_floor=0.1))[
        "memories_decayed"] == 1
    assert contents(memory)[p][1] == 0.105
    write(memory, "UPDATE memory_fragments SET confidence = 1.0 WHERE id = ?", p)
    report(memory, config=MemoryConfig(decay_days=5.0, decay_factor=0.12345678, decay_floor=0.1))
    assert contents(memory)[p][1] == 0.123457, "decayed confidence is rounded to 6 places"


def test_equal_creation_times_keep_the_match(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"p": unit(1), "pp": unit(0, 1)})
    memory.remember("a", "p")
    second = memory.remember("a", "pp")["id"]
    write(memory, "UPDATE memory_fragments SET created_at = '2030-01-01 00:00:00.000000'")
    set_vector(memory, second, at(0.99))
    # Visited first, "p" finds "pp" created at the same time: the match's id is kept, with
    # the visited fragment's wording (it counts as the newer one).
    assert report(memory)["memories_merged"] == 1
    assert list(contents(memory)) == [second] and contents(memory)[second][0] == "p"


def test_a_fold_chain_counts_each_fragment_once(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    texts = {"tea": unit(1), "hot tea": unit(0, 1), "warm tea": unit(0, 0, 1)}
    emb.vectors.update(texts)
    made = [memory.remember("a", t)["id"] for t in texts]
    set_vector(memory, made[1], at(0.99))
    set_vector(memory, made[2], at(0.98))
    assert report(memory)["memories_merged"] == 2
    assert list(contents(memory)) == [made[0]]


def test_agents_with_memories(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    assert agents_with_memories(memory) == []
    add_agents(memory.store, ("x", "y"))
    emb.vectors.update({"p": unit(1), "r": unit(0, 1)})
    memory.remember("x", "p")
    memory.remember("x", "r")
    memory.remember("y", "p")
    assert sorted(agents_with_memories(memory)) == ["x", "y"]


def test_two_dropped_in_one_run_count_two(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    made = {}
    for i, text in enumerate(["one", "two", "three"]):
        emb.vectors[text] = unit(*([0] * i), 1)
        made[text] = memory.remember("a", text, confidence=0.4)["id"]
    for fid in made.values():
        age(memory, fid, 40)
    assert report(memory) == {"memories_merged": 0, "memories_decayed": 3, "memories_dropped": 3}, \
        "BUG: the dropped count is not the number of fragments dropped"
    assert contents(memory) == {} and memory.loaded_ids("a") == []


def test_empty_metadata_column_of_the_folded_fragment(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    emb.vectors.update({"p": unit(1), "pp": unit(0, 1)})
    old = memory.remember("a", "p", metadata={"k": 1})["id"]
    new = memory.remember("a", "pp")["id"]
    write(memory, "UPDATE memory_fragments SET metadata = '' WHERE id = ?", new)
    set_vector(memory, new, at(0.99))
    assert report(memory)["memories_merged"] == 1
    assert json.loads(contents(memory)[old][3]) == {"k": 1}


def test_a_row_gone_from_the_store_is_not_folded(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    # Another daemon deleted a fragment this daemon's index still holds: nothing to fold.
    for gone in ("older", "newer"):
        agent = add_agent(memory.store, f"agent-{gone}")
        emb.vectors.update({f"p{gone}": unit(1), f"pp{gone}": unit(0, 1)})
        old = memory.remember(agent, f"p{gone}")["id"]
        new = memory.remember(agent, f"pp{gone}")["id"]
        set_vector(memory, new, at(0.99))
        assert sorted(memory.index(agent).ids) == sorted([old, new])
        write(memory, "DELETE FROM memory_fragments WHERE id = ?", old if gone == "older" else new)
        assert report(memory, agent)["memories_merged"] == 0, f"BUG: folded into a row gone from the store ({gone})"
        assert list(contents(memory, agent)) == [new if gone == "older" else old]


def test_fragments_of_the_same_id_in_two_agents(mem) -> None:  # type: ignore[no-untyped-def]
    from agentd.memory.graph import KnowledgeGraph
    from agentd.memory.portable import import_doc

    memory, emb, _ = mem
    item = {"source": "document", "scope": "s", "confidence": 0.5, "created_at": "2024-03-01T10:00:00+00:00"}
    document = {"format": "agentd.memory", "version": 1, "embedding_model": "test/scripted",
                "memories": [dict(item, id="m1", content="tea", embedding=unit(1).tolist()),
                             dict(item, id="m2", content="hot tea", embedding=at(0.99).tolist(),
                                  created_at="2024-03-01T11:00:00+00:00")]}
    graph = KnowledgeGraph(memory.store)
    for agent in ("a", "b"):
        assert import_doc(memory, graph, agent, document)["memories_imported"] == 2
    assert report(memory, "b")["memories_merged"] == 1, "BUG: folded another agent's row of the same id"
    assert contents(memory, "b") == {"m1": ("hot tea", 0.5, 0, "{}")}
    assert set(contents(memory, "a")) == {"m1", "m2"}


def test_a_fragment_created_exactly_at_the_previous_run_is_fresh(mem) -> None:  # type: ignore[no-untyped-def]
    memory, emb, _ = mem
    # The first run compares everything: "since" is 0, and a fragment created at 0 counts.
    for agent, when in (("first", "1970-01-01 00:00:00.000000"), ("at", "2024-01-01 00:00:00.000000"),
                        ("before", "2023-12-31 23:59:59.999999")):
        emb.vectors.update({f"p{agent}": unit(1), f"pp{agent}": unit(0, 1)})
        add_agent(memory.store, agent)
        memory.remember(agent, f"p{agent}")
        new = memory.remember(agent, f"pp{agent}")["id"]
        write(memory, "UPDATE memory_fragments SET created_at = ? WHERE agent_id = ?", when, agent)
        set_vector(memory, new, at(0.99))
        if agent != "first":
            memory.store.set_setting(f"memory.consolidated_at.{agent}", 1704067200.0)
    assert report(memory, "first")["memories_merged"] == 1, "BUG: the first run skipped fragments created at 0"
    assert report(memory, "at")["memories_merged"] == 1, "BUG: a fragment created at the last run's time was skipped"
    assert report(memory, "before")["memories_merged"] == 0, "a fragment older than the last run is not compared"


def test_fresh_fragments_are_visited_oldest_first(mem) -> None:  # type: ignore[no-untyped-def]
    import math

    memory, emb, _ = mem
    # B repeats A, C repeats B but not A. Oldest first: B folds into A (taking B's vector), then C
    # into A: one fragment left. Visiting C first would fold it into B, leaving B and A apart.
    a_b, b_c = math.radians(18), math.radians(22)
    vec = {"A tea": unit(1), "B hot tea": unit(math.cos(a_b), math.sin(a_b)),
           "C warm tea": unit(math.cos(a_b + b_c), math.sin(a_b + b_c))}
    for i, text in enumerate(["C warm tea", "B hot tea", "A tea"]):   # stored (row order) newest first
        emb.vectors[text] = unit(*([0] * (i + 2)), 1)
    made = {t: memory.remember("a", t)["id"] for t in ["C warm tea", "B hot tea", "A tea"]}
    for second, text in enumerate(["A tea", "B hot tea", "C warm tea"]):
        write(memory, "UPDATE memory_fragments SET created_at = ? WHERE id = ?", f"2024-01-01 00:00:0{second}.000000",
              made[text])
        set_vector(memory, made[text], vec[text])
    assert memory.index("a").ids == [made["C warm tea"], made["B hot tea"], made["A tea"]]
    assert report(memory)["memories_merged"] == 2, "BUG: fresh fragments not visited in creation order"
    assert {fid: c[0] for fid, c in contents(memory).items()} == {made["A tea"]: "C warm tea"}


def test_consolidation_holds_the_agents_lock_and_reports_its_duration(mem) -> None:  # type: ignore[no-untyped-def]
    import threading
    import time

    memory, emb, _ = mem
    emb.vectors["p"] = unit(1)
    memory.remember("a", "p")
    memory.index("a")
    out: list[dict] = []
    lock = memory.lock("a")
    with lock:
        worker = threading.Thread(target=lambda: out.append(consolidate(memory, "a", CONFIG)))
        started = time.perf_counter()
        worker.start()
        worker.join(0.4)
        assert worker.is_alive() and out == [], "BUG: consolidation ran while another writer held the agent's lock"
    worker.join(30)
    took_ms = (time.perf_counter() - started) * 1000
    assert len(out) == 1
    assert 400 <= out[0]["duration_ms"] <= took_ms, f"duration_ms {out[0]['duration_ms']} vs {took_ms:.0f} ms measured"
