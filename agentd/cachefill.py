"""How full the daemon's bounded caches are, for GET /api/health/detail.

RSS grows with these caches until they reach their bounds, so a long-run measurement
(scripts/bench_rss.py) counts growth only from the moment every one is full.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from agentd.agents.session_cache import SessionCache
    from agentd.memory.service import MemoryService


def cache_fill(sessions: "SessionCache", memory: "MemoryService") -> dict[str, dict[str, int]]:
    """Each bounded cache's `held` and `bound`: conversations (`[agents] cached_sessions`),
    semantic index fragments (`[memory] index_cache_fragments`) and query embeddings."""
    fill: dict[str, dict[str, int]] = {"sessions": {"held": len(sessions), "bound": sessions.limit}}
    if not memory.loaded:  # numpy and the model stay unloaded until memory is used
        from agentd.memory.querycache import QUERY_CACHE_SIZE

        fill["index_fragments"] = {"held": 0, "bound": memory.config.index_cache_fragments}
        fill["query_embeddings"] = {"held": 0, "bound": QUERY_CACHE_SIZE}
        return fill
    semantic = memory.semantic
    fill["index_fragments"] = {"held": semantic.cached_fragments(), "bound": semantic.max_fragments}
    fill["query_embeddings"] = {"held": len(semantic.queries), "bound": semantic.queries.size}
    return fill
