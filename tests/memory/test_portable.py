"""Export and import (agentd/memory/portable.py) with exact values: the document's fields, ids
and vectors kept bit for bit, the import report's counts (twice adds nothing), vectors of
another model or size re-embedded, non-unit vectors normalised, every validation message
naming its field, and a bad document writing nothing.

In-process on a real SQLite store with a scripted embedder (the HTTP round trip:
tests/memory/test_semantic.py).
"""

from __future__ import annotations

import copy
import math
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from memsupport import new_memory, sql, unit

from agentd.errors import BadRequest
from agentd.memory.graph import KnowledgeGraph
from agentd.memory.portable import FORMAT, VERSION, export, import_doc, validate

T0 = "2024-03-01T10:00:00+00:00"


def write(memory: Any, query: str, *args: Any) -> None:
    db = sqlite3.connect(str(memory.store.db.provider.pool.filename))
    db.execute(query, args)
    db.commit()
    db.close()


@pytest.fixture()
def pair(tmp_path: Path):  # type: ignore[no-untyped-def]
    memory, emb, _ = new_memory(tmp_path)
    return memory, KnowledgeGraph(memory.store), emb


def doc(**extra: Any) -> dict[str, Any]:
    out = {"format": FORMAT, "version": VERSION, "embedding_model": "test/scripted",
           "memories": [], "entities": [], "relations": []}
    out.update(extra)
    return out


def mem_item(fid: str = "m1", content: str = "Alice likes tea", **extra: Any) -> dict[str, Any]:
    item = {"id": fid, "content": content, "source": "document", "scope": "s", "confidence": 0.5,
            "metadata": {"k": 1}, "created_at": T0, "embedding": unit(1).tolist()}
    item.update(extra)
    return item


def test_export_document(pair) -> None:  # type: ignore[no-untyped-def]
    memory, kg, emb = pair
    empty = export(memory, kg, "a")
    assert {k: v for k, v in empty.items() if k != "exported_at"} == \
        {"format": "agentd.memory", "version": 1, "agent_id": "a", "embedding_model": "test/scripted",
         "memories": [], "entities": [], "relations": []}
    assert empty["exported_at"].endswith("+00:00")
    emb.vectors.update({"Meeting at 3": unit(1), "Meeting at 4": unit(1, 0.2)})
    old = memory.remember("a", "Meeting at 3", metadata={"k": [1]}, confidence=0.5)["id"]
    new = memory.remember("a", "Meeting at 4")["id"]
    alice = kg.add_entity("a", "person", "Alice", {"x": 1})["id"]
    bob = kg.add_entity("a", "person", "Bob", {})["id"]
    rid = kg.add_relation("a", alice, "knows", bob, {"y": 2}, 0.7)["id"]
    out = export(memory, kg, "a")
    assert [m["id"] for m in out["memories"]] == [old, new]
    first = out["memories"][0]
    assert set(first) == {"id", "agent_id", "content", "metadata", "source", "scope", "confidence", "created_at",
                          "accessed_at", "access_count", "embedding", "superseded_by"}
    assert first["superseded_by"] == new and out["memories"][1]["superseded_by"] is None
    assert first["embedding"] == unit(1).tolist() and first["metadata"] == {"k": [1]}
    assert [e["id"] for e in out["entities"]] == [alice, bob]
    assert [(r["id"], r["source"], r["target"], r["confidence"]) for r in out["relations"]] == [(rid, alice, bob, 0.7)]
    # The document names the rows' model; rows of two models: the current one.
    write(memory, "UPDATE memory_fragments SET model = 'model/old'")
    assert export(memory, kg, "a")["embedding_model"] == "model/old"
    write(memory, "UPDATE memory_fragments SET model = 'model/older' WHERE id = ?", old)
    assert export(memory, kg, "a")["embedding_model"] == "test/scripted"


def test_round_trip_keeps_ids_vectors_and_fields(pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    memory, kg, emb = pair
    emb.vectors.update({"Meeting at 3": unit(1), "Meeting at 4": unit(1, 0.2), "q": unit(1)})
    old = memory.remember("a", "Meeting at 3", source="system", scope="work", metadata={"k": "v"},
                          confidence=0.25)["id"]
    memory.remember("a", "Meeting at 4")
    memory.recall("a", "q", limit=1)  # access_count 1 on one of them
    alice = kg.add_entity("a", "person", "Alice", {"x": 1})["id"]
    bob = kg.add_entity("a", "person", "Bob", {})["id"]
    kg.add_relation("a", alice, "knows", bob, {"y": 2}, 0.7)
    document = export(memory, kg, "a")

    (tmp_path / "t").mkdir()
    target, temb, _ = new_memory(tmp_path / "t")
    tkg = KnowledgeGraph(target.store)
    report = import_doc(target, tkg, "b", copy.deepcopy(document))
    assert report == {"entities_imported": 2, "relations_imported": 1, "memories_imported": 2,
                      "memories_reembedded": 0, "errors": []}
    assert temb.calls == [], "same model and size: vectors kept, nothing embedded"
    again = export(target, tkg, "b")
    for key in ("memories", "entities", "relations"):
        strip = [{k: v for k, v in x.items() if k != "agent_id"} for x in again[key]]
        assert strip == [{k: v for k, v in x.items() if k != "agent_id"} for x in document[key]], key
    assert import_doc(target, tkg, "b", copy.deepcopy(document)) == \
        {"entities_imported": 0, "relations_imported": 0, "memories_imported": 0, "memories_reembedded": 0,
         "errors": []}, "BUG: importing twice added something"
    # The index knows the imported fragments, with their filter columns.
    temb.vectors["q"] = unit(1)
    from agentd.memory.fields import MemoryFilter
    found = target.recall("b", "q", flt=MemoryFilter(source="system", scope="work", min_confidence=0.25))
    assert [m["id"] for m in found] == [old]


def test_vectors_of_another_model_or_size_are_reembedded(pair) -> None:  # type: ignore[no-untyped-def]
    memory, kg, emb = pair
    emb.vectors.update({"one": unit(0, 1), "two": unit(0, 0, 1), "three": unit(0, 0, 0, 1)})
    other = doc(embedding_model="model/other", memories=[mem_item("m1", "one")])
    assert import_doc(memory, kg, "a", other)["memories_reembedded"] == 1
    wrong_size = doc(memories=[mem_item("m2", "two", embedding=[1.0, 0.0, 0.0])])
    none = doc(memories=[mem_item("m3", "three", embedding=None)])
    assert import_doc(memory, kg, "a", wrong_size)["memories_reembedded"] == 1
    assert import_doc(memory, kg, "a", none)["memories_reembedded"] == 1
    assert emb.calls == [["one"], ["two"], ["three"]]
    stored = {i: np.frombuffer(b, dtype="<f4").tolist()
              for i, b in sql(memory, "SELECT id, embedding FROM memory_fragments")}
    assert stored == {"m1": unit(0, 1).tolist(), "m2": unit(0, 0, 1).tolist(), "m3": unit(0, 0, 0, 1).tolist()}
    assert sql(memory, "SELECT DISTINCT model FROM memory_fragments") == [("test/scripted",)]


def test_vector_normalisation(pair) -> None:  # type: ignore[no-untyped-def]
    memory, kg, emb = pair
    near = [1.00005] + [0.0] * 7          # within 1e-4 of unit length: kept as is
    far = [0.0, 3.0, 4.0] + [0.0] * 5     # normalised to 0.6, 0.8
    zero = [0.0] * 8                      # stays zero (no division by zero)
    report = import_doc(memory, kg, "a", doc(memories=[mem_item("n", "n", embedding=near),
                                                     mem_item("f", "f", embedding=far),
                                                     mem_item("z", "z", embedding=zero)]))
    assert report["memories_imported"] == 3 and report["memories_reembedded"] == 0
    stored = {i: np.frombuffer(b, dtype="<f4") for i, b in sql(memory, "SELECT id, embedding FROM memory_fragments")}
    assert stored["n"].tolist() == np.asarray(near, dtype=np.float32).tolist()
    assert stored["f"].tolist() == pytest.approx([0.0, 0.6, 0.8, 0, 0, 0, 0, 0], abs=1e-7)
    assert stored["z"].tolist() == zero
    assert np.linalg.norm(np.asarray([0.0, 1.0002] + [0.0] * 6)) > 1 + 1e-4
    import_doc(memory, kg, "a", doc(memories=[mem_item("o", "o", embedding=[0.0, 1.0002] + [0.0] * 6)]))
    (blob,) = sql(memory, "SELECT embedding FROM memory_fragments WHERE id = 'o'")[0]
    assert np.frombuffer(blob, dtype="<f4").tolist() == unit(0, 1).tolist()


def test_an_imported_exchange_is_agent_wide(pair) -> None:  # type: ignore[no-untyped-def]
    memory, kg, _ = pair
    item = mem_item(source="conversation", scope="episodic", metadata={"session_id": "s1", "owner": "user:alice"})
    import_doc(memory, kg, "a", doc(memories=[item]))
    # Whose session it once came from is dropped: every run of the agent may recall it.
    assert memory.get("a", "m1")["metadata"] == {"session_id": "s1"}
    assert sql(memory, "SELECT key, value FROM memory_metadata WHERE memory_id = 'm1'") == [("session_id", '"s1"')]


def test_import_defaults_and_fields(pair) -> None:  # type: ignore[no-untyped-def]
    memory, kg, emb = pair
    item = {"id": "m1", "content": "c", "source": "inference", "scope": "s", "confidence": 1,
            "created_at": "2024-03-01T12:00:00+02:00", "embedding": unit(1).tolist(), "superseded_by": "m9"}
    rel = {"id": "r1", "source": "e1", "relation": {"custom": "likes"}, "target": "e2", "created_at": T0}
    ents = [{"id": "e1", "entity_type": "person", "name": "A", "created_at": T0},
            {"id": "e2", "entity_type": {"custom": "pet"}, "name": "B", "properties": {"p": 1}, "created_at": T0,
             "updated_at": "2024-03-02T00:00:00Z"}]
    report = import_doc(memory, kg, "a", doc(memories=[item], entities=ents, relations=[rel]))
    assert report == {"entities_imported": 2, "relations_imported": 1, "memories_imported": 1,
                      "memories_reembedded": 0, "errors": []}
    got = memory.get("a", "m1")
    assert (got["metadata"], got["access_count"], got["confidence"], got["source"]) == ({}, 0, 1.0, "inference")
    assert got["created_at"] == got["accessed_at"] == "2024-03-01T10:00:00+00:00"
    # Superseded by a fragment neither in the document nor kept by the agent: not superseded.
    assert sql(memory, "SELECT superseded_by FROM memory_fragments WHERE id = 'm1'") == [(None,)]
    ents_out, rels_out = kg.export("a")
    assert [(e["entity_type"], e["properties"], e["updated_at"]) for e in ents_out] == \
        [("person", {}, T0), ("pet", {"p": 1}, "2024-03-02T00:00:00+00:00")]
    assert [(r["relation"], r["properties"], r["confidence"]) for r in rels_out] == [("likes", {}, 1.0)]
    # A relation may name an entity the agent already has.
    assert import_doc(memory, kg, "a", doc(relations=[dict(rel, id="r2", relation="knows")]))[
        "relations_imported"] == 1


@pytest.mark.parametrize("bad,message", [
    ([], "import document must be a JSON object"),
    ({"format": "x", "version": 1}, "import document must have format 'agentd.memory' and version 1 "
                                    "(the output of GET .../export)"),
    ({"format": FORMAT, "version": 2}, "import document must have format 'agentd.memory' and version 1 "
                                       "(the output of GET .../export)"),
    (doc(embedding_model=3), "embedding_model must be a string"),
    (doc(memories={}), "memories must be an array"),
    (doc(entities=[{}, 1]), "entities[1] must be an object"),
    (doc(memories=[mem_item(embedding="x")]), "memories[0].embedding must be an array of finite numbers"),
    (doc(memories=[mem_item(embedding=[1, True])]), "memories[0].embedding must be an array of finite numbers"),
    (doc(memories=[mem_item(embedding=[1, math.inf])]), "memories[0].embedding must be an array of finite numbers"),
    (doc(memories=[mem_item(embedding=[1, "2"])]), "memories[0].embedding must be an array of finite numbers"),
    (doc(memories=[mem_item(superseded_by=5)]), "memories[0].superseded_by must be a string or null"),
    (doc(memories=[mem_item(), mem_item("m2", source="rumour")]),
     "memories[1].source must be one of conversation, document, observation, inference, user_provided, system"),
    (doc(memories=[mem_item(id="")]), "memories[0].id must be a non-empty string"),
    (doc(memories=[mem_item(content=5)]), "memories[0].content must be a non-empty string"),
    (doc(memories=[mem_item(scope=None)]), "memories[0].scope must be a non-empty string"),
    (doc(memories=[mem_item(confidence=1.5)]), "memories[0].confidence must be a number between 0 and 1"),
    (doc(memories=[mem_item(metadata=[])]), "memories[0].metadata must be a JSON object"),
    (doc(memories=[mem_item(created_at="yesterday")]), "memories[0].created_at must be an ISO 8601 timestamp"),
    (doc(memories=[mem_item(accessed_at=5)]), "memories[0].accessed_at must be an ISO 8601 timestamp"),
    (doc(memories=[mem_item(access_count=-1)]), "memories[0].access_count must be an integer between 0 and 2147483648"),
    (doc(memories=[mem_item(access_count=2**31 + 1)]),
     "memories[0].access_count must be an integer between 0 and 2147483648"),
    (doc(memories=[mem_item(), mem_item()]), "memories contains the same id twice"),
    (doc(memories=[mem_item(id="i" * 257)]), "memories[0].id is too long (257 characters, limit 256)"),
    (doc(memories=[mem_item(scope="s" * 257)]), "memories[0].scope is too long (257 characters, limit 256)"),
    (doc(memories=[mem_item(content="c" * 32_001)]), "memories[0].content is too long (32001 characters, limit 32000)"),
    (doc(entities=[{"id": "i" * 257, "entity_type": "person", "name": "A", "created_at": T0}]),
     "entities[0].id is too long (257 characters, limit 256)"),
    (doc(entities=[{"id": "e", "entity_type": "person", "name": "n" * 257, "created_at": T0}]),
     "entities[0].name is too long (257 characters, limit 256)"),
    (doc(entities=[{"id": "e", "entity_type": "t" * 65, "name": "A", "created_at": T0}]),
     "entities[0].entity_type is too long (65 characters, limit 64)"),
    (doc(entities=[{"id": "e", "entity_type": "person", "name": "A", "created_at": "x"}]),
     "entities[0].created_at must be an ISO 8601 timestamp"),
    (doc(entities=[{"id": "e", "entity_type": "person", "name": "A"}]),
     "entities[0].created_at must be an ISO 8601 timestamp"),
    (doc(relations=[{"id": "i" * 257, "source": "a", "relation": "knows", "target": "b", "created_at": T0}]),
     "relations[0].id is too long (257 characters, limit 256)"),
    (doc(relations=[{"id": "r", "source": "s" * 257, "relation": "knows", "target": "b", "created_at": T0}]),
     "relations[0].source is too long (257 characters, limit 256)"),
    (doc(relations=[{"id": "r", "source": "a", "relation": "knows", "target": "t" * 257, "created_at": T0}]),
     "relations[0].target is too long (257 characters, limit 256)"),
    (doc(relations=[{"id": "r", "source": "a", "relation": "r" * 65, "target": "b", "created_at": T0}]),
     "relations[0].relation is too long (65 characters, limit 64)"),
    (doc(relations=[{"id": "r", "source": "a", "relation": "knows", "target": "b", "created_at": "x"}]),
     "relations[0].created_at must be an ISO 8601 timestamp"),
    (doc(relations=[{"id": "r", "source": "a", "relation": "knows", "target": "b", "created_at": T0,
                     "properties": []}]), "relations[0].properties must be a JSON object"),
    (doc(relations=[{"id": "r", "source": "a", "relation": "knows", "target": "", "created_at": T0}]),
     "relations[0].target must be a non-empty string"),
    (doc(entities=[{"id": "e", "entity_type": "person", "name": "A", "created_at": T0}] * 2),
     "entities contains the same id twice"),
    (doc(entities=[{"id": "e", "entity_type": "", "name": "A", "created_at": T0}]),
     "entities[0].entity_type must be a non-empty string"),
    (doc(entities=[{"id": "e", "entity_type": "person", "name": 1, "created_at": T0}]),
     "entities[0].name must be a non-empty string"),
    (doc(entities=[{"id": "e", "entity_type": "person", "name": "A", "properties": 1, "created_at": T0}]),
     "entities[0].properties must be a JSON object"),
    (doc(entities=[{"id": "e", "entity_type": "person", "name": "A", "created_at": T0, "updated_at": "x"}]),
     "entities[0].updated_at must be an ISO 8601 timestamp"),
    (doc(entities=[{"entity_type": "person", "name": "A", "created_at": T0}]), "entities[0].id must be a non-empty string"),
    (doc(relations=[{"id": "r", "source": "a", "relation": "knows", "target": "b", "created_at": T0,
                     "confidence": -0.1}]), "relations[0].confidence must be a number between 0 and 1"),
    (doc(relations=[{"id": "r", "source": "", "relation": "knows", "target": "b", "created_at": T0}]),
     "relations[0].source must be a non-empty string"),
    (doc(relations=[{"id": "r", "source": "a", "relation": "knows", "target": "b", "created_at": T0}] * 2),
     "relations contains the same id twice"),
])
def test_validation_messages(bad: Any, message: str) -> None:
    with pytest.raises(BadRequest) as err:
        validate(bad)
    assert err.value.message == message


def test_a_document_without_lists_or_embeddings() -> None:
    assert validate({"format": FORMAT, "version": VERSION}) == ([], [], []), "missing lists are empty"
    item = {k: v for k, v in mem_item().items() if k != "embedding"}
    memories, _, _ = validate(doc(memories=[item, mem_item("m2", embedding=None)]))
    assert [m["embedding"] for m in memories] == [[], []], "no embedding or a null one: re-embedded"
    longest = mem_item("i" * 256, scope="s" * 256, content="c" * 32_000)
    (got,) = validate(doc(memories=[longest]))[0]
    assert (got["id"], got["scope"], got["content"]) == ("i" * 256, "s" * 256, "c" * 32_000)


def test_access_count_at_its_limits_is_accepted() -> None:
    memories, _, _ = validate(doc(memories=[mem_item("a", access_count=0), mem_item("b", access_count=2**31)]))
    assert [m["access_count"] for m in memories] == [0, 2**31]


def test_a_bad_document_writes_nothing(pair) -> None:  # type: ignore[no-untyped-def]
    memory, kg, emb = pair
    ent = {"id": "e1", "entity_type": "person", "name": "A", "created_at": T0}
    dangling = doc(memories=[mem_item()], entities=[ent],
                   relations=[{"id": "r", "source": "e1", "relation": "knows", "target": "ghost", "created_at": T0}])
    with pytest.raises(BadRequest) as err:
        import_doc(memory, kg, "a", dangling)
    assert err.value.message == ("relation r: target entity ghost is neither in the document nor in this "
                                 "agent's graph")
    dangling["relations"][0].update(source="ghost", target="e1")
    with pytest.raises(BadRequest) as err:
        import_doc(memory, kg, "a", dangling)
    assert err.value.message.startswith("relation r: source entity ghost")
    assert export(memory, kg, "a")["memories"] == [] and kg.export("a") == ([], [])
    # Another agent's entity does not count as this agent's.
    import_doc(memory, kg, "b", doc(entities=[dict(ent, id="ghost")]))
    with pytest.raises(BadRequest):
        import_doc(memory, kg, "a", dangling)


def test_two_agents_import_the_same_document(pair) -> None:  # type: ignore[no-untyped-def]
    memory, kg, emb = pair
    ents = [{"id": "e1", "entity_type": "person", "name": "A", "created_at": T0},
            {"id": "e2", "entity_type": "person", "name": "B", "created_at": T0}]
    rels = [{"id": "r1", "source": "e1", "relation": "knows", "target": "e2", "created_at": T0}]
    document = doc(memories=[mem_item("m1", "tea"), mem_item("m2", "coffee", embedding=unit(0, 1).tolist())],
                   entities=ents, relations=rels)
    for agent in ("a", "b"):
        assert import_doc(memory, kg, agent, copy.deepcopy(document)) == \
            {"entities_imported": 2, "relations_imported": 1, "memories_imported": 2, "memories_reembedded": 0,
             "errors": []}, f"BUG: agent {agent} did not get its own copy of ids another agent holds"
        emb.vectors["q"] = unit(0, 1)
        assert [(m["id"], round(m["score"], 6)) for m in memory.recall(agent, "q", limit=5)] == \
            [("m2", 1.0), ("m1", 0.0)]
    assert [r["id"] for r in kg.export("b")[1]] == ["r1"]


def test_known_entities_and_relations_are_skipped_one_at_a_time(pair) -> None:  # type: ignore[no-untyped-def]
    memory, kg, emb = pair
    e = {"entity_type": "person", "created_at": T0}
    rel = {"relation": "knows", "created_at": T0}
    first = doc(entities=[dict(e, id="e1", name="A"), dict(e, id="e2", name="B")],
                relations=[dict(rel, id="r1", source="e1", target="e2")])
    assert import_doc(memory, kg, "a", first)["relations_imported"] == 1
    second = doc(entities=[dict(e, id="e1", name="A"), dict(e, id="e3", name="C"), dict(e, id="e4", name="D")],
                 relations=[dict(rel, id="r1", source="e1", target="e2"), dict(rel, id="r2", source="e3", target="e1"),
                            dict(rel, id="r3", source="e4", target="e2")])
    got = import_doc(memory, kg, "a", second)
    assert (got["entities_imported"], got["relations_imported"]) == (2, 2), \
        "BUG: a known entity or relation stopped the import of the ones after it"
    entities, relations = kg.export("a")
    assert sorted(x["id"] for x in entities) == ["e1", "e2", "e3", "e4"]
    assert sorted(x["id"] for x in relations) == ["r1", "r2", "r3"]


def test_a_short_vector_is_scaled_up_to_unit_length(pair) -> None:  # type: ignore[no-untyped-def]
    memory, kg, emb = pair
    import_doc(memory, kg, "a", doc(memories=[mem_item("s", "s", embedding=[0.0, 0.3, 0.4] + [0.0] * 5)]))
    (blob,) = sql(memory, "SELECT embedding FROM memory_fragments WHERE id = 's'")[0]
    assert np.frombuffer(blob, dtype="<f4").tolist() == pytest.approx([0.0, 0.6, 0.8, 0, 0, 0, 0, 0], abs=1e-7)


def test_imported_fragments_are_searchable_at_once(pair) -> None:  # type: ignore[no-untyped-def]
    from agentd.memory.fields import MemoryFilter

    memory, kg, emb = pair
    emb.vectors.update({"x": unit(1), "q": unit(1, 1)})
    x = memory.remember("a", "x")["id"]  # the index is loaded before the import: the import must keep it current
    items = [mem_item("old", "old", created_at="2024-01-01T00:00:00Z", embedding=unit(0, 1).tolist()),
             mem_item("new", "new", created_at="2024-06-01T00:00:00Z", embedding=unit(0, 0, 1).tolist())]
    import_doc(memory, kg, "a", doc(memories=items))
    emb.vectors["q"] = unit(0, 1, 0.5)
    found = memory.recall("a", "q", limit=5, touch=False)
    assert [(m["id"], round(m["score"], 6)) for m in found] == [("old", 0.894427), ("new", 0.447214), (x, 0.0)]
    mid = 1704067200.0 + 86400
    assert [m["id"] for m in memory.recall("a", "q", flt=MemoryFilter(after=mid, before=1735689600.0),
                                           touch=False)] == ["new"]
    assert [m["id"] for m in memory.recall("a", "q", flt=MemoryFilter(before=mid, source="document"),
                                           touch=False)] == ["old"]


def test_import_holds_the_agents_lock(pair) -> None:  # type: ignore[no-untyped-def]
    import threading

    memory, kg, emb = pair
    memory.index("a")
    done: list[dict] = []
    with memory.lock("a"):
        worker = threading.Thread(target=lambda: done.append(import_doc(memory, kg, "a", doc(memories=[mem_item()]))))
        worker.start()
        worker.join(0.4)
        assert worker.is_alive() and done == [], "BUG: an import wrote while another writer held the agent's lock"
    worker.join(30)
    assert done and done[0]["memories_imported"] == 1


def test_export_lists_fragments_in_the_order_they_were_stored(pair) -> None:  # type: ignore[no-untyped-def]
    memory, kg, emb = pair
    made = []
    for i, text in enumerate(["first", "second", "third"]):
        emb.vectors[text] = unit(*([0] * i), 1)
        made.append(memory.remember("a", text)["id"])
    memory.remember("b", "first")
    for fid, when in zip(made, ["2024-03-03 00:00:00.000000", "2024-03-01 00:00:00.000000",
                                "2024-03-02 00:00:00.000000"]):
        write(memory, "UPDATE memory_fragments SET created_at = ? WHERE id = ?", when, fid)
    assert [m["id"] for m in export(memory, kg, "a")["memories"]] == made, "BUG: export not in stored order"
