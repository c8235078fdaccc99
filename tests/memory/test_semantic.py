"""Semantic memory and the knowledge graph, end to end through the real daemon.

Every test drives `agentd start` over HTTP with the bundled embedding model (no network);
the agent-loop tests use the fake LLM and read what it was sent.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
import pytest
from conftest import LLM_ENV, llm_config
from support import Daemon, db_rows, make_home
import sqlite3
from datetime import datetime
import numpy as np
from memsupport import ScriptedEmbedder, add_agents, at, new_memory, sql, unit
from agentd.errors import NotFound
from agentd.memory.semantic import DEDUP_THRESHOLD, SUPERSEDE_THRESHOLD, contradicts


STOP = {"the", "a", "an", "is", "in", "my", "i", "me", "of", "at", "on", "to", "does", "do", "this", "what",
        "which", "when", "we", "our", "for", "be", "must", "could", "name"}


def spawn(d: Daemon, extra: str = "") -> str:
    name = f"m-{uuid.uuid4().hex[:8]}"
    toml = f'name = "{name}"\n{extra}\n[model]\nprovider = "default"\nmodel = "default"\n'
    r = d.post("/api/agents", json={"manifest_toml": toml})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def base(agent_id: str) -> str:
    return f"/api/memory/agents/{agent_id}"


def remember(d: Daemon, agent_id: str, content: str, **fields: Any) -> dict[str, Any]:
    r = d.post(f"{base(agent_id)}/memories", json={"content": content, **fields})
    assert r.status_code == 201, r.text
    return r.json()


def recall(d: Daemon, agent_id: str, query: str, **body: Any) -> list[dict[str, Any]]:
    r = d.post(f"{base(agent_id)}/recall", json={"query": query, **body})
    assert r.status_code == 200, r.text
    return r.json()["memories"]


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOP}


FACTS = ["The user's favourite drink is green tea",
         "My sister works as a nurse in Berlin",
         "Our office cat is called Whiskers",
         "The quarterly report is due on Friday",
         "I am allergic to peanuts",
         "Bob plays the violin in an orchestra"]
QUESTIONS = [("What beverage does this person prefer?", 0),
             ("Which city is my sibling employed in?", 1),
             ("Name of the pet feline at work?", 2),
             ("When must the financial summary be submitted?", 3),
             ("Which foods could trigger a reaction for me?", 4),
             ("What musical instrument does Robert perform?", 5)]


@pytest.fixture(scope="module")
def d(agent_daemon: Daemon) -> Daemon:
    return agent_daemon


def test_recall_by_meaning_without_shared_words(d: Daemon) -> None:
    agent = spawn(d)
    ids = [remember(d, agent, fact)["id"] for fact in FACTS]
    for question, expected in QUESTIONS:
        assert not words(question) & words(FACTS[expected]), question  # a keyword match cannot pass
        found = recall(d, agent, question, limit=3)
        assert found[0]["id"] == ids[expected], (question, found)
        assert found[0]["content"] == FACTS[expected]
        assert found[0]["score"] > found[1]["score"]
        assert set(found[0]) >= {"id", "agent_id", "content", "metadata", "source", "scope", "confidence",
                                 "created_at", "accessed_at", "access_count", "score"}
        assert "embedding" not in found[0]
    # Recall counts accesses of what it returned (once per recall above).
    got = d.get(f"{base(agent)}/memories/{ids[0]}").json()
    assert got["access_count"] >= 1 and got["accessed_at"] >= got["created_at"]
    untouched = d.get(f"{base(agent)}/memories/{ids[5]}").json()
    before = untouched["access_count"]
    recall(d, agent, "What musical instrument does Robert perform?", limit=1)
    assert d.get(f"{base(agent)}/memories/{ids[5]}").json()["access_count"] == before + 1
    # min_score drops weak matches; limit caps.
    assert recall(d, agent, "What beverage does this person prefer?", min_score=0.5, limit=5)[0]["id"] == ids[0]
    assert len(recall(d, agent, "What beverage does this person prefer?", min_score=0.5, limit=5)) == 1
    assert len(recall(d, agent, "anything", limit=2)) == 2


def test_write_validation_and_unknown_agent(d: Daemon) -> None:
    agent = spawn(d)
    bad = [({"content": ""}, "content"), ({"content": 5}, "content"), ({}, "content"),
           ({"content": "x", "source": "gossip"}, "source"), ({"content": "x", "confidence": 1.5}, "confidence"),
           ({"content": "x", "confidence": "high"}, "confidence"), ({"content": "x", "metadata": [1]}, "metadata"),
           ({"content": "x", "scope": ""}, "scope")]
    for body, field in bad:
        r = d.post(f"{base(agent)}/memories", json=body)
        assert r.status_code == 400 and field in r.json()["error"], (body, r.text)
    r = d.post(f"{base(agent)}/memories", json=["not", "an", "object"])
    assert r.status_code == 400
    assert d.get(f"{base(agent)}/memories").json() == {"memories": [], "total": 0}
    created = remember(d, agent, "Default fields apply")
    assert created["merged"] is False
    got = d.get(f"{base(agent)}/memories/{created['id']}").json()
    assert (got["source"], got["scope"], got["confidence"], got["metadata"], got["access_count"]) == \
        ("user_provided", "semantic", 1.0, {}, 0)
    ghost = str(uuid.uuid4())
    for method, path, body in [("post", "memories", {"content": "x"}), ("get", "memories", None),
                               ("post", "recall", {"query": "x"}), ("post", "entities", {}),
                               ("post", "consolidate", None), ("get", "export", None)]:
        r = d.request(method, f"{base(ghost)}/{path}", json=body)
        assert r.status_code == 404 and r.json()["error"], (path, r.text)
    assert d.post(f"{base(agent)}/recall", json={"query": "x", "limit": 0}).status_code == 400
    assert d.post(f"{base(agent)}/recall", json={"query": "x", "filter": {"colour": "red"}}).status_code == 400
    assert d.post(f"{base(agent)}/recall", json={"query": "x", "filter": {"after": "yesterday"}}).status_code == 400
    assert d.get(f"{base(agent)}/memories/{uuid.uuid4()}").status_code == 404


def test_dedup_merges_paraphrases_but_keeps_contradictions(d: Daemon) -> None:
    agent = spawn(d)
    first = remember(d, agent, "The user's dog is called Rex", metadata={"topic": "pets"}, confidence=0.6)
    again = remember(d, agent, "The user has a dog named Rex", metadata={"checked": True}, confidence=0.9)
    assert again == {"id": first["id"], "merged": True}
    merged = d.get(f"{base(agent)}/memories/{first['id']}").json()
    assert merged["content"] == "The user has a dog named Rex"
    assert merged["metadata"] == {"topic": "pets", "checked": True}
    assert merged["confidence"] == 0.9
    assert d.get(f"{base(agent)}/memories").json()["total"] == 1

    positive = remember(d, agent, "Bob is vegetarian")
    negative = remember(d, agent, "Bob is not vegetarian")
    assert negative["merged"] is False and negative["id"] != positive["id"]
    found = recall(d, agent, "Does Bob eat meat?", limit=2)
    assert [f["id"] for f in found] == [negative["id"], positive["id"]]  # the newer fact first

    moved = remember(d, agent, "Alice no longer lives in Paris")
    assert moved["merged"] is False
    three = remember(d, agent, "The meeting is at 3pm")
    four = remember(d, agent, "The meeting is at 4pm")
    assert four["merged"] is False and four["id"] != three["id"]
    assert [f["id"] for f in recall(d, agent, "When is the meeting?", limit=2)] == [four["id"], three["id"]]
    assert d.get(f"{base(agent)}/memories").json()["total"] == 6


def test_every_filter(d: Daemon) -> None:
    agent = spawn(d)
    a = remember(d, agent, "Deploys go out on Tuesdays", source="document", scope="procedural",
                 metadata={"team": "ops", "level": 2}, confidence=0.4)["id"]
    time.sleep(0.05)
    middle = datetime.now(timezone.utc).isoformat()
    time.sleep(0.05)
    b = remember(d, agent, "Releases are shipped every Tuesday afternoon", source="observation",
                 scope="semantic", metadata={"team": "ops", "level": 3}, confidence=0.9)["id"]
    c = remember(d, agent, "Rollouts happen weekly, midweek", source="observation", scope="procedural",
                 metadata={"team": "web", "level": 2}, confidence=0.7)["id"]

    def ids(flt: dict[str, Any]) -> set[str]:
        return {f["id"] for f in recall(d, agent, "When do we release software?", limit=10, filter=flt)}

    assert ids({}) == {a, b, c}
    assert ids({"source": "observation"}) == {b, c}
    assert ids({"source": "document"}) == {a}
    assert ids({"source": "system"}) == set()
    assert ids({"scope": "procedural"}) == {a, c}
    assert ids({"min_confidence": 0.7}) == {b, c}
    assert ids({"after": middle}) == {b, c}
    assert ids({"before": middle}) == {a}
    assert ids({"metadata": {"team": "ops"}}) == {a, b}
    assert ids({"metadata": {"team": "ops", "level": 2}}) == {a}
    assert ids({"metadata": {"level": "2"}}) == set()  # equality keeps the JSON type
    assert ids({"metadata": {"team": "ops"}, "scope": "semantic", "source": "observation"}) == {b}
    assert d.post(f"{base(agent)}/recall", json={"query": "q", "filter": {"source": "gossip"}}).status_code == 400


def test_agents_never_see_each_others_memories(d: Daemon) -> None:
    one, two = spawn(d), spawn(d)
    secret = remember(d, one, "The vault password hint is the name of my first teacher")["id"]
    remember(d, two, "The garden needs watering twice a week")
    found = recall(d, two, "What helps me remember the vault password?", limit=10)
    assert [f["content"] for f in found] == ["The garden needs watering twice a week"]
    assert d.get(f"{base(two)}/memories/{secret}").status_code == 404
    assert d.delete(f"{base(two)}/memories/{secret}").status_code == 404
    assert d.get(f"{base(two)}/memories").json()["total"] == 1
    # The same text in another agent is its own fragment, not a merge.
    copy = remember(d, two, "The vault password hint is the name of my first teacher")
    assert copy["merged"] is False and copy["id"] != secret


def test_list_paging_get_and_delete(d: Daemon) -> None:
    agent = spawn(d)
    ids = [remember(d, agent, text)["id"] for text in
           ["Paris is the capital of France", "Photosynthesis needs sunlight", "Rust has a borrow checker"]]
    page = d.get(f"{base(agent)}/memories?limit=2&offset=0").json()
    assert page["total"] == 3 and [m["id"] for m in page["memories"]] == [ids[2], ids[1]]
    assert [m["id"] for m in d.get(f"{base(agent)}/memories?limit=2&offset=2").json()["memories"]] == [ids[0]]
    assert d.get(f"{base(agent)}/memories?limit=abc").status_code == 400
    assert d.delete(f"{base(agent)}/memories/{ids[1]}").json()["status"] == "deleted"
    assert d.get(f"{base(agent)}/memories/{ids[1]}").status_code == 404
    assert [f["id"] for f in recall(d, agent, "How do plants make food from light?", limit=3)][0] != ids[1]
    assert d.get(f"{base(agent)}/memories").json()["total"] == 2


def entity(d: Daemon, agent: str, kind: str, name: str, **props: Any) -> str:
    r = d.post(f"{base(agent)}/entities", json={"entity_type": kind, "name": name, "properties": props})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def relate(d: Daemon, agent: str, source: str, relation: str, target: str, **body: Any) -> str:
    r = d.post(f"{base(agent)}/relations", json={"source": source, "relation": relation, "target": target, **body})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def triples(d: Daemon, agent: str, **pattern: Any) -> list[tuple[str, str, str]]:
    r = d.post(f"{base(agent)}/graph/query", json=pattern)
    assert r.status_code == 200, r.text
    return [(m["source"]["name"], m["relation"]["relation"], m["target"]["name"]) for m in r.json()["matches"]]


def test_graph_depth_cycles_and_validation(d: Daemon) -> None:
    agent = spawn(d)
    alice = entity(d, agent, "person", "Alice", role="engineer")
    acme = entity(d, agent, "organization", "Acme")
    paris = entity(d, agent, "location", "Paris")
    entity(d, agent, {"custom": "hobby"}, "Chess")
    relate(d, agent, alice, "works_at", acme, confidence=0.8)
    relate(d, agent, "Acme", "located_in", "Paris")
    relate(d, agent, paris, "related_to", alice)  # a cycle back to the start
    relate(d, agent, "Alice", "enjoys", "Chess")  # a custom relation
    assert triples(d, agent, source=alice) == [("Alice", "works_at", "Acme"), ("Alice", "enjoys", "Chess")]
    assert triples(d, agent, source="alice", max_depth=2) == [
        ("Alice", "works_at", "Acme"), ("Alice", "enjoys", "Chess"), ("Acme", "located_in", "Paris")]
    full = triples(d, agent, source=alice, max_depth=16)
    assert len(full) == len(set(full)) == 4  # the cycle ends, each relation once
    assert triples(d, agent, source=alice, relation="works_at", max_depth=3) == [("Alice", "works_at", "Acme")]
    assert triples(d, agent, target="Paris", max_depth=2) == [("Acme", "located_in", "Paris"),
                                                              ("Alice", "works_at", "Acme")]
    assert triples(d, agent, source=alice, target=paris, max_depth=2) == [("Alice", "works_at", "Acme"),
                                                                           ("Acme", "located_in", "Paris")]
    assert triples(d, agent, source=alice, target=paris, max_depth=1) == []
    assert len(triples(d, agent)) == 4
    assert triples(d, agent, relation="located_in") == [("Acme", "located_in", "Paris")]
    match = d.post(f"{base(agent)}/graph/query", json={"source": alice}).json()["matches"][0]
    assert match["source"]["properties"] == {"role": "engineer"} and match["source"]["entity_type"] == "person"
    assert match["relation"]["confidence"] == 0.8 and match["relation"]["source"] == alice
    # Unknown entities, bad bodies.
    r = d.post(f"{base(agent)}/relations", json={"source": alice, "relation": "knows", "target": "Nobody"})
    assert r.status_code == 404 and "Nobody" in r.json()["error"]
    for body in [{"entity_type": "person"}, {"entity_type": "", "name": "x"}, {"name": "x", "entity_type": 3},
                 {"name": "x", "entity_type": "person", "properties": "p"}]:
        assert d.post(f"{base(agent)}/entities", json=body).status_code == 400, body
    for pattern in [{"max_depth": 0}, {"max_depth": -3}, {"max_depth": "2"}, {"max_depth": 2.5},
                    {"max_depth": True}]:
        r = d.post(f"{base(agent)}/graph/query", json=pattern)
        assert (r.status_code, r.json()) == (400, {"error": "max_depth must be an integer of at least 1"}), pattern
    assert d.post(f"{base(agent)}/graph/query", json={"source": 5}).status_code == 400
    assert d.post(f"{base(agent)}/relations", json={"source": alice, "relation": "x", "target": acme,
                                                    "confidence": 2}).status_code == 400
    other = spawn(d)
    assert triples(d, other) == []
    assert d.post(f"{base(other)}/relations", json={"source": alice, "relation": "knows",
                                                    "target": acme}).status_code == 404



def test_graph_depth_beyond_16_walks_16_hops(d: Daemon) -> None:
    """The spec types `max_depth` as an integer: a deep one is clamped to the 16 hops walked."""
    agent = spawn(d)
    for i in range(19):
        entity(d, agent, "concept", f"N{i}")
    for i in range(18):
        relate(d, agent, f"N{i}", "leads_to", f"N{i + 1}")
    sixteen = [(f"N{i}", "leads_to", f"N{i + 1}") for i in range(16)]
    for depth in (16, 17, 50, 2**63, 7110.0):
        r = d.post(f"{base(agent)}/graph/query", json={"source": "N0", "max_depth": depth})
        assert r.status_code == 200, (depth, r.text)
        matches = r.json()["matches"]
        assert [(m["source"]["name"], m["relation"]["relation"], m["target"]["name"]) for m in matches] == sixteen
        assert [m["depth"] for m in matches] == list(range(1, 17))
    assert triples(d, agent, target="N18", max_depth=50) == [(f"N{i}", "leads_to", f"N{i + 1}")
                                                             for i in range(17, 1, -1)]


def old(days: float) -> str:
    return (datetime.now(timezone.utc) - timedelta(days=days)).isoformat()


def doc(memories: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"format": "agentd.memory", "version": 1, "embedding_model": "someone-else/model",
            "memories": memories, "entities": [], "relations": [], **extra}


def fragment(content: str, **fields: Any) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "content": content, "source": "document", "scope": "semantic",
            "confidence": 1.0, "metadata": {}, "created_at": old(60), "accessed_at": old(60), "access_count": 0,
            "embedding": [0.5, 0.5, 0.5], **fields}


def test_consolidation_merges_decays_and_drops(d: Daemon) -> None:
    agent = spawn(d)
    dup_a = fragment("The backup job runs every night at midnight", created_at=old(5), accessed_at=old(1))
    dup_b = fragment("Every night at midnight the backup job runs", created_at=old(4), accessed_at=old(1),
                     metadata={"checked": True})
    stale = fragment("The old wiki lives on the intranet", confidence=0.8)
    faded = fragment("The printer on floor two jams often", confidence=0.105)
    fresh = fragment("The coffee machine is on the third floor", accessed_at=old(1))
    report = d.post(f"{base(agent)}/import", json=doc([dup_a, dup_b, stale, faded, fresh])).json()
    assert report["memories_imported"] == 5 and report["memories_reembedded"] == 5
    r = d.post(f"{base(agent)}/consolidate")
    assert r.status_code == 200
    report = r.json()
    assert set(report) >= {"memories_merged", "memories_decayed", "duration_ms"}
    assert report["memories_merged"] == 1
    assert report["memories_decayed"] == 2 and report["memories_dropped"] == 1
    assert isinstance(report["duration_ms"], int)
    assert d.get(f"{base(agent)}/memories/{dup_b['id']}").status_code == 404
    kept = d.get(f"{base(agent)}/memories/{dup_a['id']}").json()
    assert kept["content"] == dup_b["content"] and kept["metadata"] == {"checked": True}
    assert d.get(f"{base(agent)}/memories/{stale['id']}").json()["confidence"] == pytest.approx(0.72)
    assert d.get(f"{base(agent)}/memories/{faded['id']}").status_code == 404
    assert d.get(f"{base(agent)}/memories/{fresh['id']}").json()["confidence"] == 1.0
    assert d.get(f"{base(agent)}/memories").json()["total"] == 3
    again = d.post(f"{base(agent)}/consolidate").json()
    assert again["memories_merged"] == 0 and again["memories_decayed"] == 1


def test_export_import_round_trip(d: Daemon) -> None:
    source, target = spawn(d), spawn(d)
    ids = [remember(d, source, f, metadata={"n": i}, scope="preferences" if i % 2 else "semantic")["id"]
           for i, f in enumerate(FACTS[:4])]
    recall(d, source, "What beverage does this person prefer?", limit=1)
    alice = entity(d, source, "person", "Alice")
    acme = entity(d, source, "organization", "Acme")
    rel = relate(d, source, alice, "works_at", acme)
    exported = d.get(f"{base(source)}/export").json()
    assert exported["format"] == "agentd.memory" and exported["version"] == 1
    assert exported["embedding_model"] == "all-MiniLM-L6-v2-onnx-int8"
    assert [m["id"] for m in exported["memories"]] == ids
    assert all(len(m["embedding"]) == 384 for m in exported["memories"])
    assert [e["id"] for e in exported["entities"]] == [alice, acme] and exported["relations"][0]["id"] == rel

    report = d.post(f"{base(target)}/import", json=exported).json()
    assert report == {"memories_imported": 4, "entities_imported": 2, "relations_imported": 1,
                      "memories_reembedded": 0, "errors": []}
    assert d.post(f"{base(target)}/import", json=exported).json() == {
        "memories_imported": 0, "entities_imported": 0, "relations_imported": 0, "memories_reembedded": 0,
        "errors": []}
    again = d.get(f"{base(target)}/export").json()
    for key in ("memories", "entities", "relations"):
        strip = [{k: v for k, v in item.items() if k != "agent_id"} for item in again[key]]
        assert strip == [{k: v for k, v in item.items() if k != "agent_id"} for item in exported[key]], key
    assert recall(d, target, "Which city is my sibling employed in?", limit=1)[0]["id"] == ids[1]
    assert triples(d, target, source="Alice") == [("Alice", "works_at", "Acme")]

    # Bad documents: 400 and nothing written, even when the fault is in the last item.
    fresh = spawn(d)
    good = fragment("Tea is best brewed at eighty degrees")
    bad_docs = [[1, 2], {"format": "other", "version": 1}, doc([good, fragment("x", source="gossip")]),
                doc([good, fragment("x", confidence=3)]), doc([good, fragment("")]),
                doc([good, fragment("y", created_at="not a date")]), doc([good, good]),
                doc([good], relations=[{"id": "r1", "source": "e1", "relation": "uses", "target": "e2",
                                        "created_at": old(1)}]),
                doc([good], entities=[{"id": "e1", "name": "n"}])]
    for bad in bad_docs:
        r = d.post(f"{base(fresh)}/import", json=bad)
        assert r.status_code == 400 and r.json()["error"], (bad, r.text)
    assert d.get(f"{base(fresh)}/memories").json()["total"] == 0
    assert triples(d, fresh) == []
    # A vector from another model is re-embedded, so recall by meaning still works.
    report = d.post(f"{base(fresh)}/import", json=doc([good])).json()
    assert report["memories_imported"] == 1 and report["memories_reembedded"] == 1
    assert recall(d, fresh, "What temperature should the water be for a cuppa?", limit=1)[0]["id"] == good["id"]


def test_import_of_an_entity_the_graph_holds_updates_it(d: Daemon) -> None:
    """An imported entity of the name and type of one the agent has is that entity (as POST
    .../entities): no second Ann, the document's relations land on the one Ann, and names keep
    finding her. The items' `agent_id` (the agent exported from) is ignored, and a fragment
    superseded by a fragment no longer there is imported as not superseded."""
    agent = spawn(d)
    ann = entity(d, agent, "person", "Ann", role="engineer")
    other = spawn(d)
    kept, older = fragment("Ann drinks green tea", agent_id=other), fragment("Ann drinks coffee", agent_id=other)
    older["superseded_by"] = kept["id"]
    gone = fragment("Ann lived in Oslo", agent_id=other, superseded_by=str(uuid.uuid4()))
    twin, bob = str(uuid.uuid4()), str(uuid.uuid4())
    people = [{"id": twin, "entity_type": "person", "name": "ann", "properties": {"team": "core"}, "created_at": old(1),
               "agent_id": other},
              {"id": bob, "entity_type": "person", "name": "Bob", "created_at": old(1), "agent_id": other}]
    links = [{"id": str(uuid.uuid4()), "source": twin, "relation": "knows_about", "target": bob, "created_at": old(1),
              "agent_id": other}]
    document = doc([kept, older, gone], agent_id=other, entities=people, relations=links)
    report = d.post(f"{base(agent)}/import", json=document).json()
    assert report == {"memories_imported": 3, "entities_imported": 1, "relations_imported": 1,
                      "memories_reembedded": 3, "errors": []}
    exported = d.get(f"{base(agent)}/export").json()
    assert [(e["id"], e["name"], e["properties"]) for e in exported["entities"]] == [
        (ann, "Ann", {"role": "engineer", "team": "core"}), (bob, "Bob", {})]
    assert [(r["source"], r["target"]) for r in exported["relations"]] == [(ann, bob)]
    assert {m["agent_id"] for m in exported["memories"]} == {agent}
    assert {m["content"]: m["superseded_by"] for m in exported["memories"]} == {
        "Ann drinks green tea": None, "Ann drinks coffee": kept["id"], "Ann lived in Oslo": None}
    assert d.post(f"{base(agent)}/relations", json={"source": "Ann", "relation": "works_at",
                                                    "target": "Bob"}).status_code == 201
    assert sorted(triples(d, agent, source="Ann")) == [("Ann", "knows_about", "Bob"), ("Ann", "works_at", "Bob")]
    # A second import adds nothing.
    assert d.post(f"{base(agent)}/import", json=document).json() == {
        "memories_imported": 0, "entities_imported": 0, "relations_imported": 0, "memories_reembedded": 0,
        "errors": []}
    assert len(d.get(f"{base(agent)}/export").json()["entities"]) == 2


def _system_prompts(fake, since: int) -> list[str]:
    out = []
    for req in fake.requests[since:]:
        body = req.get("json") or {}
        out.append("\n".join(m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "system"))
    return out


def _wait_for(d: Daemon, agent: str, count: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        page = d.get(f"{base(agent)}/memories").json()
        if page["total"] >= count:
            return page["memories"]
        time.sleep(0.1)
    raise AssertionError(f"agent {agent} has fewer than {count} memories")


def test_fact_from_a_cleared_session_reaches_the_model(d: Daemon, fake_llm) -> None:
    agent, other = spawn(d), spawn(d)
    r = d.post(f"/api/agents/{agent}/message", json={"message": "Please note that my favourite drink is green tea"})
    assert r.status_code == 200, r.text
    stored = _wait_for(d, agent, 1)
    assert stored[0]["scope"] == "episodic" and stored[0]["source"] == "conversation"
    assert stored[0]["content"] == ("User asked: Please note that my favourite drink is green tea\n"
                                    "I responded: echo: Please note that my favourite drink is green tea")
    assert d.post(f"/api/agents/{agent}/session/reset").status_code == 200
    assert d.get(f"/api/agents/{agent}/session").json()["messages"] == []

    mark = len(fake_llm.requests)
    assert d.post(f"/api/agents/{agent}/message", json={"message": "What beverage do I like?"}).status_code == 200
    system = _system_prompts(fake_llm, mark)[0]
    assert "## Relevant memories" in system and "favourite drink is green tea" in system

    # Another agent asking the same never sees it.
    mark = len(fake_llm.requests)
    assert d.post(f"/api/agents/{other}/message", json={"message": "What beverage do I like?"}).status_code == 200
    assert "green tea" not in _system_prompts(fake_llm, mark)[0]

    # Exchanges still in the session are not repeated into the prompt.
    mark = len(fake_llm.requests)
    assert d.post(f"/api/agents/{other}/message", json={"message": "What beverage do I like?"}).status_code == 200
    assert "Relevant memories" not in _system_prompts(fake_llm, mark)[0]


def test_memory_tools_in_the_loop(d: Daemon) -> None:
    agent = spawn(d, 'profile = "full"')
    say = lambda text: d.post(f"/api/agents/{agent}/message", json={"message": text}).json()["response"]  # noqa: E731
    out = say('[[tool:memory_remember {"content": "The staging server is in Frankfurt", "scope": "semantic"}]]')
    assert out.startswith("tool said: remembered as memory ")
    fid = out.rsplit(" ", 1)[1]
    got = d.get(f"{base(agent)}/memories/{fid}").json()
    assert got["source"] == "inference" and got["content"] == "The staging server is in Frankfurt"
    out = say('[[tool:memory_search {"query": "Where is the test environment hosted?", "scope": "semantic"}]]')
    assert "Frankfurt" in out and fid in out
    say('[[tool:knowledge_add_entity {"name": "Dana", "entity_type": "person"}]]')
    say('[[tool:knowledge_add_entity {"name": "Globex", "entity_type": "organization"}]]')
    out = say('[[tool:knowledge_add_relation {"source": "Dana", "relation": "works_at", "target": "Globex"}]]')
    assert out.startswith("tool said: relation Dana works_at Globex has id ")
    out = say('[[tool:knowledge_query {"source": "Dana", "max_depth": 2}]]')
    assert '"target": "Globex"' in out
    out = say('[[tool:knowledge_add_relation {"source": "Dana", "relation": "knows", "target": "Nobody"}]]')
    assert "entity not found: Nobody" in out
    assert triples(d, agent, source="Dana") == [("Dana", "works_at", "Globex")]


def test_killing_an_agent_deletes_its_memory(d: Daemon) -> None:
    agent, keeper = spawn(d), spawn(d)
    remember(d, agent, "A fact to be forgotten")
    remember(d, keeper, "A fact to be kept")
    entity(d, agent, "concept", "Ephemera")
    assert d.delete(f"/api/agents/{agent}").status_code == 200
    for table in ("memory_fragments", "memory_metadata", "kg_entities", "kg_relations"):
        assert db_rows(d.home, f"SELECT COUNT(*) FROM {table} WHERE agent_id = ?", (agent,))[0][0] == 0
    assert db_rows(d.home, "SELECT COUNT(*) FROM memory_fragments WHERE agent_id = ?", (keeper,))[0][0] == 1
    assert d.get(f"{base(agent)}/memories").status_code == 404


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.slow
def test_model_loads_only_when_memory_is_first_used(daemon_factory, fake_llm) -> None:
    d = daemon_factory(llm_config(fake_llm, "\n[memory]\nauto_remember = false\n"), env_extra=LLM_ENV)
    pid = d.daemon_file()["pid"]
    agent = spawn(d)
    assert d.post(f"/api/agents/{agent}/message", json={"message": "hello"}).status_code == 200
    assert "onnxruntime" not in _maps(pid)  # no memories yet: nothing loaded for recall
    assert "onnxruntime" not in _maps(pid)
    remember(d, agent, "Loaded now")
    assert "onnxruntime" in _maps(pid)
    assert d.get(f"{base(agent)}/memories").json()["total"] == 1  # auto_remember off: only the explicit one


def test_memory_config_is_validated() -> None:
    from agentd.config import parse_config
    from agentd.errors import ConfigError

    cfg = parse_config({"memory": {"recall_limit": 3, "min_score": 0.5, "auto_remember": False}}, Path("/tmp"))
    assert (cfg.memory.recall_limit, cfg.memory.min_score, cfg.memory.auto_remember) == (3, 0.5, False)
    assert cfg.memory.decay_days == 30 and cfg.memory.consolidate_every_hours == 24
    assert cfg.memory.embed_threads == 0
    assert parse_config({"memory": {"embed_threads": 64}}, Path("/tmp")).memory.embed_threads == 64
    for bad, what in [({"embed_threads": -1}, "embed_threads"), ({"embed_threads": 65}, "embed_threads"),
                      ({"embed_threads": 1.5}, "embed_threads"), ({"recall_limit": -1}, "recall_limit"), ({"min_score": 2}, "min_score"),
                      ({"auto_remember": "yes"}, "auto_remember"), ({"embedding_provider": "openai"}, "embedding_model"),
                      ({"decay_days": -3}, "decay_days")]:
        with pytest.raises(ConfigError, match=what):
            parse_config({"memory": bad}, Path("/tmp"))


def test_contradiction_check() -> None:
    from agentd.memory.semantic import contradicts

    assert contradicts("Bob is vegetarian", "Bob is not vegetarian")
    assert contradicts("Bob is vegetarian", "Bob isn't vegetarian")
    assert contradicts("Alice lives in Paris", "Alice no longer lives in Paris")
    assert contradicts("Meet at 3pm", "Meet at 4pm")
    assert contradicts("I have two cats", "I have three cats")
    assert not contradicts("The user's dog is called Rex", "The user has a dog named Rex")
    assert not contradicts("Bob is not vegetarian", "Bob isn't a vegetarian")


class _Embeddings:
    """A stand-in for a provider's OpenAI-format `POST /v1/embeddings` (documented request and
    answer shapes). Vectors are hashed bags of words, so texts sharing words are close."""

    def __init__(self, fail_first: int = 0, status: int = 500) -> None:
        import http.server
        import threading

        self.seen: list[dict[str, Any]] = []
        self.fail_left = fail_first
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "json": body})
                if outer.fail_left > 0:
                    outer.fail_left -= 1
                    self._send(status, {"error": {"message": "try again", "type": "server_error"}})
                    return
                inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                data = [{"object": "embedding", "index": i, "embedding": _bag(t)} for i, t in enumerate(inputs)]
                self._send(200, {"object": "list", "data": data[::-1], "model": body["model"],
                                 "usage": {"prompt_tokens": 1, "total_tokens": 1}})

            def _send(self, code: int, payload: dict[str, Any]) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _bag(text: str) -> list[float]:
    import hashlib

    vector = [0.0] * 64
    for word in re.findall(r"[a-z]+", text.lower()):
        vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1.0
    return vector


def test_provider_embeddings_over_http(daemon_factory, fake_llm) -> None:
    server = _Embeddings(fail_first=1)
    try:
        extra = (f'mistral = "{server.url}"\n\n[memory]\nembedding_provider = "mistral"\n'
                 'embedding_model = "mistral-embed"\n')
        d = daemon_factory(llm_config(fake_llm, extra), env_extra={**LLM_ENV, "MISTRAL_API_KEY": "sk-embed"})
        agent = spawn(d)
        kept = remember(d, agent, "penguins live in antarctica")["id"]
        remember(d, agent, "volcanoes erupt molten rock")
        assert len(server.seen) == 3  # one 500, retried, then the second fragment
        first = server.seen[0]
        assert first["path"] == "/v1/embeddings" and first["auth"] == "Bearer sk-embed"
        assert first["json"] == {"model": "mistral-embed", "input": ["penguins live in antarctica"]}
        assert recall(d, agent, "where do penguins live", limit=1)[0]["id"] == kept
        exported = d.get(f"{base(agent)}/export").json()
        assert exported["embedding_model"] == "mistral/mistral-embed"
        assert len(exported["memories"][0]["embedding"]) == 64
        # A provider that keeps refusing: a clear error, nothing stored.
        server.fail_left = 10
        r = d.post(f"{base(agent)}/memories", json={"content": "never stored"})
        assert r.status_code == 502 and "embeddings failed" in r.json()["error"]
        assert d.get(f"{base(agent)}/memories").json()["total"] == 2
    finally:
        server.close()


@pytest.mark.slow
def test_scheduled_consolidation_and_restart(daemon_factory, fake_llm) -> None:
    # 0.0005 h = 1.8 s between scheduled runs.
    d = daemon_factory(llm_config(fake_llm, "\n[memory]\nconsolidate_every_hours = 0.0005\n"), env_extra=LLM_ENV)
    agent = spawn(d)
    stale = fragment("The archive room key hangs by the door", confidence=0.5)
    assert d.post(f"{base(agent)}/import", json=doc([stale])).json()["memories_imported"] == 1
    kept = remember(d, agent, "The fire drill is on the first Monday of the month")["id"]
    deadline = time.time() + 20
    while time.time() < deadline:
        if d.get(f"{base(agent)}/memories/{stale['id']}").json()["confidence"] < 0.5:
            break
        time.sleep(0.2)
    assert d.get(f"{base(agent)}/memories/{stale['id']}").json()["confidence"] in (0.45, 0.405, 0.3645)
    assert d.get(f"{base(agent)}/memories/{kept}").json()["confidence"] == 1.0
    # After a restart the index is rebuilt from the store: recall by meaning still works.
    d.stop()
    d.start()
    found = recall(d, agent, "When do we practise evacuating the building?", limit=1)
    assert found[0]["id"] == kept
    assert remember(d, agent, "The fire drill happens on the first Monday of each month") == \
        {"id": kept, "merged": True}


def test_vector_index_keeps_rows_in_step() -> None:
    import numpy as np

    from agentd.memory.vectors import AgentIndex

    index = AgentIndex(4, capacity=2)
    basis = np.eye(4, dtype=np.float32)
    for i, (source, scope) in enumerate([("system", "a"), ("document", "b"), ("system", "b"), ("inference", "a")]):
        index.put(f"f{i}", basis[i], created=100.0 + i, confidence=0.25 * (i + 1), source=source, scope=scope)
    assert len(index) == 4 and index.vectors.shape[0] >= 4
    assert [h.id for h in index.search(basis[2], 1)] == ["f2"]
    index.remove("f0")  # the last row moves into slot 0
    assert index.pos == {"f3": 0, "f1": 1, "f2": 2} and index.ids == ["f3", "f1", "f2"]
    assert [h.id for h in index.search(basis[3], 1)] == ["f3"] and index.search(basis[3], 1)[0].score == 1.0
    assert [h.id for h in index.search(basis[0], 3)][0] != "f0"
    keep = index.mask(source="system")
    assert [index.ids[i] for i in np.flatnonzero(keep)] == ["f2"]
    keep = index.mask(scope="b", min_confidence=0.6)
    assert [index.ids[i] for i in np.flatnonzero(keep)] == ["f2"]
    keep = index.mask(after=101.5, before=103.5)
    assert sorted(index.ids[i] for i in np.flatnonzero(keep)) == ["f2", "f3"]
    assert index.mask(scope="nope").sum() == 0
    assert index.search(basis[1], 5, index.mask(only={"f1"}))[0].id == "f1"
    index.put("f1", basis[3], created=200.0, confidence=1.0, source="system", scope="a")  # replace in place
    assert len(index) == 3 and index.search(basis[1], 1)[0].score == 0.0


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


def test_the_same_text_again_marks_an_old_fragment_used_and_merges_new_metadata(mem) -> None:  # type: ignore[no-untyped-def]
    from pony import orm

    memory, emb, _ = mem
    emb.vectors["Rex is the dog"] = unit(1)
    fid = memory.remember("a", "Rex is the dog", metadata={"topic": "pets"})["id"]
    hour_ago = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(hours=1)
    with orm.db_session:
        memory.store.db.execute("UPDATE memory_fragments SET accessed_at = $t WHERE id = $f", {"t": hour_ago, "f": fid})
    # Stated again an hour later: used again (decay counts from then), nothing else to change.
    assert memory.remember("a", "Rex is the dog", metadata={"topic": "pets"}) == {"id": fid, "merged": True}
    accessed = datetime.fromisoformat(memory.get("a", fid)["accessed_at"])
    assert abs(accessed.timestamp() - time.time()) < 60, "BUG: the restated fragment still looks an hour old"
    # Again with metadata it lacks: merged in.
    assert memory.remember("a", "Rex is the dog", metadata={"name": "Rex"}) == {"id": fid, "merged": True}
    assert memory.get("a", fid)["metadata"] == {"topic": "pets", "name": "Rex"}
    assert meta(memory, "a", fid) == {"topic": '"pets"', "name": '"Rex"'}


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


def test_same_text_only_passes_over_closer_fragments_to_the_very_same_text(mem) -> None:  # type: ignore[no-untyped-def]
    """An exchange's vector is its question's: a closer fragment of another answer is passed
    over, the exchange stated word for word again further down is merged into."""
    import math

    memory, emb, _ = mem
    blue, indeed = "User asked: the sky?\nI responded: blue", "User asked: the sky?\nI responded: blue indeed"
    first = memory.remember_many("a", [{"content": blue}], [unit(1)], same_text_only=True)[0]
    other = memory.remember_many("a", [{"content": indeed}], [at(0.99)], same_text_only=True)[0]
    assert other["merged"] is False
    angle = math.radians(6)  # 0.9945 to the first, 0.9993 to the other
    again = memory.remember_many("a", [{"content": blue, "metadata": {"k": 1}}],
                                 [unit(math.cos(angle), math.sin(angle))], same_text_only=True)
    assert again == [{"id": first["id"], "merged": True}]
    assert {r[1]: json.loads(r[8]) for r in rows(memory, "a")} == {blue: {"k": 1}, indeed: {}}


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


@pytest.mark.parametrize("operation", ["forget_agent", "delete", "remember", "remember_many", "update",
                                       "remember_groups"])
def test_writes_wait_for_the_agents_lock(mem, operation: str) -> None:  # type: ignore[no-untyped-def]
    import threading

    memory, emb, _ = mem
    emb.vectors.update({"p": unit(1), "q": unit(0, 1)})
    fid = memory.remember("a", "p")["id"]
    calls = {"forget_agent": lambda: memory.forget_agent("a"), "delete": lambda: memory.delete("a", fid),
             "remember": lambda: memory.remember("a", "q"),
             "remember_many": lambda: memory.remember_many("a", [{"content": "q"}]),
             "update": lambda: memory.update("a", fid, "q"),
             "remember_groups": lambda: memory.remember_groups([("a", [{"content": "q"}], [unit(0, 1)])])}
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


def test_a_fragment_for_an_agent_that_is_gone_is_not_stored(tmp_path: Path) -> None:
    from pony import orm

    memory, emb, changed = new_memory(tmp_path)
    emb.vectors.update({"p": unit(1), "q": unit(0, 1)})
    memory.remember("a", "p")
    with orm.db_session:  # the agent's deletion, on this daemon or another
        memory.store.db.execute("DELETE FROM agents WHERE id = 'a'")
    for write in (lambda: memory.remember("a", "q"), lambda: memory.remember_many("a", [{"content": "q"}])):
        with pytest.raises(NotFound) as info:
            write()
        assert info.value.message == "agent not found"
    assert memory.remember_groups([("a", [{"content": "q"}], [unit(0, 1)]), ("b", [{"content": "q"}], [unit(0, 1)])]) \
        == [[], [{"id": sql(memory, "SELECT id FROM memory_fragments WHERE agent_id = 'b'")[0][0], "merged": False}]]
    assert sql(memory, "SELECT content FROM memory_fragments WHERE agent_id = 'a'") == [("p",)]
    assert changed == ["a", "b"]


def test_without_a_change_listener(tmp_path: Path) -> None:
    from agentd.memory.semantic import SemanticMemory
    from agentd.store import open_store

    emb = ScriptedEmbedder()
    emb.vectors["p"] = unit(1)
    memory = SemanticMemory(add_agents(open_store(tmp_path / "n.db")), lambda: emb)
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


def test_update_rewrites_a_fragment_in_place(tmp_path: Path) -> None:
    memory, emb, changed = new_memory(tmp_path)
    emb.vectors.update({"tea": unit(1), "volcano": unit(0, 1), "coffee": unit(0, 0, 1)})
    tea = memory.remember("a", "tea", scope="prefs", confidence=0.5)["id"]
    memory.remember("a", "volcano")
    changed.clear()
    memory.update("a", tea, "coffee", confidence=0.9)
    fragment = memory.get("a", tea)
    assert (fragment["content"], fragment["scope"], fragment["confidence"]) == ("coffee", "prefs", 0.9)
    assert changed == ["a"]
    # The index holds the new vector under the same id: a search by the new meaning finds it.
    assert memory.index("a").search(unit(0, 0, 1), 1)[0].id == tea
    assert sql(memory, "SELECT content, scope FROM memory_fragments WHERE id = ?", tea) == [("coffee", "prefs")]
    memory.update("a", tea, "coffee", scope="drinks")
    assert memory.get("a", tea)["scope"] == "drinks" and memory.count("a") == 2
    # Recall's filters read the index: it holds the new scope and confidence, the row's time and source.
    assert index_row(memory, "a", tea) == (stored_epoch(memory, tea), 0.9, "user_provided", "drinks")
    assert memory.index("a").vectors[memory.index("a").pos[tea]].tolist() == unit(0, 0, 1).tolist()
    # The stored vector is read back by the next daemon to build the index.
    assert sql(memory, "SELECT embedding, model FROM memory_fragments WHERE id = ?", tea) == \
        [(unit(0, 0, 1).astype("<f4").tobytes(), "test/scripted")]
    with pytest.raises(NotFound, match="memory not found"):
        memory.update("a", str(uuid.uuid4()), "coffee")
    with pytest.raises(NotFound):
        memory.update("b", tea, "coffee")
