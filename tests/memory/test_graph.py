"""The knowledge graph (agentd/memory/graph.py) with exact values: entity and relation upserts,
names matched case-insensitively, ambiguous names refused, pattern queries at each max_depth,
backwards and two-ended walks, the relation filter on every hop, cycles returned once, the
match limit, per-agent isolation, export order and forgetting an agent.

In-process on a real SQLite store (the HTTP routes: tests/memory/test_semantic.py).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest
from pony import orm

from agentd.errors import NotFound
from agentd.memory.graph import MATCH_LIMIT, KnowledgeGraph, stamp
from agentd.store import open_store


@pytest.fixture()
def kg(tmp_path: Path) -> KnowledgeGraph:
    return KnowledgeGraph(open_store(tmp_path / "g.db"))


def ent(kg: KnowledgeGraph, name: str, kind: str = "concept", agent: str = "a", **props) -> str:  # type: ignore[no-untyped-def]
    out = kg.add_entity(agent, kind, name, props)
    assert out["created"] is True
    return out["id"]


def rel(kg: KnowledgeGraph, src: str, relation: str, dst: str, agent: str = "a", confidence: float = 1.0) -> str:
    out = kg.add_relation(agent, src, relation, dst, {}, confidence)
    assert out["created"] is True
    return out["id"]


def triples(matches: list[dict]) -> list[tuple[str, str, str, int]]:
    return [(m["source"]["name"], m["relation"]["relation"], m["target"]["name"], m["depth"]) for m in matches]


def test_stamp_accepts_raw_text() -> None:
    assert stamp("2024-05-01 12:00:00") == "2024-05-01T12:00:00+00:00"
    assert stamp(datetime(2024, 5, 1, 12)) == "2024-05-01T12:00:00+00:00"


def test_entity_upsert_by_name_and_type(kg: KnowledgeGraph) -> None:
    first = kg.add_entity("a", "person", "Alice", {"age": 30, "city": "Paris"})
    assert first["created"] is True and len(first["id"]) == 36
    time.sleep(0.002)
    again = kg.add_entity("a", "person", "ALICE", {"city": "Lyon", "team": "x"})
    assert again == {"id": first["id"], "created": False}, "BUG: same name and type is a new entity"
    (alice,) = [e for e in kg.export("a")[0]]
    assert alice["name"] == "ALICE" and alice["entity_type"] == "person"
    assert alice["properties"] == {"age": 30, "city": "Lyon", "team": "x"}
    assert alice["updated_at"] > alice["created_at"]
    assert set(alice) == {"id", "entity_type", "name", "properties", "created_at", "updated_at"}
    other_type = kg.add_entity("a", "project", "Alice", {})
    assert other_type["created"] is True and other_type["id"] != first["id"]
    other_agent = kg.add_entity("b", "person", "Alice", {})
    assert other_agent["created"] is True and other_agent["id"] != first["id"]


def test_entity_with_a_given_id(kg: KnowledgeGraph) -> None:
    made = kg.add_entity("a", "tool", "hammer", {"w": 1}, entity_id="e-1")
    assert made == {"id": "e-1", "created": True}
    # The same id again updates that entity, whatever its name now.
    assert kg.add_entity("a", "tool", "mallet", {"h": 2}, entity_id="e-1") == {"id": "e-1", "created": False}
    (e,) = kg.export("a")[0]
    assert (e["id"], e["name"], e["properties"]) == ("e-1", "mallet", {"w": 1, "h": 2})
    # An unknown id with a known name and type: the named entity is updated.
    assert kg.add_entity("a", "tool", "Mallet", {}, entity_id="e-2") == {"id": "e-1", "created": False}


def test_relation_upsert_by_id_or_name_and_unknown_ends(kg: KnowledgeGraph) -> None:
    alice = ent(kg, "Alice", "person")
    acme = ent(kg, "Acme", "organization")
    made = kg.add_relation("a", "alice", "works_at", acme, {"since": 2020}, 0.5)
    assert made["created"] is True
    again = kg.add_relation("a", alice, "works_at", "ACME", {"role": "dev"}, 0.8)
    assert again == {"id": made["id"], "created": False}, "BUG: same triple is a new relation"
    (r,) = kg.export("a")[1]
    assert r == {"id": made["id"], "source": alice, "relation": "works_at", "target": acme,
                 "properties": {"since": 2020, "role": "dev"}, "confidence": 0.8, "created_at": r["created_at"]}
    assert kg.add_relation("a", alice, "knows_about", acme, {}, 1.0)["created"] is True
    with pytest.raises(NotFound) as err:
        kg.add_relation("a", "Bob", "knows", acme, {}, 1.0)
    assert str(err.value) == "entity not found: Bob"
    with pytest.raises(NotFound) as err:
        kg.add_relation("a", alice, "knows", "Nobody", {}, 1.0)
    assert str(err.value) == "entity not found: Nobody"
    with pytest.raises(NotFound):
        kg.add_relation("b", alice, "knows", acme, {}, 1.0)  # another agent's entities


def test_an_ambiguous_name_is_not_found(kg: KnowledgeGraph) -> None:
    ent(kg, "Mercury", "concept")
    planet = ent(kg, "mercury", "location")
    god = ent(kg, "Zeus", "person")
    with pytest.raises(NotFound):
        kg.add_relation("a", "Mercury", "related_to", god, {}, 1.0)
    assert kg.add_relation("a", planet, "related_to", "zeus", {}, 1.0)["created"] is True


@pytest.fixture()
def chain(kg: KnowledgeGraph) -> KnowledgeGraph:
    """A -r-> B -r-> C -r-> D, and D -other-> A (a cycle of four)."""
    for name in "ABCD":
        ent(kg, name)
    for a, b in ("AB", "BC", "CD"):
        rel(kg, a, "r", b)
    rel(kg, "D", "other", "A")
    return kg


def test_forward_walk_at_each_depth(chain: KnowledgeGraph) -> None:
    assert triples(chain.query("a", source="A", max_depth=1)) == [("A", "r", "B", 1)]
    assert triples(chain.query("a", source="A")) == [("A", "r", "B", 1)], "max_depth defaults to 1"
    assert triples(chain.query("a", source="A", max_depth=2)) == [("A", "r", "B", 1), ("B", "r", "C", 2)]
    assert triples(chain.query("a", source="A", max_depth=3)) == \
        [("A", "r", "B", 1), ("B", "r", "C", 2), ("C", "r", "D", 3)]
    # The cycle: every relation once, at its shortest depth, and the walk ends.
    assert triples(chain.query("a", source="A", max_depth=16)) == \
        [("A", "r", "B", 1), ("B", "r", "C", 2), ("C", "r", "D", 3), ("D", "other", "A", 4)]
    assert triples(chain.query("a", source="c", max_depth=2)) == [("C", "r", "D", 1), ("D", "other", "A", 2)]


def test_the_relation_filter_applies_to_every_hop(chain: KnowledgeGraph) -> None:
    assert triples(chain.query("a", source="C", relation="r", max_depth=5)) == [("C", "r", "D", 1)]
    assert chain.query("a", source="D", relation="r", max_depth=5) == []
    assert triples(chain.query("a", relation="other")) == [("D", "other", "A", 1)]
    assert triples(chain.query("a")) == [("A", "r", "B", 1), ("B", "r", "C", 1), ("C", "r", "D", 1),
                                         ("D", "other", "A", 1)]


def test_backward_walk_at_each_depth(chain: KnowledgeGraph) -> None:
    assert triples(chain.query("a", target="D", max_depth=1)) == [("C", "r", "D", 1)]
    assert triples(chain.query("a", target="D", max_depth=2)) == [("C", "r", "D", 1), ("B", "r", "C", 2)]
    assert triples(chain.query("a", target="B", relation="r", max_depth=3)) == [("A", "r", "B", 1)]


def test_walk_between_two_ends(chain: KnowledgeGraph) -> None:
    assert chain.query("a", source="A", target="C", max_depth=1) == []
    assert triples(chain.query("a", source="A", target="C", max_depth=2)) == [("A", "r", "B", 1), ("B", "r", "C", 2)]
    assert triples(chain.query("a", source="A", target="B", max_depth=1)) == [("A", "r", "B", 1)]
    # Through the cycle: only relations on a walk of at most 3 hops from B to A.
    assert triples(chain.query("a", source="B", target="A", max_depth=3)) == \
        [("B", "r", "C", 1), ("C", "r", "D", 2), ("D", "other", "A", 3)]
    assert chain.query("a", source="B", target="A", max_depth=2) == []


def test_unknown_ends_and_other_agents_match_nothing(chain: KnowledgeGraph) -> None:
    assert chain.query("a", source="Nobody", max_depth=3) == []
    assert chain.query("a", target="Nobody", max_depth=3) == []
    assert chain.query("a", source="A", target="Nobody", max_depth=3) == []
    assert chain.query("b", source="A", max_depth=3) == [] and chain.query("b") == []


def test_query_result_shape(chain: KnowledgeGraph) -> None:
    (m,) = chain.query("a", source="A", max_depth=1)
    assert set(m) == {"source", "relation", "target", "depth"}
    assert set(m["source"]) == {"id", "entity_type", "name", "properties", "created_at", "updated_at"}
    assert set(m["relation"]) == {"id", "source", "relation", "target", "properties", "confidence", "created_at"}
    assert m["relation"]["source"] == m["source"]["id"] and m["relation"]["target"] == m["target"]["id"]
    assert m["relation"]["confidence"] == 1.0 and m["source"]["entity_type"] == "concept"


def test_matches_are_capped(kg: KnowledgeGraph) -> None:
    assert MATCH_LIMIT == 1000
    with orm.db_session:  # a hub with MATCH_LIMIT + 1 relations, written in one session
        for i in range(MATCH_LIMIT + 2):
            kg.store.e.EntityRow(agent_id="a", id=f"e{i}", entity_type="concept", name=f"n{i}", properties="{}",
                                 created_at=datetime(2024, 1, 1), updated_at=datetime(2024, 1, 1))
        for i in range(1, MATCH_LIMIT + 2):
            kg.store.e.RelationRow(agent_id="a", id=f"r{i}", source="e0", relation="has", target=f"e{i}",
                                   properties="{}", confidence=1.0, created_at=datetime(2024, 1, 1))
    out = kg.query("a", source="e0")
    assert len(out) == MATCH_LIMIT and out[0]["relation"]["id"] == "r1"
    assert out[-1]["relation"]["id"] == f"r{MATCH_LIMIT}"


def test_export_order_and_forget(kg: KnowledgeGraph) -> None:
    ids = [ent(kg, n) for n in ("Z", "Y", "X")]
    rid = rel(kg, "Z", "r", "Y")
    keep = ent(kg, "Z", agent="b")
    ents, rels = kg.export("a")
    assert [e["id"] for e in ents] == ids and [r["id"] for r in rels] == [rid]
    kg.forget_agent("a")
    assert kg.export("a") == ([], [])
    assert [e["id"] for e in kg.export("b")[0]] == [keep]


def test_a_new_relation_keeps_its_confidence_and_rows_without_properties(kg: KnowledgeGraph) -> None:
    a, b = ent(kg, "A"), ent(kg, "B")
    rid = kg.add_relation("a", a, "knows", b, {"p": 1}, 0.25)["id"]
    assert [(r["id"], r["confidence"], r["properties"]) for r in kg.export("a")[1]] == [(rid, 0.25, {"p": 1})]
    # Rows whose properties column is empty (written by another tool) read as {}.
    with orm.db_session:
        kg.store.db.execute("UPDATE kg_relations SET properties = ''")
        kg.store.db.execute("UPDATE kg_entities SET properties = ''")
    assert kg.export("a")[1][0]["properties"] == {} and kg.export("a")[0][0]["properties"] == {}
    assert kg.add_relation("a", a, "knows", b, {"q": 2}, 0.5) == {"id": rid, "created": False}
    assert kg.add_entity("a", "concept", "A", {"r": 3}) == {"id": a, "created": False}
    assert kg.export("a")[1][0]["properties"] == {"q": 2} and kg.export("a")[0][0]["properties"] == {"r": 3}


def test_export_is_in_insertion_order_whatever_the_ids(kg: KnowledgeGraph) -> None:
    with orm.db_session:
        for i in (3, 1, 2):
            kg.store.e.EntityRow(agent_id="a", id=f"e{i}", entity_type="concept", name=f"n{i}", properties="{}",
                                 created_at=datetime(2024, 1, 1), updated_at=datetime(2024, 1, 1))
        for i in (3, 1, 2):
            kg.store.e.RelationRow(agent_id="a", id=f"r{i}", source="e1", relation="has", target=f"e{i}",
                                   properties="{}", confidence=1.0, created_at=datetime(2024, 1, 1))
    ents, rels = kg.export("a")
    assert [e["id"] for e in ents] == ["e3", "e1", "e2"] and [r["id"] for r in rels] == ["r3", "r1", "r2"]
    assert [m["relation"]["id"] for m in kg.query("a", source="e1")] == ["r3", "r1", "r2"]


def test_an_entity_id_is_looked_up_in_the_agents_own_graph(kg: KnowledgeGraph) -> None:
    other = kg.add_entity("b", "tool", "saw", {"o": 1}, entity_id="e-1")
    mine = kg.add_entity("a", "person", "Alice", {})
    assert other == {"id": "e-1", "created": True}
    # Agent a names id e-1 (agent b's): a new entity of a's, b's untouched.
    assert kg.add_entity("a", "tool", "hammer", {"w": 2}, entity_id="e-1") == {"id": "e-1", "created": True}, \
        "BUG: an entity id matched another agent's entity"
    assert [(e["name"], e["properties"]) for e in kg.export("b")[0]] == [("saw", {"o": 1})]
    assert sorted(e["id"] for e in kg.export("a")[0]) == sorted([mine["id"], "e-1"])
    # An id the agent does not have: created with that id, whatever else the agent has.
    assert kg.add_entity("a", "project", "Apollo", {}, entity_id="p-9") == {"id": "p-9", "created": True}


def test_entities_with_the_same_ids_in_two_agents(kg: KnowledgeGraph) -> None:
    """Import keeps ids: two agents can hold entity ids alike; a query shows the agent's own."""
    for agent, prefix in (("a", "A"), ("b", "B")):
        for i in (1, 2):
            kg.add_entity(agent, "concept", f"{prefix}{i}", {}, entity_id=f"e{i}")
        kg.add_relation(agent, "e1", "r", "e2", {}, 1.0)
    assert triples(kg.query("a", source="e1")) == [("A1", "r", "A2", 1)]
    assert triples(kg.query("b")) == [("B1", "r", "B2", 1)]


def test_a_relation_whose_entity_is_gone_is_left_out(kg: KnowledgeGraph) -> None:
    a, b, c = ent(kg, "A"), ent(kg, "B"), ent(kg, "C")
    rel(kg, a, "r", b)
    rel(kg, a, "r", c)
    with orm.db_session:  # removed behind the graph's back (another tool, a partial restore)
        kg.store.db.execute(f"DELETE FROM kg_entities WHERE id = '{c}'")
    assert triples(kg.query("a", source="A")) == [("A", "r", "B", 1)]
    assert triples(kg.query("a")) == [("A", "r", "B", 1)]
