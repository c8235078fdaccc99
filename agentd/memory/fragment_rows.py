"""The rows behind semantic memory's writes: a fragment inserted, merged into, or only marked
as stated again, in `memory_fragments` and its `memory_metadata` side table. Plain SQL where
nothing reads the row back, Pony objects where the session may already hold them. The
decisions (what is a near duplicate, what contradicts) and the per-agent index stay in
agentd/memory/semantic.py.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import numpy as np
from pony import orm

from agentd.memory.recall import canonical, epoch
from agentd.store import Store
from agentd.timestamps import utcnow

# A fragment stated again word for word has its accessed_at moved at most this often.
RESTATED_SECS = 600.0


def near(store: Store, agent_id: str, ids: list[str]) -> dict[str, tuple]:
    """(content, metadata, confidence, accessed_at) of some fragments in one plain query
    (not whole Pony objects with their vectors: remember only needs these of its near
    matches)."""
    params: dict[str, Any] = {"a": agent_id}
    params.update({f"i{n}": fid for n, fid in enumerate(ids)})
    names = ", ".join(f"$i{n}" for n in range(len(ids)))
    with orm.db_session:
        return {row[0]: row[1:] for row in store.raw_rows(
            "SELECT id, content, metadata, confidence, accessed_at FROM memory_fragments "
            f"WHERE agent_id = $a AND id IN ({names})", params)}


def restated(store: Store, agent_id: str, fid: str, row: tuple, metadata: dict[str, Any],
             confidence: float) -> bool:
    """The very same text again, with metadata and confidence the fragment already has:
    the merge would change only `accessed_at`, so only that is written (one UPDATE, not a
    row loaded with its vector), and not at all within RESTATED_SECS of the last time:
    decay counts days. `row`: the fragment's (content, metadata, confidence, accessed_at).
    False when the merge has more to do."""
    _, held, conf, accessed = row
    held = json.loads(held or "{}")
    if conf < float(confidence) or any(key not in held or held[key] != value for key, value in metadata.items()):
        return False
    now = utcnow()
    if now.timestamp() - epoch(accessed) >= RESTATED_SECS:
        with orm.db_session:
            # Naive UTC, as the store writes every time.
            store.db.execute("UPDATE memory_fragments SET accessed_at = $now WHERE agent_id = $a AND id = $f",
                             {"now": now.replace(tzinfo=None), "a": agent_id, "f": fid})
    return True


def insert(store: Store, agent_id: str, fid: str, content: str, vector: np.ndarray | None, model: str,
           metadata: dict[str, Any], source: str, scope: str, confidence: float, created: datetime,
           accessed: datetime, access_count: int) -> None:
    """Inside a db_session: one fragment row and its metadata rows, in plain SQL (building
    Pony objects for rows nothing reads back costs more than the statements)."""
    if not all(isinstance(key, str) for key in metadata):
        raise TypeError("metadata keys must be strings")
    db = store.db
    db.execute("INSERT INTO memory_fragments (agent_id, id, content, embedding, model, metadata, source, scope, "
               "confidence, created_at, accessed_at, access_count) VALUES ($a, $f, $content, $embedding, "
               "$model, $metadata, $source, $scope, $confidence, $created, $accessed, $count)",
               {"a": agent_id, "f": fid, "content": content,
                "embedding": None if vector is None else vector.astype("<f4").tobytes(), "model": model,
                "metadata": json.dumps(metadata), "source": source, "scope": scope,
                "confidence": float(confidence), "created": created, "accessed": accessed,
                "count": access_count})
    if metadata:
        # On the connection whose transaction the statement above began: Pony's bookkeeping
        # per statement costs more than the insert itself.
        store.raw_many("INSERT INTO memory_metadata (agent_id, memory_id, key, value) VALUES ($a, $f, $k, $v)",
                       [{"a": agent_id, "f": fid, "k": key, "v": canonical(value)}
                        for key, value in metadata.items()])


def supersede(store: Store, agent_id: str, older: list[str], by: str) -> None:
    """Inside a db_session: mark the `older` fragments (in id order) as superseded by `by`."""
    for fid in older:
        row = store.e.MemoryRow.get(agent_id=agent_id, id=fid)
        if row is not None:
            row.superseded_by = by


def merge(store: Store, agent_id: str, fid: str, content: str, vector: np.ndarray, model: str,
          metadata: dict[str, Any], confidence: float, access_count: int = 0) -> tuple[datetime, float, str, str]:
    """Newer wording replaces the row's content and vector; metadata merged; confidence is
    the max. The row's (created_at, confidence, source, scope) afterwards, for the index."""
    with orm.db_session:
        row = store.e.MemoryRow.get(agent_id=agent_id, id=fid)
        merged = json.loads(row.metadata or "{}")
        merged.update(metadata)
        row.content = content
        row.embedding = vector.astype("<f4").tobytes()
        row.model = model
        row.metadata = json.dumps(merged)
        row.confidence = max(row.confidence, float(confidence))
        row.access_count += access_count
        row.accessed_at = utcnow()
        write_meta(store, agent_id, fid, merged)
        return row.created_at, row.confidence, row.source, row.scope


def write_meta(store: Store, agent_id: str, fid: str, metadata: dict[str, Any]) -> None:
    """Make the side table hold exactly `metadata` for the fragment. Through Pony objects,
    not a raw DELETE: a batch (remember_many) may merge into a row it created in the same
    session, whose metadata rows Pony still holds."""
    meta = store.e.MemoryMetaRow
    existing = {m.key: m for m in orm.select(m for m in meta if m.agent_id == agent_id and m.memory_id == fid)}
    for key, row in existing.items():
        if key not in metadata:
            row.delete()
    for key, value in metadata.items():
        if key in existing:
            existing[key].value = canonical(value)
        else:
            meta(agent_id=agent_id, memory_id=fid, key=key, value=canonical(value))
