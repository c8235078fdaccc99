"""Per-agent key-value memory persisted in the store. One agent never sees another's keys."""

from __future__ import annotations

from typing import Any, Callable

from pony import orm

from agentd.errors import BadRequest, NotFound
from agentd.jsonsafe import NUL_MESSAGE, holds_nul
from agentd.timestamps import utcnow
from agentd.store import Store

MAX_KEY_LENGTH = 256

# Writes of one agent's keys are last-writer-wins: each first locks the agent's row
# (SQLite: the write lock from the start; PostgreSQL: SELECT ... FOR UPDATE), so two PUTs,
# or a PUT and a DELETE, of one key at once serialize instead of failing Pony's optimistic
# check or racing each other's insert, a PUT that follows a DELETE recreates the key, and
# a write after the agent's deletion finds no agent. The agent's deletion takes the same
# lock first, so the two never wait on each other in opposite orders.
_write = orm.db_session(optimistic=False)


# (agent_id, key, value (None when deleted), deleted, origin of the run that wrote it or "")
OnChange = Callable[[str, str, Any, bool, str], None]


class KvMemory:
    """Key-value operations scoped by agent id; `on_change` hears of every value that
    changed (after its transaction committed)."""

    def __init__(self, store: Store, on_change: OnChange | None = None) -> None:
        self.store = store
        self.on_change = on_change

    def all(self, agent_id: str) -> dict[str, Any]:
        with orm.db_session:
            rows = orm.select(r for r in self.store.e.KvRow if r.agent.id == agent_id)
            return {r.key: r.value for r in rows.order_by(lambda r: r.key)}

    def get(self, agent_id: str, key: str) -> tuple[bool, Any]:
        """(found, value)."""
        if holds_nul(key):
            return False, None  # no key holds NUL (and PostgreSQL refuses it in a query)
        with orm.db_session:
            row = self.store.e.KvRow.get(agent=agent_id, key=key)
            return (False, None) if row is None else (True, row.value)

    def set(self, agent_id: str, key: str, value: Any, origin: str = "") -> None:
        if holds_nul(key):
            raise BadRequest(f"key {NUL_MESSAGE}")
        if holds_nul(value):
            raise BadRequest(f"value: a string {NUL_MESSAGE}")
        changed = self._set(agent_id, key, value)
        if changed and self.on_change is not None:
            self.on_change(agent_id, key, value, False, origin)

    def _set(self, agent_id: str, key: str, value: Any) -> bool:
        with _write:
            if self.store.e.AgentRow.get_for_update(id=agent_id) is None:
                raise NotFound("agent not found")
            row = self.store.e.KvRow.get_for_update(agent=agent_id, key=key)
            if row is None:
                self.store.e.KvRow(agent=agent_id, key=key, value=value, updated_at=utcnow())
                return True
            changed = row.value != value
            row.value = value
            row.updated_at = utcnow()
            return changed

    def delete(self, agent_id: str, key: str, origin: str = "") -> bool:
        if holds_nul(key):
            return False
        with _write:
            if self.store.e.AgentRow.get_for_update(id=agent_id) is None:
                return False
            row = self.store.e.KvRow.get_for_update(agent=agent_id, key=key)
            if row is None:
                return False
            row.delete()
        if self.on_change is not None:
            self.on_change(agent_id, key, None, True, origin)
        return True
