"""The memory service the kernel owns (`kernel.memory`): one entry point for routes, tools
and the agent loop.

Cheap to build: numpy, onnxruntime and the model are loaded by the first operation that
needs vectors, so a daemon whose agents never touch semantic memory never pays for them.
Auto-remember runs on one background worker, off the request path; the loop hooks never
raise.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from agentd.config import MemoryConfig
from agentd.errors import NotFound
from agentd.memory import fields
# (QUEUE_LIMIT and WORKER_BATCH are read from here too.)
from agentd.memory.exchanges import AGENTS_KEPT, ANSWERED, ASKED, OWNER, ExchangeWorker
from agentd.memory.exchanges import QUEUE_LIMIT, WORKER_BATCH  # noqa: F401
from agentd.memory.graph import KnowledgeGraph
from agentd.memory.run_recall import RunRecall
from agentd.memory.trim import Trimmer
from agentd.store import Store
from agentd.store.outage import log_failure

if TYPE_CHECKING:  # pragma: no cover
    from agentd.llm.types import ProviderEndpoint
    from agentd.memory.embedder import Embedder
    from agentd.memory.semantic import SemanticMemory

log = logging.getLogger("agentd.memory")

CONTEXT_HEADING = "## Relevant memories"


def others_of(owner: str, people: bool = False) -> Callable[[dict[str, Any]], bool]:
    """Whether a recalled fragment is an exchange of someone other than `owner` (with
    `people`, other than `owner` and the people it speaks for: owners `owner:...`).
    Fragments without an owner (explicit memory_store, imports, consolidation) are agent-wide."""
    def hide(item: dict[str, Any]) -> bool:
        metadata = item.get("metadata") or {}
        if OWNER not in metadata or item.get("source") != "conversation" or item.get("scope") != "episodic":
            return False
        theirs = str(metadata[OWNER])
        return theirs != owner and not (people and theirs.startswith(owner + ":"))
    return hide


class MemoryService(ExchangeWorker):
    """Semantic memory, the knowledge graph, consolidation and export/import."""

    def __init__(self, config: MemoryConfig, store: Store,
                 endpoint: Callable[[str], "ProviderEndpoint"] | None = None, retries: int = 3,
                 on_recall: Callable[[float], None] | None = None) -> None:
        self.config = config
        self._on_recall = on_recall  # given each recall's seconds (a metrics histogram)
        self.store = store
        self.graph = KnowledgeGraph(store)
        self._endpoint = endpoint
        self._retries = retries
        self._embedder: Embedder | None = None
        self._semantic: SemanticMemory | None = None
        self._init_lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, str, str, dict[str, Any]] | None] = queue.Queue(QUEUE_LIMIT)
        # agent id -> {fragment id: user message} of exchanges auto-remembered by this process,
        # so a run whose agent remembers nothing but its current session skips the recall.
        self._exchanges: dict[str, dict[str, str]] = {}
        # Agents whose fragments were counted 0 while their index was not loaded: a run of
        # theirs skips the count query until something is written for them. Only on a
        # database of its own: another daemon's write would not reach this set in time.
        self._empty: set[str] = set()
        self._cache_empty = not store.shared
        self._writes = 0  # counts _changed/invalidate calls: a count that raced a write is not cached
        self._worker: threading.Thread | None = None
        self._trim = Trimmer()
        self._dead: set[str] = set()
        self._stop = threading.Event()
        self._scheduler: threading.Thread | None = None
        # Called with an agent id after its semantic memory changed (agentd/memory/notify.py
        # tells the other daemons on the same database).
        self.on_change: Callable[[str], None] | None = None

    # -- lazily built parts ---------------------------------------------------------------
    @property
    def embedder(self) -> "Embedder":
        if self._embedder is None:
            with self._init_lock:
                if self._embedder is None:
                    from agentd.memory.embedder import LocalEmbedder, ProviderEmbedder

                    cfg = self.config
                    if cfg.embedding_provider:
                        endpoint = self._endpoint
                        if endpoint is None:
                            raise RuntimeError("provider embeddings need the kernel's endpoint lookup")
                        self._embedder = ProviderEmbedder(cfg.embedding_provider, cfg.embedding_model,
                                                          lambda: endpoint(cfg.embedding_provider), self._retries)
                    else:
                        self._embedder = LocalEmbedder(cfg.embed_threads)
        return self._embedder

    @property
    def semantic(self) -> "SemanticMemory":
        if self._semantic is None:
            with self._init_lock:
                if self._semantic is None:
                    from agentd.memory.embedder import import_numpy

                    import_numpy()
                    from agentd.memory.semantic import SemanticMemory

                    self._semantic = SemanticMemory(self.store, lambda: self.embedder,
                                                    self.config.index_cache_fragments)
                    self._semantic.changed = self._changed
        return self._semantic

    @property
    def loaded(self) -> bool:
        """Whether anything heavy (numpy, the model) has been loaded yet."""
        return self._semantic is not None

    # -- operations (arguments validated here, for routes and tools alike) ----------------
    def remember(self, agent_id: str, content: Any, source: Any = None, scope: Any = None,
                 metadata: Any = None, confidence: Any = None) -> dict[str, Any]:
        return self.semantic.remember(
            agent_id, fields.text(content, "content"),
            fields.source(source) if source is not None else "user_provided",
            fields.text(scope, "scope", fields.MAX_NAME) if scope is not None else "semantic",
            fields.obj(metadata, "metadata") if metadata is not None else {},
            fields.confidence(confidence) if confidence is not None else 1.0)

    def recall(self, agent_id: str, query: Any, limit: Any = None, min_score: Any = None,
               flt: Any = None, owner: str | None = None) -> list[dict[str, Any]]:
        """The fragments nearest `query`; with `owner` (a scoped key's session label), the
        exchanges of sessions other than the key's own and its people's are left out."""
        args = (fields.text(query, "query"), fields.integer(limit, "limit", 1, 100) if limit is not None else 5,
                fields.score(min_score) if min_score is not None else None, fields.memory_filter(flt))
        if args[3].agent_id is not None and args[3].agent_id != agent_id:
            return []  # an agent's memory holds only its own fragments
        return self._timed_recall(agent_id, *args, hide=None if owner is None else others_of(owner, people=True))

    def _timed_recall(self, agent_id: str, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        started = time.perf_counter()
        try:
            return self.semantic.recall(agent_id, *args, **kwargs)
        finally:
            if self._on_recall is not None:
                self._on_recall(time.perf_counter() - started)

    # With `owner` (a scoped key's session label), the reads and writes below leave other
    # people's exchanges out, as recall does: not listed, exported or found (404).
    def page(self, agent_id: str, limit: int, offset: int, owner: str | None = None) -> dict[str, Any]:
        return self.semantic.page(agent_id, fields.integer(limit, "limit", 1, 1000),
                                  fields.integer(offset, "offset", 0, 2**31), owner)

    def get(self, agent_id: str, memory_id: str, owner: str | None = None) -> dict[str, Any]:
        item = self.semantic.get(agent_id, memory_id)
        if owner is not None and others_of(owner, people=True)(item):
            raise NotFound(f"memory not found: {memory_id}")
        return item

    def update(self, agent_id: str, memory_id: str, content: Any, scope: Any = None,
               confidence: Any = None, owner: str | None = None) -> dict[str, Any]:
        """Rewrite a fragment's content (and scope, confidence); the fragment as it now is."""
        if owner is not None:
            self.get(agent_id, memory_id, owner)
        self.semantic.update(agent_id, memory_id, fields.text(content, "content"),
                             fields.text(scope, "scope", fields.MAX_NAME) if scope is not None else None,
                             fields.confidence(confidence) if confidence is not None else None)
        return self.semantic.get(agent_id, memory_id)

    def delete(self, agent_id: str, memory_id: str, owner: str | None = None) -> None:
        if owner is not None:
            self.get(agent_id, memory_id, owner)
        self.semantic.delete(agent_id, memory_id)

    def add_entity(self, agent_id: str, entity_type: Any, name: Any, properties: Any = None) -> dict[str, Any]:
        return self.graph.add_entity(agent_id, fields.kind(entity_type, "entity_type"),
                                     fields.text(name, "name", fields.MAX_NAME).strip(),
                                     fields.obj(properties, "properties") if properties is not None else {})

    def add_relation(self, agent_id: str, source: Any, relation: Any, target: Any, properties: Any = None,
                     confidence: Any = None) -> dict[str, Any]:
        return self.graph.add_relation(agent_id, fields.text(source, "source", fields.MAX_NAME),
                                       fields.kind(relation, "relation"),
                                       fields.text(target, "target", fields.MAX_NAME),
                                       fields.obj(properties, "properties") if properties is not None else {},
                                       fields.confidence(confidence) if confidence is not None else 1.0)

    def query_graph(self, agent_id: str, source: Any = None, relation: Any = None, target: Any = None,
                    max_depth: Any = None) -> list[dict[str, Any]]:
        def optional(value: Any, name: str) -> str | None:
            return None if value is None else fields.text(value, name, fields.MAX_NAME)

        return self.graph.query(agent_id, optional(source, "source"),
                                None if relation is None else fields.kind(relation, "relation"),
                                optional(target, "target"),
                                fields.depth(max_depth) if max_depth is not None else 1)

    def consolidate(self, agent_id: str) -> dict[str, Any]:
        from agentd.memory.maintenance import consolidate

        try:
            return consolidate(self.semantic, agent_id, self.config)
        finally:
            self._changed(agent_id)

    def export(self, agent_id: str, owner: str | None = None) -> dict[str, Any]:
        from agentd.memory.portable import export

        return export(self.semantic, self.graph, agent_id, owner)

    def import_doc(self, agent_id: str, doc: Any) -> dict[str, Any]:
        from agentd.memory.portable import import_doc

        try:
            return import_doc(self.semantic, self.graph, agent_id, doc)
        finally:
            self._changed(agent_id)

    def _changed(self, agent_id: str) -> None:
        self._writes += 1
        self._empty.discard(agent_id)
        if self.on_change is not None:
            self.on_change(agent_id)

    def invalidate(self, agent_id: str | None = None) -> None:
        """Another daemon changed this agent's fragments (None: maybe any agent's)."""
        self._writes += 1
        if agent_id is None:
            self._empty.clear()
        else:
            self._empty.discard(agent_id)
        if self._semantic is not None:
            self._semantic.invalidate(agent_id)

    def forget_agent(self, agent_id: str) -> None:
        """Delete everything an agent remembered (called when the agent is killed)."""
        self._dead.add(agent_id)
        self._exchanges.pop(agent_id, None)
        if self._semantic is not None:
            self._semantic.forget_agent(agent_id)
        else:
            from pony import orm

            with orm.db_session:
                self.store.db.execute("DELETE FROM memory_metadata WHERE agent_id = $a", {"a": agent_id})
                self.store.db.execute("DELETE FROM memory_fragments WHERE agent_id = $a", {"a": agent_id})
        self.graph.forget_agent(agent_id)

    # -- the agent loop -------------------------------------------------------------------
    def system_context(self, agent_id: str, user_text: str, history: list[dict[str, Any]], system: str,
                       owner: str | None = None,
                       seen: Callable[[list[dict[str, Any]]], None] | None = None) -> str:
        """`system` plus the fragments most relevant to the user's message (never raises).

        Exchanges still in the session are skipped: the model already sees them. With
        `owner` (a person, "" for the agent's own session), exchanges remembered from other
        people's sessions are skipped too; agent-wide facts are always seen. The fragments
        recalled are counted as accessed at once, or given to `seen` to count later.
        """
        if self.config.recall_limit <= 0 or not user_text.strip():
            return system
        try:
            made: list[set[str]] = []

            def asked_here() -> set[str]:
                # Made only when needed: most agents have nothing to recall, known at once.
                if not made:
                    made.append({f"{ASKED}{m.get('content')}" for m in history
                                 if m.get("role") == "user" and isinstance(m.get("content"), str)})
                return made[0]

            session_ids: set[str] = set()
            if self._nothing_to_recall(agent_id, asked_here, session_ids):
                return system  # (and the model is not loaded or run for nothing)

            def in_session(content: str) -> bool:
                return content.split(ANSWERED, 1)[0] in asked_here()

            found = self._timed_recall(agent_id, user_text, self.config.recall_limit, self.config.min_score,
                                       skip=in_session, skip_ids=frozenset(session_ids),
                                       hide=None if owner is None else others_of(owner), touch=seen is None)
        except Exception as exc:  # noqa: BLE001 - memory must never fail a run
            log_failure(log, exc, "memory recall for agent %s failed", agent_id)
            return system
        if not found:
            return system
        if seen is not None:
            seen(found)
        lines = "\n".join(f"- {f['content']}" for f in found)
        block = (f"{CONTEXT_HEADING}\nFacts remembered from earlier conversations, most relevant first "
                 f"(newer facts override older ones):\n{lines}")
        return f"{system}\n\n{block}" if system else block

    def context_for_run(self, agent_id: str, user_text: str, history: list[dict[str, Any]],
                        system: str, owner: str | None = None) -> RunRecall:
        """What the loop calls before each model call (see `RunRecall`)."""
        return RunRecall(self, agent_id, user_text, history, system, owner)

    def _nothing_to_recall(self, agent_id: str, asked: Callable[[], set[str]], session_ids: set[str]) -> bool:
        """True when the agent has no fragments, or only exchanges of its current session
        (`asked()`: the session's user turns, as fragments begin). The ids of the exchanges
        known to be in the session are added to `session_ids`."""
        known = self._exchanges.get(agent_id)
        in_session: set[str] = set()
        if known:
            session = asked()
            kept = {fid: user for fid, user in known.items() if f"{ASKED}{user}" in session}
            self._exchanges[agent_id] = kept  # forget exchanges that left the session
            in_session = set(kept)
            session_ids.update(in_session)
        ids = self._semantic.loaded_ids(agent_id) if self._semantic is not None else None
        if ids is None:
            if agent_id in self._empty:
                return True
            writes = self._writes
            empty = self._count(agent_id) == 0
            if empty and self._cache_empty and writes == self._writes:
                if len(self._empty) >= AGENTS_KEPT:
                    self._empty.clear()
                self._empty.add(agent_id)
            return empty
        return len(ids) <= len(in_session) and set(ids) <= in_session

    def _count(self, agent_id: str) -> int:
        from pony import orm

        with orm.db_session:
            return self.store.db.select("SELECT COUNT(*) FROM memory_fragments WHERE agent_id = $a",
                                        {"a": agent_id})[0]

    # -- schedule -------------------------------------------------------------------------
    def start(self) -> None:
        """Start scheduled consolidation (`[memory] consolidate_every_hours`, 0 = never)."""
        hours = self.config.consolidate_every_hours
        if hours <= 0 or self._scheduler is not None:
            return
        self._scheduler = threading.Thread(target=self._schedule, args=(hours * 3600.0,),
                                           name="agentd-memory-consolidate", daemon=True)
        self._scheduler.start()

    def _schedule(self, period: float) -> None:
        while not self._stop.wait(period):
            try:
                if self._count_all() == 0:
                    continue
                from agentd.memory.maintenance import agents_with_memories

                for agent_id in agents_with_memories(self.semantic):
                    if self._stop.is_set():
                        return
                    report = self.consolidate(agent_id)
                    log.info("consolidated memory of agent %s: %s", agent_id, report)
            except Exception as exc:  # noqa: BLE001
                log_failure(log, exc, "scheduled memory consolidation failed")

    def _count_all(self) -> int:
        from pony import orm

        with orm.db_session:
            return self.store.db.select("SELECT COUNT(*) FROM memory_fragments")[0]

    def close(self) -> None:
        self._stop.set()
        if self._worker is not None:
            self.drain(5.0)
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass
