"""A small LRU cache of query embeddings.

Embedding the query is most of a recall's cost (the model run is ~7 ms of CPU for a short
sentence; the search over 10,000 fragments ~1 ms). The same query text comes back often:
the agent loop recalls for the same user message before every model call of a run, a
client retries, a dashboard refreshes. Vectors are keyed by (model name, text), so a
change of embedder never serves a stale vector, and are read-only so no caller can alter
a cached row.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

# 256 x 384 float32 = 384 KiB at most.
QUERY_CACHE_SIZE = 256


class QueryCache:
    """Least-recently-used map of (model, text) -> L2-normalised float32 vector."""

    def __init__(self, size: int = QUERY_CACHE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], "np.ndarray"] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def get(self, model: str, text: str, embed: Callable[[list[str]], "np.ndarray"]) -> "np.ndarray":
        """The cached vector of `text`, or `embed([text])[0]` (computed outside the lock, so
        two threads asking for different queries embed in parallel)."""
        key = (model, text)
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return found
            self.misses += 1
        return self.put(model, text, embed([text])[0])

    def peek(self, model: str, text: str) -> "np.ndarray | None":
        """The cached vector of `text` (None: not cached), without embedding or counting."""
        with self._lock:
            return self._items.get((model, text))

    def put(self, model: str, text: str, vector: "np.ndarray") -> "np.ndarray":
        """Cache a vector made elsewhere (a read-only copy, which is returned)."""
        vector = vector.copy()
        vector.setflags(write=False)
        key = (model, text)
        with self._lock:
            self._items[key] = vector
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return vector

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
