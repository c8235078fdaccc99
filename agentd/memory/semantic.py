"""Semantic memory's write path: remember fragments by meaning, dedup and merge on write,
delete; and the per-agent index every read and write goes through. The read path (recall,
filters, listing, the fragment shape) is agentd/memory/recall.py, mixed into SemanticMemory.

Rows live in the store (`memory_fragments`, vectors as float32 blobs; metadata also in the
indexed `memory_metadata` side table). Search runs over a per-agent `AgentIndex` kept in
step with every write. Writes to one agent are serialised by that agent's lock, so a
dedup decision and the insert it leads to cannot interleave with another write.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import uuid
from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from pony import orm

from agentd.errors import NotFound
from agentd.timestamps import utcnow
from agentd.memory import fragment_rows
from agentd.memory.embedder import Embedder
from agentd.memory.querycache import QueryCache
# The read path and the fragment shape; the helpers are re-exported (maintenance.py,
# portable.py and the tests import them from here).
from agentd.memory.recall import NEAR_TIE, Recall, _as_dt, canonical, epoch, fragment, stamp  # noqa: F401
from agentd.memory.vectors import AgentIndex
from agentd.store import Store

# A fragment is stored in a transaction that first locks its agent's row (SQLite: the write
# lock from the start; PostgreSQL: SELECT ... FOR UPDATE), as every writer of an agent's rows
# does and as the agent's deletion does: a fragment is either stored before the deletion,
# which then removes it, or finds no agent and is not stored.
_write = orm.db_session(optimistic=False)

# Fragments whose vectors the loaded indexes may hold in all (about 1.6 KB each).
INDEX_CACHE_FRAGMENTS = 20_000
DEDUP_THRESHOLD = 0.92
# Generation numbers of invalidated indexes: one counter for all agents, so a number is never
# handed out twice (an index build compares the number before and after it reads the rows).
_GENERATIONS = itertools.count(1)
# A contradicting fragment this close to an older one supersedes it: both are kept and the
# newer one ranks first whenever both are recalled.
SUPERSEDE_THRESHOLD = 0.85

_NEGATIONS = frozenset({"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "cannot",
                        "without", "nowhere"})
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}
_TOKEN = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?|\d+(?:[.,:]\d+)*")
_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")


def _signature(text: str) -> tuple[tuple[str, ...], bool]:
    """(numbers in order of size, negated?) of a sentence, for the contradiction check."""
    lowered = text.lower()
    tokens = _TOKEN.findall(lowered)
    numbers = _NUMBER.findall(lowered) + [_NUMBER_WORDS[t] for t in tokens if t in _NUMBER_WORDS]
    negations = sum(1 for t in tokens if t in _NEGATIONS or t.endswith(("n't", "n’t")))
    return tuple(sorted(numbers)), negations % 2 == 1


def contradicts(a: str, b: str) -> bool:
    """True when two similar sentences differ in a number or in negation."""
    return a != b and _signature(a) != _signature(b)


class SemanticMemory(Recall):
    """remember / delete here, recall / page / get from `Recall`, per agent."""

    def __init__(self, store: Store, embedder: Callable[[], Embedder],
                 max_fragments: int = INDEX_CACHE_FRAGMENTS) -> None:
        self.store = store
        self._embedder_factory = embedder
        # Least recently used first. Past `max_fragments` fragments in all, the least recently
        # used agents' indexes are dropped (their next search reads them back from the store),
        # so memory stays bounded however many agents remember.
        self._indexes: OrderedDict[str, AgentIndex] = OrderedDict()
        self.max_fragments = max_fragments
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()
        # Several daemons on one database (agentd/memory/notify.py): `changed(agent_id)` is
        # called after every write here, and another daemon's write calls invalidate().
        self.changed: Callable[[str], None] | None = None
        self._generation: dict[str, int] = {}
        self.queries = QueryCache()

    def cached_fragments(self) -> int:
        """Fragments held by the cached search indexes in all (bounded by `max_fragments`)."""
        with self._guard:
            return sum(len(index) for index in self._indexes.values())

    def _changed(self, agent_id: str) -> None:
        if self.changed is not None:
            self.changed(agent_id)

    def invalidate(self, agent_id: str | None = None) -> None:
        """Drop an agent's index (every index with None): another daemon changed its rows, so
        the next search rebuilds it from the database."""
        with self._guard:
            ids = list(self._indexes) if agent_id is None else [agent_id]
            for key in ids:
                self._generation[key] = next(_GENERATIONS)
                self._indexes.pop(key, None)

    @property
    def embedder(self) -> Embedder:
        return self._embedder_factory()

    def lock(self, agent_id: str) -> threading.RLock:
        with self._guard:
            lock = self._locks.get(agent_id)
            if lock is None:
                lock = self._locks[agent_id] = threading.RLock()
            return lock

    # -- the index ------------------------------------------------------------------------
    def index(self, agent_id: str) -> AgentIndex:
        """The agent's index, rebuilt from the store on first use (re-embedding rows whose
        vector came from another model)."""
        found = self._indexes.get(agent_id)
        if found is not None:
            with self._guard:
                if agent_id in self._indexes:
                    self._indexes.move_to_end(agent_id)
            return found
        with self.lock(agent_id):
            found = self._indexes.get(agent_id)
            if found is not None:
                return found
            generation = self._generation.get(agent_id, 0)
            built = self._build(agent_id)
            with self._guard:
                # Not kept when another daemon's write arrived while it was being read.
                if self._generation.get(agent_id, 0) == generation:
                    self._indexes[agent_id] = built
            self._trim(agent_id)
            return built

    def _trim(self, *keep: str) -> None:
        """Drop the least recently used indexes (never `keep`'s) while the loaded ones hold
        more than `max_fragments` fragments."""
        with self._guard:
            total = sum(len(index) for index in self._indexes.values())
            for agent_id in list(self._indexes):
                if total <= self.max_fragments:
                    break
                if agent_id not in keep:
                    total -= len(self._indexes.pop(agent_id))

    def _build(self, agent_id: str) -> AgentIndex:
        embedder = self.embedder
        with orm.db_session:
            rows = self.store.db.select(
                "SELECT id, embedding, model, content, created_at, confidence, source, scope "
                "FROM memory_fragments WHERE agent_id = $a ORDER BY key", {"a": agent_id})
        stale = [r for r in rows if r[2] != embedder.name or not r[1]]
        if stale:
            vectors = embedder.embed([r[3] for r in stale])
            with orm.db_session:
                for r, v in zip(stale, vectors):
                    row = self.store.e.MemoryRow.get(agent_id=agent_id, id=r[0])
                    if row is not None:
                        row.embedding, row.model = v.astype("<f4").tobytes(), embedder.name
            fresh = {r[0]: v for r, v in zip(stale, vectors)}
        else:
            fresh = {}
        dims = embedder.dimensions or (len(next(iter(fresh.values()))) if fresh else None)
        if dims is None:
            dims = len(rows[0][1]) // 4 if rows else 384
        index = AgentIndex(dims)  # bulk() grows it to the rows' count in one step
        if rows:
            matrix = np.frombuffer(b"".join(fresh[r[0]].astype("<f4").tobytes() if r[0] in fresh else r[1]
                                            for r in rows), dtype="<f4").reshape(len(rows), dims)
            index.bulk([r[0] for r in rows], matrix, (epoch(_as_dt(r[4])) for r in rows),
                       (r[5] for r in rows), [r[6] for r in rows], [r[7] for r in rows])
        return index

    def forget_agent(self, agent_id: str) -> None:
        """Delete every fragment of an agent (its index goes too)."""
        with self.lock(agent_id):
            with orm.db_session:
                self.store.db.execute("DELETE FROM memory_metadata WHERE agent_id = $a", {"a": agent_id})
                self.store.db.execute("DELETE FROM memory_fragments WHERE agent_id = $a", {"a": agent_id})
            self._indexes.pop(agent_id, None)
        with self._guard:
            self._locks.pop(agent_id, None)
            self._generation.pop(agent_id, None)
        self._changed(agent_id)

    def loaded_ids(self, agent_id: str) -> list[str] | None:
        """The agent's fragment ids when its index is in memory (None: not loaded yet). The
        index's own list, not a copy (it can hold 100,000 ids): callers only read it."""
        index = self._indexes.get(agent_id)
        return None if index is None else index.ids

    def version(self, agent_id: str) -> int | None:
        """A number that changes with every write to the agent's loaded index (None: not loaded)."""
        index = self._indexes.get(agent_id)
        return None if index is None else index.version

    def count(self, agent_id: str) -> int:
        index = self._indexes.get(agent_id)
        if index is not None:
            return len(index)
        with orm.db_session:
            return self.store.db.select("SELECT COUNT(*) FROM memory_fragments WHERE agent_id = $a",
                                        {"a": agent_id})[0]

    # -- writes ---------------------------------------------------------------------------
    def remember(self, agent_id: str, content: str, source: str = "user_provided", scope: str = "semantic",
                 metadata: dict[str, Any] | None = None, confidence: float = 1.0) -> dict[str, Any]:
        """Store a fragment, or merge it into a near-duplicate; `{id, merged}`."""
        vector = self.embedder.embed([content])[0]
        with self.lock(agent_id):
            index = self.index(agent_id)
            with self.owned(agent_id):
                result = self._remember(agent_id, index, content, vector, source, scope, metadata or {},
                                        confidence)
        if not result["merged"]:  # (a merge adds no row: nothing more to hold)
            self._trim(agent_id)
        self._changed(agent_id)
        return result

    def remember_many(self, agent_id: str, items: list[dict[str, Any]],
                      vectors: Sequence[np.ndarray] | None = None,
                      same_text_only: bool = False) -> list[dict[str, Any]]:
        """`remember` for many fragments (`{content, source?, scope?, metadata?, confidence?}`,
        already validated) of one agent: embedded in batches of 32 (one model run each), then
        stored one by one, each deduplicated against the agent's fragments and the batch's
        earlier ones. Each fragment is its own transaction (as with `remember`): a batch that
        merges twice into the same row in one Pony session trips its optimistic check.
        `vectors`: the items' embeddings when the caller already made them. `same_text_only`:
        merge only into a fragment of the very same text (vectors that stand for part of the
        text, such as an exchange's question, say nothing about whether the rest matches)."""
        if not items:
            return []
        if vectors is None:
            vectors = self.embedder.embed([item["content"] for item in items])
        with self.lock(agent_id):
            index = self.index(agent_id)
            results = []
            for item, vector in zip(items, vectors):
                with self.owned(agent_id):
                    results.append(self._remember(agent_id, index, item["content"], vector,
                                                  item.get("source", "user_provided"), item.get("scope", "semantic"),
                                                  item.get("metadata") or {}, item.get("confidence", 1.0),
                                                  same_text_only))
        if not all(result["merged"] for result in results):
            self._trim(agent_id)
        self._changed(agent_id)
        return results

    def remember_groups(self, groups: list[tuple[str, list[dict[str, Any]], Sequence[np.ndarray]]],
                        same_text_only: bool = False) -> list[list[dict[str, Any]]]:
        """`remember_many` for several agents' fragments (`(agent_id, items, vectors)`, one
        group per agent) in one transaction: the background worker's batch, one commit
        instead of one per fragment. Every group's agent lock is held until the commit, so no
        other write of theirs reads the index ahead of the store. The group of an agent that
        no longer exists is dropped (its result is empty). When the transaction fails none
        of it is kept and the error is raised; the caller can still store the groups one by
        one (`remember_many`)."""
        agents = sorted({agent_id for agent_id, _, _ in groups})
        with contextlib.ExitStack() as held:
            for agent_id in agents:  # always in this order: two holders never wait on each other
                held.enter_context(self.lock(agent_id))
            # Read before the transaction: a build must not hold the write lock it would take.
            indexes = {agent_id: self.index(agent_id) for agent_id in agents}
            versions = {agent_id: index.version for agent_id, index in indexes.items()}
            with self.writing(agents) as alive:
                results = [[self._remember(agent_id, indexes[agent_id], item["content"], vector,
                                           item.get("source", "user_provided"), item.get("scope", "semantic"),
                                           item.get("metadata") or {}, item.get("confidence", 1.0),
                                           same_text_only)
                            for item, vector in zip(items, vectors)] if agent_id in alive else []
                           for agent_id, items, vectors in groups]
        # One pass over the cache for the batch, keeping every index it grew.
        grown = [agent_id for (agent_id, _, _), stored in zip(groups, results)
                 if not all(result["merged"] for result in stored)]
        if grown:
            self._trim(*grown)
        # Only agents whose index changed: a fragment stated again changes nothing another
        # daemon's index holds.
        for agent_id, _, _ in groups:
            if indexes[agent_id].version != versions[agent_id]:
                self._changed(agent_id)
        return results

    @contextlib.contextmanager
    def writing(self, agents: Sequence[str]) -> Iterator[set[str]]:
        """One transaction that first locks the rows of `agents` (whose locks here the
        caller holds) and yields those that exist. When it fails, their indexes, which may
        hold rows the rollback undid, are dropped (the next search reads them back)."""
        params = {f"a{n}": agent_id for n, agent_id in enumerate(agents)}
        names = ", ".join(f"${key}" for key in params)
        # One statement for the batch, the rows locked in id order (ORDER BY before the lock).
        lock = f"SELECT id FROM agents WHERE id IN ({names}) ORDER BY id" + (" FOR UPDATE" if self.store.shared else "")
        try:
            with _write:
                yield {row[0] for row in self.store.raw_rows(lock, params)}
        except BaseException:
            with self._guard:
                for agent_id in agents:
                    self._generation[agent_id] = next(_GENERATIONS)
                    self._indexes.pop(agent_id, None)
            raise

    @contextlib.contextmanager
    def owned(self, agent_id: str) -> Iterator[None]:
        """`writing` for one agent; NotFound when it no longer exists."""
        with self.writing([agent_id]) as alive:
            if not alive:
                raise NotFound("agent not found")
            yield

    def _remember(self, agent_id: str, index: AgentIndex, content: str, vector: np.ndarray, source: str,
                  scope: str, metadata: dict[str, Any], confidence: float,
                  same_text_only: bool = False) -> dict[str, Any]:
        """Under the agent's lock: merge into a near-duplicate or insert (and index) a new row."""
        close = index.similar(vector, scope, min_score=SUPERSEDE_THRESHOLD)  # best first
        near = fragment_rows.near(self.store, agent_id, [h.id for h in close]) if close else {}
        contents = {fid: row[0] for fid, row in near.items()}
        for hit in close:
            existing = contents.get(hit.id)
            if existing is None:
                continue
            if same_text_only and existing != content:
                continue
            if hit.score >= DEDUP_THRESHOLD and not contradicts(existing, content):
                if existing != content or not fragment_rows.restated(self.store, agent_id, hit.id, near[hit.id],
                                                                     metadata, confidence):
                    self._merge(agent_id, index, hit.id, content, vector, metadata, confidence)
                return {"id": hit.id, "merged": True}
        now = utcnow()
        fid = str(uuid.uuid4())
        # In id order: the rows are locked in the order they are changed (see recall's _touch).
        superseded = sorted(fid_ for fid_, text in contents.items() if contradicts(text, content))
        with orm.db_session:
            fragment_rows.insert(self.store, agent_id, fid, content, vector, self.embedder.name, metadata, source,
                                 scope, confidence, now, now, 0)
            fragment_rows.supersede(self.store, agent_id, superseded, fid)
        index.put(fid, vector, epoch(now), confidence, source, scope)
        return {"id": fid, "merged": False}

    def _merge(self, agent_id: str, index: AgentIndex, fid: str, content: str, vector: np.ndarray,
               metadata: dict[str, Any], confidence: float, access_count: int = 0) -> None:
        """Newer wording replaces the content; metadata merged; confidence is the max."""
        created, conf, source, scope = fragment_rows.merge(self.store, agent_id, fid, content, vector,
                                                           self.embedder.name, metadata, confidence, access_count)
        index.put(fid, vector, epoch(created), conf, source, scope)

    def update(self, agent_id: str, fid: str, content: str, scope: str | None = None,
               confidence: float | None = None) -> None:
        """Rewrite one fragment in place (same id, new vector); NotFound when there is none.
        Unlike `remember` nothing merges: a person correcting a fragment means that one."""
        vector = self.embedder.embed([content])[0]
        with self.lock(agent_id):
            index = self.index(agent_id)
            # A recall's access bookkeeping may write the row meanwhile; the new text wins.
            with orm.db_session(optimistic=False):
                row = self.store.e.MemoryRow.get_for_update(agent_id=agent_id, id=fid)
                if row is None:
                    raise NotFound(f"memory not found: {fid}")
                row.content = content
                row.embedding, row.model = vector.astype("<f4").tobytes(), self.embedder.name
                if scope is not None:
                    row.scope = scope
                if confidence is not None:
                    row.confidence = float(confidence)
                created, conf, source, scope_ = row.created_at, row.confidence, row.source, row.scope
            index.put(fid, vector, epoch(created), conf, source, scope_)
        self._changed(agent_id)

    def delete(self, agent_id: str, fid: str) -> None:
        """Remove one fragment; NotFound when the agent has none with that id."""
        with self.lock(agent_id):
            with orm.db_session:
                row = self.store.e.MemoryRow.get(agent_id=agent_id, id=fid)
                if row is None:
                    raise NotFound(f"memory not found: {fid}")
                row.delete()
                self.store.db.execute("DELETE FROM memory_metadata WHERE agent_id = $a AND memory_id = $f",
                                      {"a": agent_id, "f": fid})
            index = self._indexes.get(agent_id)
            if index is not None:
                index.remove(fid)
        self._changed(agent_id)
