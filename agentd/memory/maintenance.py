"""Consolidation: merge leftover near-duplicates, decay what nobody recalls, drop the faded.

Runs on demand (`POST .../consolidate`) and on a schedule (`[memory] consolidate_every_hours`).
Merging compares only fragments created since the agent's previous run against all others
(dedup on write already handles the common case), so a scheduled run stays cheap.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import numpy as np
from pony import orm

from agentd.config import MemoryConfig
from agentd.timestamps import utcnow
from agentd.memory.semantic import DEDUP_THRESHOLD, SemanticMemory, contradicts

_LAST_RUN = "memory.consolidated_at.{}"


def consolidate(semantic: SemanticMemory, agent_id: str, config: MemoryConfig) -> dict[str, Any]:
    """The spec's report: `memories_merged`, `memories_decayed`, `duration_ms` (+ `memories_dropped`)."""
    started = time.perf_counter()
    store = semantic.store
    since = store.get_setting(_LAST_RUN.format(agent_id), 0.0)
    with semantic.lock(agent_id):
        run_at = time.time()
        index = semantic.index(agent_id)
        merged = _merge_duplicates(semantic, agent_id, index, since)
        decayed, dropped = _decay(semantic, agent_id, index, config)
    store.set_setting(_LAST_RUN.format(agent_id), run_at)
    return {"memories_merged": merged, "memories_decayed": decayed, "memories_dropped": dropped,
            "duration_ms": int((time.perf_counter() - started) * 1000)}


def _merge_duplicates(semantic: SemanticMemory, agent_id: str, index: Any, since: float) -> int:
    """Fold each newer near-duplicate into the oldest fragment it repeats."""
    n = len(index)
    fresh = np.flatnonzero(index.created[:n] >= since)
    # Ids, not rows: folding a duplicate moves rows around. A folded fragment leaves the
    # index, so it is neither visited nor found again.
    fresh_ids = [index.ids[i] for i in sorted(fresh, key=lambda i: index.created[i])]
    merged = 0
    for fid in fresh_ids:
        if fid not in index.pos:
            continue
        row = index.pos[fid]
        scope_code = index.scope[row]
        scope = next(s for s, c in index.scope_codes.items() if c == scope_code)
        for hit in index.similar(index.vectors[row].copy(), scope, exclude=fid):
            if hit.score < DEDUP_THRESHOLD:
                break
            older, newer = (hit.id, fid) if hit.created <= index.created[row] else (fid, hit.id)
            if _fold(semantic, agent_id, index, older, newer):
                merged += 1
                break
    return merged


def _fold(semantic: SemanticMemory, agent_id: str, index: Any, older: str, newer: str) -> bool:
    with orm.db_session:
        e = semantic.store.e.MemoryRow
        keep, drop = e.get(agent_id=agent_id, id=older), e.get(agent_id=agent_id, id=newer)
        if keep is None or drop is None or contradicts(keep.content, drop.content):
            return False
        # `_merge` lays these over the kept fragment's own metadata (the newer value wins).
        metadata = json.loads(drop.metadata or "{}")
        content, embedding, confidence, count = drop.content, drop.embedding, drop.confidence, drop.access_count
        drop.delete()
        semantic.store.db.execute("DELETE FROM memory_metadata WHERE agent_id = $a AND memory_id = $f",
                                  {"a": agent_id, "f": newer})
    vector = np.frombuffer(embedding, dtype="<f4").copy()
    index.remove(newer)
    semantic._merge(agent_id, index, older, content, vector, metadata, confidence, access_count=count)
    return True


def _decay(semantic: SemanticMemory, agent_id: str, index: Any, config: MemoryConfig) -> tuple[int, int]:
    cutoff = utcnow() - timedelta(days=config.decay_days)
    decayed = dropped = 0
    with orm.db_session:
        rows = orm.select(m for m in semantic.store.e.MemoryRow
                          if m.agent_id == agent_id and m.accessed_at < cutoff)
        for row in rows:
            row.confidence = round(row.confidence * config.decay_factor, 6)
            decayed += 1
            if row.confidence < config.decay_floor:
                semantic.store.db.execute("DELETE FROM memory_metadata WHERE agent_id = $a AND memory_id = $f",
                                          {"a": agent_id, "f": row.id})
                index.remove(row.id)
                row.delete()
                dropped += 1
            else:
                index.set_confidence(row.id, row.confidence)
    return decayed, dropped


def agents_with_memories(semantic: SemanticMemory) -> list[str]:
    with orm.db_session:
        return list(semantic.store.db.select("SELECT DISTINCT agent_id FROM memory_fragments"))
