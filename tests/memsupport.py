"""A real store and a scripted embedder for in-process tests of semantic memory.

The scripted embedder implements the `Embedder` interface (agentd/memory/embedder.py) with
vectors the test chooses, so cosine scores sit exactly where a test needs them (at 0.92, just
under it, ...). The code under test is the real SemanticMemory on a real SQLite store.
"""

from __future__ import annotations

import math
import sqlite3
import uuid
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


# The agent ids the in-process tests name: fragments are stored only for an existing agent.
AGENTS = ("a", "a1", "a2", "a3", "b")


def add_agent(store: Any, agent_id: str | None = None) -> str:
    """Create an agent's row in `store` (a new id when none is given); its id."""
    from pony import orm

    from agentd.timestamps import utcnow

    agent_id = agent_id or str(uuid.uuid4())
    with orm.db_session:
        if store.e.AgentRow.get(id=agent_id) is None:
            store.e.AgentRow(id=agent_id, name=f"test-{agent_id}", manifest_toml="x", manifest={},
                             created_at=utcnow(), last_active=utcnow(), session_id=str(uuid.uuid4()))
    return agent_id


def add_agents(store: Any, agent_ids: Any = AGENTS) -> Any:
    """`store` holding the rows of `agent_ids` (by default the ids the tests name)."""
    for agent_id in agent_ids:
        add_agent(store, agent_id)
    return store


def new_memory(tmp: Path, embedder: Any = None):  # type: ignore[no-untyped-def]
    """(SemanticMemory on a fresh store at tmp/m.db holding the agents of AGENTS, its
    scripted embedder, changed-agent log)."""
    from agentd.memory.semantic import SemanticMemory
    from agentd.store import open_store

    embedder = embedder or ScriptedEmbedder()
    memory = SemanticMemory(add_agents(open_store(tmp / "m.db")), lambda: embedder)
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
