"""The knowledge graph: typed entities, typed relations, pattern queries with `max_depth`.

An entity or relation end may be named by id or (case-insensitively) by name. Depth queries
walk relations with a recursive CTE over (node, depth) pairs; `UNION` drops repeated pairs
and the depth bound ends the walk, so cycles terminate, and each relation is returned once.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from pony import orm

from agentd.errors import NotFound
from agentd.timestamps import iso, utcnow
from agentd.store import Store

MATCH_LIMIT = 1000

# One agent's graph writes run one at a time: each first locks the agent's row (SQLite: the
# write lock from the start; PostgreSQL: SELECT ... FOR UPDATE), so the same entity or
# relation added by two clients at once is created once and then merged, never twice nor
# failing Pony's optimistic check.
_write = orm.db_session(optimistic=False)

_WALK = """
WITH RECURSIVE reach(node, depth) AS (
    SELECT id, 0 FROM kg_entities
     WHERE agent_id = $a AND (id = $ref OR lower(name) = lower($ref))
    UNION
    SELECT r.{next}, reach.depth + 1 FROM kg_relations r JOIN reach ON r.{here} = reach.node
     WHERE r.agent_id = $a AND reach.depth < $d AND ($rel IS NULL OR r.relation = $rel)
)
SELECT node, MIN(depth) FROM reach GROUP BY node
"""


def stamp(value: Any) -> str:
    """ISO 8601 of a stored time (raw text when Pony could not parse it back)."""
    if not isinstance(value, datetime):
        value = datetime.fromisoformat(str(value))
    return iso(value)


def entity_view(row: Any) -> dict[str, Any]:
    return {"id": row.id, "entity_type": row.entity_type, "name": row.name,
            "properties": json.loads(row.properties or "{}"), "created_at": stamp(row.created_at),
            "updated_at": stamp(row.updated_at)}


def relation_view(row: Any) -> dict[str, Any]:
    return {"id": row.id, "source": row.source, "relation": row.relation, "target": row.target,
            "properties": json.loads(row.properties or "{}"), "confidence": row.confidence,
            "created_at": stamp(row.created_at)}


class KnowledgeGraph:
    """Entities and relations of each agent."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _find(self, agent_id: str, ref: str) -> Any:
        e = self.store.e.EntityRow
        row = e.get(agent_id=agent_id, id=ref)
        if row is None:
            rows = orm.select(x for x in e if x.agent_id == agent_id and x.name.lower() == ref.lower())[:2]
            row = rows[0] if len(rows) == 1 else None
        return row

    def named(self, agent_id: str, entity_type: str, name: str) -> Any:
        """Inside a db_session: the agent's entity of this type and name (any case), or None."""
        return orm.select(x for x in self.store.e.EntityRow if x.agent_id == agent_id
                          and x.entity_type == entity_type and x.name.lower() == name.lower()).first()

    def linking(self, agent_id: str, source_id: str, relation: str, target_id: str) -> Any:
        """Inside a db_session: the agent's relation of this triple, or None."""
        return orm.select(x for x in self.store.e.RelationRow if x.agent_id == agent_id and x.source == source_id
                          and x.relation == relation and x.target == target_id).first()

    def add_entity(self, agent_id: str, entity_type: str, name: str, properties: dict[str, Any],
                   entity_id: str | None = None) -> dict[str, Any]:
        """Create an entity; the same name and type again updates (merges) its properties."""
        now = utcnow()
        with _write:
            self.store.e.AgentRow.get_for_update(id=agent_id)
            e = self.store.e.EntityRow
            row = e.get(agent_id=agent_id, id=entity_id) if entity_id else None
            if row is None:
                row = self.named(agent_id, entity_type, name)
            if row is None:
                row = e(agent_id=agent_id, id=entity_id or str(uuid.uuid4()), entity_type=entity_type, name=name,
                        properties=json.dumps(properties), created_at=now, updated_at=now)
                return {"id": row.id, "created": True}
            merged = json.loads(row.properties or "{}")
            merged.update(properties)
            row.properties = json.dumps(merged)
            row.name = name
            row.updated_at = now
            return {"id": row.id, "created": False}

    def add_relation(self, agent_id: str, source: str, relation: str, target: str,
                     properties: dict[str, Any], confidence: float) -> dict[str, Any]:
        """Link two existing entities (by id or name); the same triple again is updated."""
        with _write:
            self.store.e.AgentRow.get_for_update(id=agent_id)
            src, dst = self._find(agent_id, source), self._find(agent_id, target)
            for ref, row in ((source, src), (target, dst)):
                if row is None:
                    raise NotFound(f"entity not found: {ref}")
            r = self.store.e.RelationRow
            row = self.linking(agent_id, src.id, relation, dst.id)
            if row is not None:
                merged = json.loads(row.properties or "{}")
                merged.update(properties)
                row.properties = json.dumps(merged)
                row.confidence = confidence
                return {"id": row.id, "created": False}
            row = r(agent_id=agent_id, id=str(uuid.uuid4()), source=src.id, relation=relation, target=dst.id,
                    properties=json.dumps(properties), confidence=confidence,
                    created_at=utcnow())
            return {"id": row.id, "created": True}

    def _walk(self, agent_id: str, ref: str, depth: int, relation: str | None, forward: bool) -> dict[str, int]:
        sql = _WALK.format(next="target" if forward else "source", here="source" if forward else "target")
        # Raw DB-API call: Pony's select() only takes statements that start with SELECT.
        rows = self.store.raw_rows(sql, {"a": agent_id, "ref": ref, "d": depth, "rel": relation})
        return {node: d for node, d in rows}

    def query(self, agent_id: str, source: str | None = None, relation: str | None = None,
              target: str | None = None, max_depth: int = 1) -> list[dict[str, Any]]:
        """Matches `{source: entity, relation, target: entity}` for a pattern.

        With `source`: relations reachable from it within `max_depth` hops (each hop must
        match `relation` when given); with `target` too, only those on a walk that reaches it
        within `max_depth`. With only `target`: the walk runs backwards. With neither: every
        relation matching `relation`.
        """
        with orm.db_session:
            r = self.store.e.RelationRow
            edges = orm.select(x for x in r if x.agent_id == agent_id)
            if relation is not None:
                edges = edges.filter(lambda x: x.relation == relation)
            ahead = self._walk(agent_id, source, max_depth, relation, True) if source is not None else None
            behind = self._walk(agent_id, target, max_depth, relation, False) if target is not None else None
            if ahead is not None and not ahead or behind is not None and not behind:
                return []
            ranked: list[tuple[int, Any]] = []
            for edge in edges.order_by(lambda x: x.key):
                hops_before = ahead.get(edge.source) if ahead is not None else 0
                hops_after = behind.get(edge.target) if behind is not None else 0
                if hops_before is None or hops_after is None:
                    continue
                if ahead is not None and behind is not None:
                    fits = hops_before + 1 + hops_after <= max_depth
                elif ahead is not None:
                    fits = hops_before + 1 <= max_depth
                elif behind is not None:
                    fits = hops_after + 1 <= max_depth
                else:
                    fits = True
                if fits:
                    ranked.append((hops_before if ahead is not None else hops_after, edge))
            ranked.sort(key=lambda pair: pair[0])
            ranked = ranked[:MATCH_LIMIT]
            ids = {e.source for _, e in ranked} | {e.target for _, e in ranked}
            entities = {x.id: x for x in orm.select(x for x in self.store.e.EntityRow
                                                     if x.agent_id == agent_id and x.id in ids)} if ids else {}
            return [{"source": entity_view(entities[e.source]), "relation": relation_view(e),
                     "target": entity_view(entities[e.target]), "depth": d + 1}
                    for d, e in ranked if e.source in entities and e.target in entities]

    def forget_agent(self, agent_id: str) -> None:
        with orm.db_session:
            self.store.db.execute("DELETE FROM kg_relations WHERE agent_id = $a", {"a": agent_id})
            self.store.db.execute("DELETE FROM kg_entities WHERE agent_id = $a", {"a": agent_id})

    def export(self, agent_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        with orm.db_session:
            ents = [entity_view(x) for x in orm.select(x for x in self.store.e.EntityRow
                                                        if x.agent_id == agent_id).order_by(lambda x: x.key)]
            rels = [relation_view(x) for x in orm.select(x for x in self.store.e.RelationRow
                                                          if x.agent_id == agent_id).order_by(lambda x: x.key)]
        return ents, rels
