"""The per-agent in-memory vector index: one float32 matrix plus the columns recall filters on.

Kept in step with every write (add, replace, remove) and rebuilt from the store the first
time an agent's memory is used after a start. Exact search: one matrix-vector product over
the rows a filter leaves, then a partial sort for the top k.
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from agentd.memory.fields import SOURCES

_SOURCE_CODE = {name: code for code, name in enumerate(SOURCES)}
# One counter for every index, so a version never repeats even across a rebuilt index.
_VERSIONS = itertools.count(1)
# From this many rows the product is split across two cores: it is memory-bound, and a
# second core's bandwidth nearly halves it. Below, the hand-off
# costs more than it saves.
PARALLEL_ROWS = 32768
_helper: ThreadPoolExecutor | None = None
_helper_lock = threading.Lock()


def _second_core() -> ThreadPoolExecutor | None:
    """One worker thread for the other half of big products (None on a single core)."""
    global _helper
    if _helper is None and (os.cpu_count() or 1) > 1:
        with _helper_lock:
            if _helper is None:
                _helper = ThreadPoolExecutor(1, thread_name_prefix="memory-scan")
    return _helper


def scores_of(matrix: np.ndarray, query: np.ndarray) -> np.ndarray:
    """`matrix @ query`, the lower half on a helper thread when the matrix is big (numpy
    releases the GIL inside the product; BLAS itself is kept single-threaded)."""
    helper = _second_core() if matrix.shape[0] >= PARALLEL_ROWS else None
    if helper is None:
        return matrix @ query
    out = np.empty(matrix.shape[0], dtype=np.result_type(matrix, query))
    half = matrix.shape[0] // 2
    lower = helper.submit(np.matmul, matrix[half:], query, out=out[half:])
    np.matmul(matrix[:half], query, out=out[:half])
    lower.result()
    return out


@dataclass
class Hit:
    """One search result: fragment id, cosine score and creation time (epoch seconds)."""

    id: str
    score: float
    created: float


#: Rows a full index grows by at the least (an eighth of its size past 64 rows).
GROW_ROWS = 8


class AgentIndex:
    """Vectors and filter columns of one agent's fragments; callers hold `lock`-free access
    through the owning SemanticMemory, which serialises writes per agent."""

    # Small to begin with: the index cache's bound counts fragments, and most agents hold few, so
    # a larger first allocation would make a one-fragment index cost many fragments' memory.
    def __init__(self, dimensions: int, capacity: int = 4) -> None:
        self.dimensions = dimensions
        self.ids: list[str] = []
        self.pos: dict[str, int] = {}
        self.vectors = np.zeros((capacity, dimensions), dtype=np.float32)
        self.created = np.zeros(capacity, dtype=np.float64)
        self.confidence = np.zeros(capacity, dtype=np.float32)
        self.source = np.zeros(capacity, dtype=np.int8)
        self.scope = np.zeros(capacity, dtype=np.int32)
        self.scope_codes: dict[str, int] = {}
        # Changes with every write, so a caller can tell that a recall would find the same.
        self.version = next(_VERSIONS)

    def __len__(self) -> int:
        return len(self.ids)

    def _grow(self, needed: int) -> None:
        capacity = self.vectors.shape[0]
        if needed <= capacity:
            return
        # An eighth more, not twice: an index read back from the store is exactly full, and the
        # next remembered fragment would otherwise double it, so the cache's bound in fragments
        # would hold twice their memory.
        new = max(needed, capacity + max(GROW_ROWS, capacity // 8))
        for name in ("vectors", "created", "confidence", "source", "scope"):
            old = getattr(self, name)
            grown = np.zeros((new,) + old.shape[1:], dtype=old.dtype)
            grown[:capacity] = old
            setattr(self, name, grown)

    def scope_code(self, scope: str) -> int:
        code = self.scope_codes.get(scope)
        if code is None:
            code = self.scope_codes[scope] = len(self.scope_codes)
        return code

    def put(self, fid: str, vector: np.ndarray, created: float, confidence: float, source: str,
            scope: str) -> None:
        """Add a fragment, or replace the row of one already indexed."""
        self.version = next(_VERSIONS)
        row = self.pos.get(fid)
        if row is None:
            row = len(self.ids)
            self._grow(row + 1)
            self.ids.append(fid)
            self.pos[fid] = row
        self.vectors[row] = vector
        self.created[row] = created
        self.confidence[row] = confidence
        self.source[row] = _SOURCE_CODE.get(source, -1)
        self.scope[row] = self.scope_code(scope)

    def bulk(self, ids: list[str], vectors: np.ndarray, created: Iterable[float], confidence: Iterable[float],
             sources: Iterable[str], scopes: Iterable[str]) -> None:
        """Load many fragments at once (the rebuild from the store)."""
        self.version = next(_VERSIONS)
        start = len(self.ids)
        count = len(ids)
        self._grow(start + count)
        self.vectors[start:start + count] = vectors
        self.created[start:start + count] = np.fromiter(created, dtype=np.float64, count=count)
        self.confidence[start:start + count] = np.fromiter(confidence, dtype=np.float32, count=count)
        self.source[start:start + count] = [_SOURCE_CODE.get(s, -1) for s in sources]
        self.scope[start:start + count] = [self.scope_code(s) for s in scopes]
        for offset, fid in enumerate(ids):
            self.pos[fid] = start + offset
        self.ids.extend(ids)

    def set_confidence(self, fid: str, confidence: float) -> None:
        self.version = next(_VERSIONS)
        row = self.pos.get(fid)
        if row is not None:
            self.confidence[row] = confidence

    def remove(self, fid: str) -> None:
        """Drop a fragment by moving the last row into its slot."""
        self.version = next(_VERSIONS)
        row = self.pos.pop(fid, None)
        if row is None:
            return
        last = len(self.ids) - 1
        if row != last:
            moved = self.ids[last]
            self.ids[row] = moved
            self.pos[moved] = row
            for name in ("vectors", "created", "confidence", "source", "scope"):
                column = getattr(self, name)
                column[row] = column[last]
        self.ids.pop()

    def mask(self, source: str | None = None, scope: str | None = None, min_confidence: float | None = None,
             after: float | None = None, before: float | None = None,
             only: set[str] | None = None) -> np.ndarray | None:
        """Rows passing every given filter (None when nothing filters)."""
        n = len(self.ids)
        keep: np.ndarray | None = None

        def both(cond: np.ndarray) -> None:
            nonlocal keep
            keep = cond if keep is None else keep & cond

        if source is not None:
            both(self.source[:n] == _SOURCE_CODE.get(source, -2))
        if scope is not None:
            code = self.scope_codes.get(scope)
            both(self.scope[:n] == code if code is not None else np.zeros(n, dtype=bool))
        if min_confidence is not None:
            both(self.confidence[:n] >= np.float32(min_confidence))
        if after is not None:
            both(self.created[:n] > after)
        if before is not None:
            both(self.created[:n] < before)
        if only is not None:
            rows = np.zeros(n, dtype=bool)
            positions = [self.pos[f] for f in only if f in self.pos]
            rows[positions] = True
            both(rows)
        return keep

    def search(self, query: np.ndarray, k: int, keep: np.ndarray | None = None,
               min_score: float | None = None) -> list[Hit]:
        """The k best rows by cosine (vectors are normalised, so a dot product), without those
        scoring under `min_score`."""
        # Searches take no lock while a writer may remove rows: the ids are read once, so a
        # row dropped meanwhile is at worst a hit whose fragment the caller no longer finds.
        ids = self.ids[:]
        n = len(ids)
        if n == 0 or k <= 0:
            return []
        if keep is None:
            rows = None
            scores = scores_of(self.vectors[:n], query)
        else:
            rows = np.flatnonzero(keep[:n])  # the mask may predate a removal
            if rows.size == 0:
                return []
            if rows.size * 4 >= n:
                # Most rows pass: scoring all of them beats copying them out first.
                scores = scores_of(self.vectors[:n], query)[rows]
            else:
                scores = self.vectors[rows] @ query
        m = scores.shape[0]
        k = min(k, m)
        # Partition, then sort only the k winners (not all m scores); no negated copy.
        top = np.argpartition(scores, m - k)[m - k:] if k < m else np.arange(m)
        top = top[np.argsort(-scores[top], kind="stable")]
        index = (top if rows is None else rows[top]).tolist()
        hits = []
        # Best first: the first score under `min_score` ends the list (no Hit is built for rows
        # the caller would drop).
        for i, score in zip(index, scores[top].tolist()):
            if min_score is not None and score < min_score:
                break
            hits.append(Hit(ids[i], score, float(self.created[i])))
        return hits

    def similar(self, vector: np.ndarray, scope: str, exclude: str | None = None,
                min_score: float | None = None) -> list[Hit]:
        """Rows of `scope` by similarity to `vector`, best first (dedup and consolidation)."""
        hits = self.search(vector, 8, self.mask(scope=scope), min_score)
        return [h for h in hits if h.id != exclude]
