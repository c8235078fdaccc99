"""Semantic memory's batched write path and query cache, on a real store with the bundled
model (the daemon uses them from its background worker and recall; see
tests/memory/test_semantic.py for the HTTP behaviour they must keep)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from memsupport import add_agents


@pytest.fixture(scope="module")
def memory(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from agentd.memory.embedder import LocalEmbedder, import_numpy

    import_numpy()
    from agentd.memory.semantic import SemanticMemory
    from agentd.store import open_store

    embedder = LocalEmbedder()
    store = add_agents(open_store(tmp_path_factory.mktemp("membatch") / "m.db"),
                       ("batch", "cache", "g1", "g2", "rollback", "single", "told-1", "told-2", "twice", "tx1", "tx2", "plain-1", "plain-2"))
    return SemanticMemory(store, lambda: embedder)


def meta_rows(memory, agent: str, fid: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    path = Path(memory.store.db.provider.pool.filename)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT key, value FROM memory_metadata WHERE agent_id = ? AND memory_id = ?",
                               (agent, fid)).fetchall())
    finally:
        db.close()


def test_a_batch_dedups_within_itself_like_single_writes(memory) -> None:  # type: ignore[no-untyped-def]
    items = [{"content": "The user's dog is called Rex", "metadata": {"topic": "pets", "old": 1},
              "confidence": 0.6},
             {"content": "The user has a dog named Rex", "metadata": {"checked": True, "old": 2}, "confidence": 0.9},
             {"content": "Bob is vegetarian", "source": "document", "scope": "people"},
             {"content": "Bob is not vegetarian", "source": "document", "scope": "people"}]
    got = memory.remember_many("batch", items)
    assert [g["merged"] for g in got] == [False, True, False, False]
    assert got[1]["id"] == got[0]["id"] and len({g["id"] for g in got}) == 3
    dog = memory.get("batch", got[0]["id"])
    assert dog["content"] == "The user has a dog named Rex" and dog["confidence"] == 0.9
    assert dog["metadata"] == {"topic": "pets", "old": 2, "checked": True}
    # The indexed side table follows the merge.
    assert meta_rows(memory, "batch", got[0]["id"]) == {"topic": '"pets"', "old": "2", "checked": "true"}
    negative = memory.get("batch", got[3]["id"])
    assert (negative["source"], negative["scope"]) == ("document", "people")

    singles = [memory.remember("single", item["content"], item.get("source", "user_provided"),
                               item.get("scope", "semantic"), item.get("metadata"), item.get("confidence", 1.0))
               for item in items]
    assert [s["merged"] for s in singles] == [False, True, False, False]
    batch = memory.recall("batch", "Does Bob eat meat?", limit=3, touch=False)
    single = memory.recall("single", "Does Bob eat meat?", limit=3, touch=False)
    assert [f["content"] for f in batch] == [f["content"] for f in single] == [
        "Bob is not vegetarian", "Bob is vegetarian", "The user has a dog named Rex"]
    # Padded batch embedding and the one-text path give the same vectors.
    assert [f["score"] for f in batch] == pytest.approx([f["score"] for f in single], abs=1e-5)


def test_a_failed_batch_leaves_store_and_index_in_step(memory) -> None:  # type: ignore[no-untyped-def]
    memory.remember_many("rollback", [{"content": "The first fact survives"}])
    bad = [{"content": "A fact stored before the failure"}, {"content": "This one has bad metadata", "metadata": {1: 2}}]
    with pytest.raises(Exception):
        memory.remember_many("rollback", bad)
    # Fragments before the failing one are stored; the failing one is in neither the store nor the index.
    assert memory.page("rollback", 10, 0)["total"] == 2
    assert sorted(f["content"] for f in memory.recall("rollback", "a fact", limit=5, touch=False)) == [
        "A fact stored before the failure", "The first fact survives"]


def test_a_batch_merging_twice_into_one_row(memory) -> None:  # type: ignore[no-untyped-def]
    """The background worker's case: the same exchange queued twice while an equal one exists."""
    item = {"content": "User asked: hello\nI responded: echo: hello", "source": "conversation",
            "scope": "episodic", "metadata": {"session_id": "s1"}}
    first = memory.remember_many("twice", [item])[0]
    again = memory.remember_many("twice", [item, dict(item, metadata={"session_id": "s2"})])
    assert again == [{"id": first["id"], "merged": True}, {"id": first["id"], "merged": True}]
    assert memory.get("twice", first["id"])["metadata"] == {"session_id": "s2"}
    assert meta_rows(memory, "twice", first["id"]) == {"session_id": '"s2"'}
    assert memory.page("twice", 10, 0)["total"] == 1


def test_groups_of_several_agents_are_stored_like_their_own_batches(memory) -> None:  # type: ignore[no-untyped-def]
    item = {"content": "User asked: hi\nI responded: hello", "source": "conversation", "scope": "episodic",
            "metadata": {"session_id": "s1"}}
    other = {"content": "The user's dog is called Rex", "metadata": {"topic": "pets"}}
    vectors = memory.embedder.embed([item["content"], other["content"]])
    first = memory.remember_groups([("g1", [item, other], vectors), ("g2", [other], vectors[1:])],
                                   same_text_only=True)
    assert [[r["merged"] for r in group] for group in first] == [[False, False], [False]]
    again = memory.remember_groups([("g2", [dict(other, metadata={"topic": "dogs"})], vectors[1:]),
                                    ("g1", [item, dict(item, metadata={"session_id": "s2"})], [vectors[0], vectors[0]])],
                                   same_text_only=True)
    assert again == [[{"id": first[1][0]["id"], "merged": True}],
                     [{"id": first[0][0]["id"], "merged": True}, {"id": first[0][0]["id"], "merged": True}]]
    assert memory.get("g1", first[0][0]["id"])["metadata"] == {"session_id": "s2"}
    assert meta_rows(memory, "g1", first[0][0]["id"]) == {"session_id": '"s2"'}
    assert memory.get("g2", first[1][0]["id"])["metadata"] == {"topic": "dogs"}
    assert memory.page("g1", 10, 0)["total"] == 2 and memory.page("g2", 10, 0)["total"] == 1


@pytest.mark.parametrize("same_text_only", [False, True])
def test_a_group_item_without_source_scope_or_confidence_gets_remembers_defaults(memory, same_text_only) -> None:  # type: ignore[no-untyped-def]
    agent = f"plain-{int(same_text_only) + 1}"
    vector = memory.embedder.embed(["The user's boat is green"])[0]
    [[out]] = memory.remember_groups([(agent, [{"content": "The user's boat is green"}], [vector])],
                                     same_text_only=same_text_only)
    boat = memory.get(agent, out["id"])
    assert (boat["source"], boat["scope"], boat["confidence"], boat["metadata"]) == \
        ("user_provided", "semantic", 1.0, {})


def test_a_failed_group_keeps_nothing_of_the_transaction(memory) -> None:  # type: ignore[no-untyped-def]
    memory.remember("tx1", "The first fact survives")
    good = [{"content": "A fact of another agent in the same transaction"}]
    bad = [{"content": "A fact stored before the failure"}, {"content": "This one has bad metadata", "metadata": {1: 2}}]
    vectors = memory.embedder.embed([good[0]["content"], bad[0]["content"], bad[1]["content"]])
    with pytest.raises(TypeError):
        memory.remember_groups([("tx1", good, vectors[:1]), ("tx2", bad, vectors[1:])])
    assert memory.loaded_ids("tx1") is None, "BUG: an index that may hold undone rows is kept"
    assert [f["content"] for f in memory.recall("tx1", "a fact", limit=5, touch=False)] == ["The first fact survives"]
    assert memory.page("tx1", 10, 0)["total"] == 1 and memory.page("tx2", 10, 0)["total"] == 0
    assert memory.recall("tx2", "a fact", limit=5, touch=False) == []


def test_repeated_queries_are_embedded_once(memory) -> None:  # type: ignore[no-untyped-def]
    memory.remember("cache", "The printer on floor two is out of toner")
    hits, misses = memory.queries.hits, memory.queries.misses
    first = memory.recall("cache", "Which printer needs toner?", touch=False)
    again = memory.recall("cache", "Which printer needs toner?", touch=False)
    assert (memory.queries.hits - hits, memory.queries.misses - misses) == (1, 1)
    assert first == again and first[0]["content"] == "The printer on floor two is out of toner"
    memory.recall("cache", "Who refills the printer?", touch=False)
    assert memory.queries.misses - misses == 2


def test_a_group_that_changed_no_index_tells_no_one(memory) -> None:  # type: ignore[no-untyped-def]
    told: list[str] = []
    memory.changed = told.append
    try:
        vector = memory.embedder.embed(["The user's car is red"])[0]
        item = {"content": "The user's car is red", "metadata": {"session_id": "s"}}
        memory.remember_groups([("told-1", [item], [vector]), ("told-2", [item], [vector])])
        assert told == ["told-1", "told-2"]
        told.clear()
        # The very same fragment again for one agent (nothing to write), a new one for the other.
        other = memory.embedder.embed(["The user's bike is blue"])[0]
        out = memory.remember_groups([("told-1", [item], [vector]),
                                      ("told-2", [{"content": "The user's bike is blue"}], [other])])
        assert out[0][0]["merged"] is True and out[1][0]["merged"] is False
        assert told == ["told-2"], "BUG: a restated fragment told other daemons to drop the agent's index"
    finally:
        memory.changed = None
