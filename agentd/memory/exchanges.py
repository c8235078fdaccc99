"""Auto-remember: each completed run's exchange is queued and stored by one background
worker, off the request path (`ExchangeWorker`, mixed into `MemoryService`). The hooks
never block and never raise; `drain` waits for what is queued (shutdown, tests).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Sequence

from agentd.config import MemoryConfig
from agentd.errors import NotFound
from agentd.memory import fields
from agentd.memory.trim import Trimmer
from agentd.store import Store
from agentd.store.outage import log_failure

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from agentd.memory.semantic import SemanticMemory

log = logging.getLogger("agentd.memory")

QUEUE_LIMIT = 1000
# Agents whose emptiness or session exchanges are remembered here (a forgotten one costs
# a count query or a recall, never a wrong answer).
AGENTS_KEPT = 4096
WORKER_BATCH = 32  # exchanges stored per model run by the background worker
# Once an exchange arrives the worker waits this long for others before storing: a busy
# daemon then wakes it once per several exchanges, not once each (a stored exchange is
# recallable this much later, long before a person sends the next message).
WORKER_WAIT_SECS = 0.02
ASKED, ANSWERED = "User asked: ", "\nI responded: "
# The metadata key naming whose session an auto-remembered exchange came from.
OWNER = "owner"
EPISODIC = "episodic"


class ExchangeWorker:
    """after_exchange / drain and the worker behind them (mixed into MemoryService)."""

    # Provided by MemoryService (agentd/memory/service.py).
    config: MemoryConfig
    store: Store
    semantic: SemanticMemory
    _semantic: SemanticMemory | None
    _queue: queue.Queue[tuple[str, str, str, dict[str, Any]] | None]
    _exchanges: dict[str, dict[str, str]]
    _dead: set[str]
    _trim: Trimmer
    _init_lock: threading.Lock
    _worker: threading.Thread | None

    def after_exchange(self, agent_id: str, session_id: str, user_text: str, answer: str,
                       owner: str | None = None) -> None:
        """Queue the exchange as an episodic fragment (never blocks, never raises); `owner`
        (whose session it came from) is recorded so only that person's runs recall it."""
        if not self.config.auto_remember or not user_text.strip() or not answer.strip():
            return
        # PostgreSQL cannot store U+0000 in text; the session keeps the exchange as written.
        content = f"{ASKED}{user_text}{ANSWERED}{answer}"[:fields.MAX_CONTENT].replace("\x00", "\ufffd")
        metadata: dict[str, Any] = {"session_id": session_id}
        if owner is not None:
            metadata[OWNER] = owner
        try:
            self._queue.put_nowait((agent_id, user_text, content, metadata))
        except queue.Full:
            log.warning("memory queue full; exchange of agent %s not remembered", agent_id)
            return
        if self._worker is None:
            with self._init_lock:
                if self._worker is None:
                    self._worker = threading.Thread(target=self._work, name="agentd-memory", daemon=True)
                    self._worker.start()

    def _work(self) -> None:
        while True:
            batch = [self._queue.get()]
            if self._queue.qsize() < WORKER_BATCH - 1:
                time.sleep(WORKER_WAIT_SECS)
            # Exchanges that queued up meanwhile go together: at most one model run for
            # the batch (see _exchange_vectors).
            while len(batch) < WORKER_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                if any(item is None for item in batch):
                    self._store_exchanges([item for item in batch if item is not None])
                    return
                if self._store_exchanges(batch):  # type: ignore[arg-type]
                    self._trim()  # (only after the model ran: its scratch memory is what piles up)
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _store_exchanges(self, batch: list[tuple[str, str, str, dict[str, Any]]]) -> bool:
        """Store a batch; whether the model ran for it."""
        batch = [item for item in batch if item[0] not in self._dead]
        if not batch:
            return False
        by_agent: dict[str, list[int]] = {}
        for at, item in enumerate(batch):
            by_agent.setdefault(item[0], []).append(at)
        whole = self.config.embed_whole_exchange
        try:
            vectors, ran = self._exchange_vectors(batch)
        except Exception:  # noqa: BLE001 - a failed remember is logged, never raised
            for agent_id, places in by_agent.items():
                log.exception("remembering %d exchange(s) of agent %s failed", len(places), agent_id)
            return True
        fragments = {agent_id: [{"content": batch[at][2], "source": "conversation", "scope": EPISODIC,
                                 "metadata": batch[at][3]} for at in places]
                     for agent_id, places in by_agent.items()}
        chosen = {agent_id: [vectors[at] for at in places] for agent_id, places in by_agent.items()}
        try:
            together: list[list[dict[str, Any]]] | None = self.semantic.remember_groups(
                [(agent_id, fragments[agent_id], chosen[agent_id]) for agent_id in by_agent],
                same_text_only=not whole)
        except Exception:  # noqa: BLE001 - stored agent by agent below, where failures are logged
            log.debug("one transaction for %d exchange(s) failed; storing them agent by agent", len(batch),
                      exc_info=True)
            together = None
        for n, (agent_id, places) in enumerate(by_agent.items()):
            items = [batch[at] for at in places]
            try:
                stored = together[n] if together is not None else self.semantic.remember_many(
                    agent_id, fragments[agent_id], chosen[agent_id], same_text_only=not whole)
            except NotFound:
                stored = []
            except Exception as exc:  # noqa: BLE001 - a failed remember is logged, never raised
                log_failure(log, exc, "remembering %d exchange(s) of agent %s failed", len(items), agent_id)
                continue
            if not stored:  # deleted since its exchanges were queued: nobody could read them
                log.debug("%d exchange(s) of deleted agent %s not remembered", len(items), agent_id)
                continue
            known = self._exchanges.get(agent_id)
            if known is None:
                while len(self._exchanges) >= AGENTS_KEPT:
                    self._exchanges.pop(next(iter(self._exchanges)), None)
                known = self._exchanges[agent_id] = {}
            for (_, user_text, _, _), result in zip(items, stored):
                known[result["id"]] = user_text
        return ran

    def _exchange_vectors(self, batch: list[tuple[str, str, str, dict[str, Any]]]
                          ) -> tuple["Sequence[np.ndarray]", bool]:
        """One vector per exchange, and whether the model ran for them. By default the user
        message's: the recall before the model call embedded that very text a moment ago (the
        query cache holds it), so an exchange costs no model run of its own; texts not cached
        are embedded in one run.
        With `embed_whole_exchange`, question and answer together in one run for the batch,
        whichever agents it spans (a batch costs less per text than single runs)."""
        semantic = self.semantic
        embedder = semantic.embedder
        if self.config.embed_whole_exchange:
            return embedder.embed([content for _, _, content, _ in batch]), True
        cache, name = semantic.queries, embedder.name
        found = {user: cache.peek(name, user) for _, user, _, _ in batch}
        missing = [user for user, vector in found.items() if vector is None]
        if missing:
            for user, vector in zip(missing, embedder.embed(missing)):
                found[user] = cache.put(name, user, vector)
        return [found[user] for _, user, _, _ in batch], bool(missing)

    def drain(self, timeout: float = 10.0) -> None:
        """Wait until queued exchanges are stored (shutdown, tests)."""
        done = threading.Event()
        threading.Thread(target=lambda: (self._queue.join(), done.set()), daemon=True).start()
        done.wait(timeout)
