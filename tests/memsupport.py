"""A real store and a scripted embedder for in-process tests of semantic memory.

The scripted embedder implements the `Embedder` interface (agentd/memory/embedder.py) with
vectors the test chooses, so cosine scores sit exactly where a test needs them (at 0.92, just
under it, ...). The code under test is the real SemanticMemory on a real SQLite store.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np


def unit(*values: float, dims: int = 8) -> np.ndarray:
    """A float32 unit vector with `values` in its first coordinates."""
    v = np.zeros(dims, dtype=np.float32)
    v[:len(values)] = values
    return (v / np.linalg.norm(v)).astype(np.float32)


def at(cos: float, axis: int = 0, other: int = 1, dims: int = 8) -> np.ndarray:
    """A unit vector whose cosine with basis vector `axis` is `cos` (rest on `other`)."""
    v = np.zeros(dims, dtype=np.float32)
    v[axis] = cos
    v[other] = math.sqrt(max(0.0, 1 - cos * cos))
    return v


class ScriptedEmbedder:
    """Embedder whose vector for each text is set by the test (`vectors[text] = ...`)."""

    def __init__(self, name: str = "test/scripted", dims: int = 8) -> None:
        self.name = name
        self.dims = dims
        self.vectors: dict[str, np.ndarray] = {}
        self.calls: list[list[str]] = []

    @property
    def dimensions(self) -> int:
        return self.dims

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.stack([self.vectors[t] for t in texts]).astype(np.float32) if texts else \
            np.zeros((0, self.dims), dtype=np.float32)


def new_memory(tmp: Path, embedder: Any = None):  # type: ignore[no-untyped-def]
    """(SemanticMemory on a fresh store at tmp/m.db, its scripted embedder, changed-agent log)."""
    from agentd.memory.semantic import SemanticMemory
    from agentd.store import open_store

    embedder = embedder or ScriptedEmbedder()
    memory = SemanticMemory(open_store(tmp / "m.db"), lambda: embedder)
    changed: list[str] = []
    memory.changed = changed.append
    return memory, embedder, changed


def sql(memory: Any, query: str, *args: Any) -> list[tuple]:
    """Rows of the memory's database read through a separate read-only connection."""
    path = Path(memory.store.db.provider.pool.filename)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute(query, args).fetchall()
    finally:
        db.close()
