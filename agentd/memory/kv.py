"""Per-agent key-value memory persisted in the store. One agent never sees another's keys."""

from __future__ import annotations

from typing import Any, Callable

from pony import orm

from agentd.timestamps import utcnow
from agentd.store import Store

MAX_KEY_LENGTH = 256


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
        with orm.db_session:
            row = self.store.e.KvRow.get(agent=agent_id, key=key)
            return (False, None) if row is None else (True, row.value)

    def set(self, agent_id: str, key: str, value: Any, origin: str = "") -> None:
        with orm.db_session:
            row = self.store.e.KvRow.get(agent=agent_id, key=key)
            if row is None:
                self.store.e.KvRow(agent=agent_id, key=key, value=value, updated_at=utcnow())
                changed = True
            else:
                changed = row.value != value
                row.value = value
                row.updated_at = utcnow()
        if changed and self.on_change is not None:
            self.on_change(agent_id, key, value, False, origin)

    def delete(self, agent_id: str, key: str, origin: str = "") -> bool:
        with orm.db_session:
            row = self.store.e.KvRow.get(agent=agent_id, key=key)
            if row is None:
                return False
            row.delete()
        if self.on_change is not None:
            self.on_change(agent_id, key, None, True, origin)
        return True
