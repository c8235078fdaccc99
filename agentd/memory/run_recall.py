"""A run's recall: the system prompt with what memory recalls for the user's message, made
again before a model call only when the agent's memory changed, and the access counts of what
it recalled, written with the run's session."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentd.memory.access import access_updates
from agentd.timestamps import utcnow

if TYPE_CHECKING:  # pragma: no cover
    from agentd.memory.service import MemoryService
    from agentd.store.writer import Tx


class RunRecall:
    """`system_context` for each model call of one run, searched again only when the agent's
    memory changed since the previous call (a fact stored by a tool, another request or the
    background worker reaches the next model call; unchanged memory is not searched, embedded
    or access-counted again).

    What the recalls returned is counted as accessed in the run's own write
    (`count_accesses(tx)`, with its session): a transaction of its own per message, on a
    connection other than the writer's, cost the daemon more than the rest of the recall."""

    def __init__(self, service: MemoryService, agent_id: str, user_text: str, history: list[dict[str, Any]],
                 system: str, owner: str | None) -> None:
        self._service = service
        self._args = (agent_id, user_text, history, system, owner)
        self._version: int | None = None
        self._text = system
        self._accessed: dict[str, int] = {}  # fragment id -> recalls that returned it

    def _index_version(self) -> int | None:
        semantic = self._service._semantic
        return semantic.version(self._args[0]) if semantic is not None else None

    def __call__(self) -> str:
        before = self._index_version()
        if before is not None and before == self._version:
            return self._text
        self._text = self._service.system_context(*self._args, seen=self._seen)
        # Read before the recall, so a write racing with it is searched next time; when the
        # index was not loaded yet, the recall itself has just loaded it.
        self._version = before if before is not None else self._index_version()
        return self._text

    def _seen(self, found: list[dict[str, Any]]) -> None:
        for item in found:
            self._accessed[item["id"]] = self._accessed.get(item["id"], 0) + 1

    def count_accesses(self, tx: Tx) -> None:
        """Count what this run's recalls returned as accessed, in the write `tx`. On a shared
        database the rows another transaction holds are left uncounted: the run's write never
        waits on bookkeeping."""
        if self._accessed:
            for sql, params in access_updates(self._args[0], self._accessed, utcnow(),
                                              self._service.store.shared, skip_locked=True):
                tx.execute(sql, params)
