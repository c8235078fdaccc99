"""Semantic memory's read path: recall (filters, then exact cosine top-k), listing, get,
and the API shape of a fragment.

`Recall` is a mixin of `agentd.memory.semantic.SemanticMemory`, which owns the write path
and the per-agent index; the reads use its `store`, `embedder`, `queries`, `index(agent)`
and `count(agent)`.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from pony import orm

from agentd.errors import NotFound
from agentd.timestamps import iso, utcnow
from agentd.memory.access import access_updates
from agentd.memory.fields import MemoryFilter
from agentd.memory.vectors import Hit

if TYPE_CHECKING:
    from agentd.memory.embedder import Embedder
    from agentd.memory.querycache import QueryCache
    from agentd.memory.vectors import AgentIndex
    from agentd.store import Store

NEAR_TIE = 0.01


def epoch(value: Any) -> float:
    """Seconds since 1970 of a stored time (naive times are UTC). Raw text is accepted too:
    Pony hands back the text of a time stored without fractional seconds (see `stamp`)."""
    dt = _as_dt(value)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def stamp(value: Any) -> str:
    """ISO 8601 of a stored time. Pony hands back the raw text when a time was stored
    without fractional seconds (a whole-second import), so both forms are accepted."""
    return iso(_as_dt(value))


# The side table's form of a metadata value: compact JSON with sorted keys (one encoder for
# all calls: json.dumps with these options builds a new one each time).
canonical: Callable[[Any], str] = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


# A fragment row `m` that is not another person's exchange, for the session label $own
# (canonical JSON) and its people ($people, that text without its closing quote, plus a
# colon; $people_len its length): the SQL form of agentd.memory.service.others_of with people.
_NOT_OTHERS = ("""NOT ("m"."source" = 'conversation' AND "m"."scope" = 'episodic' AND EXISTS ("""
               """SELECT 1 FROM memory_metadata mm WHERE mm.agent_id = "m"."agent_id" AND mm.memory_id = "m"."id" """
               """AND mm.key = 'owner' AND mm.value <> $own AND substr(mm.value, 1, $people_len) <> $people))""")


def visible_to(query: Any, owner: str | None) -> Any:
    """A Pony query over MemoryRow (its variable named `m`) without the exchanges of
    sessions other than `owner`'s and its people's; all of it for None (the admin)."""
    if owner is None:
        return query
    own = canonical(owner)
    people = canonical(owner + ":")[:-1]
    people_len = len(people)
    return query.filter(lambda m: orm.raw_sql(_NOT_OTHERS))


def fragment(row: Any, embedding: bool = False) -> dict[str, Any]:
    """The API shape of a fragment row (without its vector unless asked)."""
    out = {"id": row.id, "agent_id": row.agent_id, "content": row.content,
           "metadata": json.loads(row.metadata or "{}"), "source": row.source, "scope": row.scope,
           "confidence": row.confidence, "created_at": stamp(row.created_at),
           "accessed_at": stamp(row.accessed_at), "access_count": row.access_count}
    if embedding:
        out["embedding"] = (np.frombuffer(row.embedding, dtype="<f4").tolist() if row.embedding else [])
        out["embedding_model"] = row.model
    return out


class Recall:
    """recall / get / page of one agent's fragments (mixed into SemanticMemory)."""

    # Provided by SemanticMemory (agentd/memory/semantic.py).
    store: Store
    queries: QueryCache
    embedder: Embedder
    index: Callable[[str], AgentIndex]
    count: Callable[[str], int]

    def _rows(self, agent_id: str, ids: list[str]) -> dict[str, dict[str, Any]]:
        """Fragments by id in one plain query (recall's hot path: Pony's object loading and
        lazy LongStr reads cost more than the search itself)."""
        with orm.db_session:
            params = {"a": agent_id, **{f"i{n}": fid for n, fid in enumerate(ids)}}
            found = self.store.raw_rows(_ROW_SQL.format(", ".join(f"$i{n}" for n in range(len(ids)))), params)
        out = {}
        for (fid, owner, content, metadata, source, scope, confidence, created, accessed, count,
             superseded) in found:
            out[fid] = {"id": fid, "agent_id": owner, "content": content, "metadata": json.loads(metadata or "{}"),
                        "source": source, "scope": scope, "confidence": confidence,
                        "created_at": stamp(created), "accessed_at": stamp(accessed),
                        "access_count": count, "superseded_by": superseded}
        return out

    def _touch(self, agent_id: str, items: list[dict[str, Any]]) -> None:
        """Count the access of what recall returned (one UPDATE)."""
        now = utcnow()
        try:
            with orm.db_session:
                # Through Pony (not the raw connection) so the session knows to commit.
                for sql, params in access_updates(agent_id, {item["id"]: 1 for item in items}, now,
                                                  self.store.shared):
                    self.store.db.execute(sql, params)
        except orm.DatabaseError as exc:
            # Access counts are bookkeeping: should PostgreSQL still find a deadlock (a writer
            # not ordered like these), the recall answers all the same.
            logging.getLogger("agentd.memory").warning("access count of %d fragments of agent %s not updated: %s",
                                                       len(items), agent_id, str(exc).splitlines()[0])
            return
        for item in items:
            item["accessed_at"] = iso(now)
            item["access_count"] += 1

    def get(self, agent_id: str, fid: str) -> dict[str, Any]:
        with orm.db_session:
            row = self.store.e.MemoryRow.get(agent_id=agent_id, id=fid)
            if row is None:
                raise NotFound(f"memory not found: {fid}")
            return fragment(row)

    def page(self, agent_id: str, limit: int, offset: int, owner: str | None = None) -> dict[str, Any]:
        """Newest first; with `owner`, what `visible_to` leaves."""
        with orm.db_session:
            query = visible_to(orm.select(m for m in self.store.e.MemoryRow if m.agent_id == agent_id), owner)
            total = query.count()
            row_type = self.store.e.MemoryRow
            # Load the long text columns with the rows: read lazily afterwards, a fragment
            # deleted by another request in between (PostgreSQL reads committed data per
            # statement) would come back as a missing row inside Pony.
            rows = (query.order_by(lambda m: (orm.desc(m.created_at), orm.desc(m.key)))
                    .prefetch(row_type.content, row_type.metadata)[offset:offset + limit])
            return {"memories": [fragment(r) for r in rows], "total": total}

    def _metadata_ids(self, agent_id: str, metadata: dict[str, Any]) -> set[str]:
        """Fragments matching every metadata pair: index lookups on the side table."""
        found: set[str] | None = None
        with orm.db_session:
            for key, value in metadata.items():
                ids = set(self.store.db.select(
                    "SELECT memory_id FROM memory_metadata WHERE agent_id = $a AND key = $k AND value = $v",
                    {"a": agent_id, "k": key, "v": canonical(value)}))
                found = ids if found is None else found & ids
                if not found:
                    return set()
        return found or set()

    def recall(self, agent_id: str, query: str, limit: int = 5, min_score: float | None = None,
               flt: MemoryFilter | None = None, touch: bool = True,
               skip: Callable[[str], bool] | None = None, skip_ids: frozenset[str] = frozenset(),
               hide: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
        """Filter, then exact cosine top-k; newer wins near-ties and superseded facts.

        `skip(content)` drops fragments the caller already has (the loop skips exchanges
        still in the session; `skip_ids` those it knows by id, before their rows are read),
        `hide(fragment)` those the caller may not see (other people's exchanges). Returned
        fragments get accessed_at/access_count updated.
        """
        if self.count(agent_id) == 0:
            return []
        embedder = self.embedder
        vector = self.queries.get(embedder.name, query, embedder.embed)
        index = self.index(agent_id)
        flt = flt or MemoryFilter()
        only = self._metadata_ids(agent_id, flt.metadata) if flt.metadata else None
        keep = index.mask(flt.source, flt.scope, flt.min_confidence, flt.after, flt.before, only)
        # Hidden fragments are dropped after the search: look further when some may be.
        hits = index.search(vector, limit * (8 if hide is not None else 2) + 8, keep, min_score)
        if skip_ids:
            hits = [h for h in hits if h.id not in skip_ids]
        if not hits:
            return []
        hits = _prefer_newer(hits)
        rows = self._rows(agent_id, [h.id for h in hits])
        out = []
        for hit in _supersede_order([h for h in hits if h.id in rows], rows):
            item = rows[hit.id]
            if skip is not None and skip(item["content"]):
                continue
            if hide is not None and hide(item):
                continue
            item["score"] = round(hit.score, 6)
            out.append(item)
            if len(out) >= limit:
                break
        if touch and out:
            self._touch(agent_id, out)
        return out


_ROW_SQL = ("SELECT id, agent_id, content, metadata, source, scope, confidence, created_at, accessed_at, "
            "access_count, superseded_by FROM memory_fragments WHERE agent_id = $a AND id IN ({})")


def _as_dt(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def _prefer_newer(hits: list[Hit]) -> list[Hit]:
    """Within NEAR_TIE of each other, the newer fragment goes first."""
    out = list(hits)
    changed = True
    while changed:
        changed = False
        for i in range(len(out) - 1):
            a, b = out[i], out[i + 1]
            if a.score - b.score <= NEAR_TIE and b.created > a.created:
                out[i], out[i + 1] = b, a
                changed = True
    return out


def _supersede_order(hits: list[Hit], rows: dict[str, dict[str, Any]]) -> list[Hit]:
    """A superseded fragment never ranks above the newer fact that contradicts it."""
    out = list(hits)
    for hit in list(out):
        newer = rows[hit.id].pop("superseded_by", None)
        if newer and newer in rows:
            old_pos = next(i for i, h in enumerate(out) if h.id == hit.id)
            new_pos = next(i for i, h in enumerate(out) if h.id == newer)
            if old_pos < new_pos:
                moved = out.pop(old_pos)
                out.insert(new_pos, moved)
    return out
