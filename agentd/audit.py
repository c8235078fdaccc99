"""The kernel audit trail: a persisted, append-only list of what happened.

Channel events (configure, remove, start, stop, connection errors, refused senders,
inbound/outbound message ids: never message text), agent spawn/kill, what agents'
tools do beyond their workspace (`tool.*`) and daemon start/shutdown. `GET /api/audit/recent` reads it newest first.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any

from pony import orm

from agentd.store import Store
from agentd.store.outage import translate
from agentd.timestamps import iso, utcnow

log = logging.getLogger("agentd.audit")
KEEP = 10_000  # rows kept; older ones are pruned as new ones arrive
RECENT_MAX = 1000


class AuditLog:
    """Append and read audit entries (thread-safe; each call is its own transaction)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._writes = 0
        self._lock = threading.Lock()

    def record(self, event: str, subject: str = "", detail: dict[str, Any] | None = None) -> None:
        """Append one entry; a failure to write is logged, never raised to the caller."""
        try:
            with orm.db_session:
                self.store.e.AuditRow(at=utcnow(), event=event, subject=subject or "",
                                      detail=detail or {})
        except Exception as exc:  # noqa: BLE001 - auditing must not break what it observes
            unavailable = translate(exc)
            if unavailable is None:
                log.exception("cannot write audit entry %s", event)
            else:
                # The outage itself was logged once; a traceback per entry would only bury it.
                log.warning("audit entry %s %s not written: %s", event, subject, unavailable.message)
            return
        with self._lock:
            self._writes += 1
            prune = self._writes % 500 == 0
        if prune:
            self._prune()

    def _prune(self) -> None:
        with orm.db_session:
            newest = orm.max(a.id for a in self.store.e.AuditRow) or 0
            orm.delete(a for a in self.store.e.AuditRow if a.id <= newest - KEEP)

    def recent(self, limit: int = 50, prefix: str = "", subject: str = "",
               since: datetime | None = None, until: datetime | None = None) -> list[dict[str, Any]]:
        """Newest first; `prefix` filters by event name (e.g. "channel."), `subject` by what the
        event is about (an agent's name), `since`/`until` by time (inclusive, UTC)."""
        limit = max(1, min(int(limit), RECENT_MAX))
        with orm.db_session:
            query = self.store.e.AuditRow.select()
            if prefix:
                query = query.filter(lambda a: a.event.startswith(prefix))
            if subject:
                query = query.filter(lambda a: a.subject == subject)
            if since is not None:
                query = query.filter(lambda a: a.at >= since)
            if until is not None:
                query = query.filter(lambda a: a.at <= until)
            rows = query.order_by(orm.desc(self.store.e.AuditRow.id)).limit(limit)
            return [{"id": r.id, "timestamp": iso(r.at),
                     "event": r.event, "subject": r.subject, "detail": dict(r.detail or {})}
                    for r in rows]

