"""Export and import of one agent's memory as a single JSON document.

The document keeps ids, every fragment field and the vectors (with the embedding model's
name), plus entities and relations. Import checks the whole document before it writes
anything, writes in one transaction, skips ids the agent already has (so importing twice
adds nothing) and re-embeds vectors that came from another model.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

import numpy as np
from pony import orm

from agentd.errors import BadRequest
from agentd.timestamps import iso, utcnow
from agentd.memory import fields, fragment_rows
from agentd.memory.graph import KnowledgeGraph
from agentd.memory.recall import visible_to
from agentd.memory.semantic import SemanticMemory, epoch, fragment

FORMAT = "agentd.memory"
VERSION = 1


def export(semantic: SemanticMemory, graph: KnowledgeGraph, agent_id: str, owner: str | None = None) -> dict[str, Any]:
    """Everything the agent remembers, vectors included; with `owner`, without other
    people's exchanges (`visible_to`)."""
    with orm.db_session:
        row = semantic.store.e.MemoryRow
        # Long text is read with the rows, not one row at a time later: a fragment deleted
        # meanwhile would leave nothing to read (a 500 instead of an export without it).
        rows = (visible_to(orm.select(m for m in row if m.agent_id == agent_id), owner).order_by(lambda m: m.key)
                .prefetch(row.content, row.metadata))
        memories = []
        for row in rows:
            item = fragment(row, embedding=True)
            item["superseded_by"] = row.superseded_by
            memories.append(item)
    entities, relations = graph.export(agent_id)
    models = {m.pop("embedding_model") for m in memories}
    return {"format": FORMAT, "version": VERSION, "agent_id": agent_id, "exported_at": iso(utcnow()),
            "embedding_model": models.pop() if len(models) == 1 else semantic.embedder.name,
            "memories": memories, "entities": entities, "relations": relations}


def _time(value: Any, where: str) -> datetime:
    return fields.parse_time(value, where)


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise BadRequest(f"{key} must be an array")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise BadRequest(f"{key}[{i}] must be an object")
    return value


def _memory(item: dict[str, Any], i: int) -> dict[str, Any]:
    where = f"memories[{i}]"
    embedding = item.get("embedding")
    if embedding is None:  # absent or null: re-embedded
        embedding = []
    if not isinstance(embedding, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  and math.isfinite(v) for v in embedding):
        raise BadRequest(f"{where}.embedding must be an array of finite numbers")
    superseded = item.get("superseded_by")
    if superseded is not None and not isinstance(superseded, str):
        raise BadRequest(f"{where}.superseded_by must be a string or null")
    return {"id": fields.text(item.get("id"), f"{where}.id", fields.MAX_NAME),
            "content": fields.text(item.get("content"), f"{where}.content"),
            "source": _named(fields.source, item.get("source"), where),
            "scope": fields.text(item.get("scope"), f"{where}.scope", fields.MAX_NAME),
            "confidence": fields.confidence(item.get("confidence"), f"{where}.confidence"),
            # An imported fragment is agent-wide: whose session it once came from is dropped.
            "metadata": {k: v for k, v in fields.obj(item.get("metadata", {}), f"{where}.metadata").items()
                         if k != "owner"},
            "created_at": _time(item.get("created_at"), f"{where}.created_at"),
            "accessed_at": _time(item.get("accessed_at", item.get("created_at")), f"{where}.accessed_at"),
            "access_count": fields.integer(item.get("access_count", 0), f"{where}.access_count", 0, 2**31),
            "embedding": embedding, "superseded_by": superseded}


def _named(check: Any, value: Any, where: str) -> Any:
    try:
        return check(value)
    except BadRequest as exc:
        raise BadRequest(f"{where}.{exc.message}") from None


def validate(doc: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Check the whole document; BadRequest naming the first fault."""
    if not isinstance(doc, dict):
        raise BadRequest("import document must be a JSON object")
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise BadRequest(f"import document must have format {FORMAT!r} and version {VERSION} "
                         "(the output of GET .../export)")
    if not isinstance(doc.get("embedding_model", ""), str):
        raise BadRequest("embedding_model must be a string")
    memories = [_memory(m, i) for i, m in enumerate(_list(doc, "memories"))]
    entities = []
    for i, e in enumerate(_list(doc, "entities")):
        where = f"entities[{i}]"
        entities.append({"id": fields.text(e.get("id"), f"{where}.id", fields.MAX_NAME),
                         "entity_type": fields.kind(e.get("entity_type"), f"{where}.entity_type"),
                         "name": fields.text(e.get("name"), f"{where}.name", fields.MAX_NAME),
                         "properties": fields.obj(e.get("properties", {}), f"{where}.properties"),
                         "created_at": _time(e.get("created_at"), f"{where}.created_at"),
                         "updated_at": _time(e.get("updated_at", e.get("created_at")), f"{where}.updated_at")})
    relations = []
    for i, r in enumerate(_list(doc, "relations")):
        where = f"relations[{i}]"
        relations.append({"id": fields.text(r.get("id"), f"{where}.id", fields.MAX_NAME),
                          "source": fields.text(r.get("source"), f"{where}.source", fields.MAX_NAME),
                          "relation": fields.kind(r.get("relation"), f"{where}.relation"),
                          "target": fields.text(r.get("target"), f"{where}.target", fields.MAX_NAME),
                          "properties": fields.obj(r.get("properties", {}), f"{where}.properties"),
                          "confidence": fields.confidence(r.get("confidence", 1.0), f"{where}.confidence"),
                          "created_at": _time(r.get("created_at"), f"{where}.created_at")})
    for kind, items in (("memories", memories), ("entities", entities), ("relations", relations)):
        ids = [x["id"] for x in items]
        if len(ids) != len(set(ids)):
            raise BadRequest(f"{kind} contains the same id twice")
    return memories, entities, relations


def _merge(row: Any, properties: dict[str, Any]) -> bool:
    """The document's properties over those of the entity or relation the graph already
    holds; whether that changed them."""
    merged = json.dumps({**json.loads(row.properties or "{}"), **properties})
    if merged == row.properties:
        return False
    row.properties = merged
    return True


def import_doc(semantic: SemanticMemory, graph: KnowledgeGraph, agent_id: str, doc: Any) -> dict[str, Any]:
    """The spec's import report: counts of what was added, and `errors` (notes on what was not)."""
    memories, entities, relations = validate(doc)
    embedder = semantic.embedder
    errors: list[str] = []
    store = semantic.store
    with semantic.lock(agent_id):
        index = semantic.index(agent_id)
        with orm.db_session:
            known_entities = set(store.db.select("SELECT id FROM kg_entities WHERE agent_id = $a", {"a": agent_id}))
        doc_entities = {e["id"] for e in entities}
        for r in relations:
            for end in ("source", "target"):
                if r[end] not in doc_entities and r[end] not in known_entities:
                    raise BadRequest(f"relation {r['id']}: {end} entity {r[end]} is neither in the document "
                                     "nor in this agent's graph")
        new_memories = [m for m in memories if m["id"] not in index.pos]
        same_model = doc.get("embedding_model") == embedder.name
        dims = embedder.dimensions
        redo = [m for m in new_memories
                if not same_model or not m["embedding"] or (dims is not None and len(m["embedding"]) != dims)]
        if redo:
            vectors = embedder.embed([m["content"] for m in redo])
            for m, v in zip(redo, vectors):
                m["vector"] = v
        for m in new_memories:
            if "vector" not in m:
                vector = np.asarray(m["embedding"], dtype=np.float32)
                norm = float(np.linalg.norm(vector))
                # Our own vectors are already unit length: keep them bit for bit.
                m["vector"] = vector if abs(norm - 1.0) < 1e-4 else vector / max(norm, 1e-12)
        counts = {"entities_imported": 0, "relations_imported": 0, "memories_imported": len(new_memories)}
        # A fragment superseded by one neither imported nor kept (deleted since) is not superseded.
        fragment_ids = set(index.pos) | {m["id"] for m in memories}
        with semantic.owned(agent_id):
            for m in new_memories:
                fragment_rows.insert(store, agent_id, m["id"], m["content"], m["vector"], embedder.name,
                                     m["metadata"], m["source"], m["scope"], m["confidence"], m["created_at"],
                                     m["accessed_at"], m["access_count"])
                if m["superseded_by"] in fragment_ids:
                    store.e.MemoryRow.get(agent_id=agent_id, id=m["id"]).superseded_by = m["superseded_by"]
            # An entity of the name and type of one the graph holds is that one, as for POST
            # .../entities: its properties are merged in, and relations naming it land on it.
            same: dict[str, str] = {}
            for e in entities:
                if e["id"] in known_entities:
                    continue
                row = graph.named(agent_id, e["entity_type"], e["name"])
                if row is not None:
                    same[e["id"]] = row.id
                    if _merge(row, e["properties"]):
                        row.updated_at = utcnow()
                    continue
                store.e.EntityRow(agent_id=agent_id, id=e["id"], entity_type=e["entity_type"], name=e["name"],
                                  properties=json.dumps(e["properties"]),
                                  created_at=e["created_at"], updated_at=e["updated_at"])
                counts["entities_imported"] += 1
            for r in relations:
                if store.e.RelationRow.get(agent_id=agent_id, id=r["id"]) is not None:
                    continue
                source, target = same.get(r["source"], r["source"]), same.get(r["target"], r["target"])
                row = graph.linking(agent_id, source, r["relation"], target)
                if row is not None:
                    _merge(row, r["properties"])
                    continue
                store.e.RelationRow(agent_id=agent_id, id=r["id"], source=source, relation=r["relation"],
                                    target=target, properties=json.dumps(r["properties"]),
                                    confidence=r["confidence"], created_at=r["created_at"])
                counts["relations_imported"] += 1
        for m in new_memories:
            index.put(m["id"], m["vector"], epoch(m["created_at"]), m["confidence"], m["source"], m["scope"])
    # Vectors from another model are not comparable with ours: say how many were redone.
    return {**counts, "memories_reembedded": len(redo), "errors": errors}
