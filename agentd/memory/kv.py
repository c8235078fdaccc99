"""Per-agent key-value memory persisted in the store. One agent never sees another's keys."""

from __future__ import annotations

from typing import Any

from pony import orm

from agentd.timestamps import utcnow
from agentd.store import Store

MAX_KEY_LENGTH = 256


class KvMemory:
    """Key-value operations scoped by agent id."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def all(self, agent_id: str) -> dict[str, Any]:
        with orm.db_session:
            rows = orm.select(r for r in self.store.e.KvRow if r.agent.id == agent_id)
            return {r.key: r.value for r in rows.order_by(lambda r: r.key)}

    def get(self, agent_id: str, key: str) -> tuple[bool, Any]:
        """(found, value)."""
        with orm.db_session:
            row = self.store.e.KvRow.get(agent=agent_id, key=key)
            return (False, None) if row is None else (True, row.value)

    def set(self, agent_id: str, key: str, value: Any) -> None:
        with orm.db_session:
            row = self.store.e.KvRow.get(agent=agent_id, key=key)
            if row is None:
                self.store.e.KvRow(agent=agent_id, key=key, value=value, updated_at=utcnow())
            else:
                row.value = value
                row.updated_at = utcnow()

    def delete(self, agent_id: str, key: str) -> bool:
        with orm.db_session:
            row = self.store.e.KvRow.get(agent=agent_id, key=key)
            if row is None:
                return False
            row.delete()
            return True
