"""Trigger rows and the counters every firing is admitted against.

Admission (`admit`), its undoing (`refund`) and cost (`add_cost`) update the trigger's row
under a row lock (`SELECT ... FOR UPDATE` on PostgreSQL; one writer at a time on SQLite), so
the per-minute rate limit and the daily caps hold across every daemon sharing the database.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable

from pony import orm

from agentd.errors import NotFound
from agentd.store import Store
from agentd.timestamps import iso, utcnow

# The row lock is what serialises writers here; Pony's optimistic checks would only repeat it.
_write = orm.db_session(optimistic=False)
CAP_REASONS = ("max_runs_per_day", "max_cost_usd_per_day")

Audit = Callable[[str, str, dict[str, Any]], None]


@dataclass(frozen=True)
class Trigger:
    """What evaluating an event needs of a trigger (a snapshot of its row)."""

    id: str
    agent_id: str
    pattern: dict[str, Any]
    prompt_template: str
    key_id: str | None = None  # the scoped API key its runs act as (None: the admin's)


@dataclass(frozen=True)
class Admission:
    """One firing counted against its trigger (`admitted`), or why it was not (`why`)."""

    admitted: bool
    why: str = ""
    at: datetime | None = None  # when it was counted
    before: datetime | None = None  # the trigger's last_fired_at until then
    paused: str | None = None  # the pause its counting reached, audited once its run started


def _naive(dt: datetime | None) -> datetime | None:
    return dt.replace(tzinfo=None) if dt is not None and dt.tzinfo is not None else dt


def _money(value: float) -> str:
    return f"${value:.6f}".rstrip("0").rstrip(".")


class TriggerStore:
    def __init__(self, store: Store, audit: Audit | None = None) -> None:
        self.store = store
        self.audit = audit
        self._lock = threading.Lock()  # one admission at a time in this daemon (SQLite has no row locks)

    # -- reading -------------------------------------------------------------------
    @staticmethod
    def _json(row: Any) -> dict[str, Any]:
        return {
            "id": row.id,
            "trigger_id": row.id,
            "agent_id": row.agent_id,
            "pattern": json.loads(row.pattern),
            "prompt_template": row.prompt_template,
            "enabled": row.enabled,
            "source": row.source,
            "max_runs_per_day": row.max_runs_per_day,
            "max_cost_usd_per_day": row.max_cost_usd_per_day,
            "rate_limit_per_minute": row.rate_limit_per_minute,
            "paused": _pause(row) is not None,
            "paused_reason": _pause(row),
            "runs_today": row.runs_today if row.day == _today() else 0,
            "cost_today_usd": round(row.cost_today, 10) if row.day == _today() else 0.0,
            "fire_count": row.fire_count,
            "last_fired_at": iso(row.last_fired_at) if row.last_fired_at else None,
            "key_id": row.key_id,
            "created_at": iso(row.created_at),
        }

    def _whole(self, query: Any) -> Any:
        """`query` reading the two text columns in the same query: they are lazy, and a second
        query for them finds nothing once a concurrent delete has removed the row."""
        rows = self.store.e.TriggerRow
        return query.prefetch(rows.pattern, rows.prompt_template)

    def list(self, agent_id: str | None = None) -> list[dict[str, Any]]:
        with orm.db_session:
            query = self.store.e.TriggerRow.select()
            if agent_id is not None:
                query = query.filter(lambda t: t.agent_id == agent_id)
            return [self._json(r) for r in self._whole(query.order_by(lambda t: (t.created_at, t.id)))]

    def get(self, trigger_id: str) -> dict[str, Any] | None:
        with orm.db_session:
            found = self._whole(orm.select(t for t in self.store.e.TriggerRow if t.id == trigger_id))[:1]
            return self._json(found[0]) if found else None

    def candidates(self, kind: str) -> list[Trigger]:
        """Enabled, unpaused triggers whose pattern is of `kind` (patterns.KINDS' keys); a
        pause for a daily cap of an earlier day is over (`admit` clears it)."""
        with orm.db_session:
            rows = self._whole(orm.select(t for t in self.store.e.TriggerRow
                                          if t.kind == kind and t.enabled))
            return [Trigger(r.id, r.agent_id, json.loads(r.pattern), r.prompt_template, r.key_id) for r in rows
                    if _pause(r) is None]

    # -- writing -------------------------------------------------------------------
    def create(self, agent_id: str, kind: str, pattern: dict[str, Any], prompt_template: str,
               enabled: bool = True, max_runs_per_day: int | None = None,
               max_cost_usd_per_day: float | None = None, rate_limit_per_minute: int | None = None,
               source: str = "api", key_id: str | None = None) -> dict[str, Any]:
        with _write:
            # The agent's row is locked first, as its deletion locks it first: a trigger
            # created while the agent is deleted finds no agent rather than outliving it.
            if self.store.e.AgentRow.get_for_update(id=agent_id) is None:
                raise NotFound("agent not found")
            row = self.store.e.TriggerRow(
                id=str(uuid.uuid4()), agent_id=agent_id, kind=kind, pattern=json.dumps(pattern, ensure_ascii=False),
                prompt_template=prompt_template, enabled=enabled, source=source,
                max_runs_per_day=max_runs_per_day, max_cost_usd_per_day=max_cost_usd_per_day,
                rate_limit_per_minute=rate_limit_per_minute, created_at=_now(), key_id=key_id or None)
            orm.flush()
            return self._json(row)

    def update(self, trigger_id: str, changes: dict[str, Any]) -> dict[str, Any] | None:
        """Apply `changes` (enabled, caps, rate limit, prompt_template); enabling a paused
        trigger resumes it."""
        with _write:
            row = self.store.e.TriggerRow.get_for_update(id=trigger_id)
            if row is None:
                return None
            for key, value in changes.items():
                setattr(row, key, value)
            if changes.get("enabled") is True:
                row.paused_reason = None
            return self._json(row)

    def delete(self, trigger_id: str) -> bool:
        """True for the one caller that deleted the trigger (of two at once, the other gets False)."""
        with _write:
            return self.store.db.execute("DELETE FROM triggers WHERE id = $t", {"t": trigger_id}).rowcount == 1

    def delete_for_agent(self, agent_id: str, source: str | None = None) -> int:
        with _write:
            query = orm.select(t for t in self.store.e.TriggerRow if t.agent_id == agent_id)
            if source is not None:
                query = query.filter(lambda t: t.source == source)
            return query.delete(bulk=True)

    # -- firing --------------------------------------------------------------------
    def admit(self, trigger_id: str, default_rate: int) -> Admission:
        """Count one firing if the trigger may fire now. Reaching `max_runs_per_day` pauses
        the trigger for the rest of the UTC day; that pause is audited by `started`, as a
        firing whose run is then refused is undone by `refund`."""
        now = _now()
        paused = None
        admission = Admission(False)
        with self._lock, _write:
            row = self.store.e.TriggerRow.get_for_update(id=trigger_id)
            if row is None:
                return Admission(False, "deleted")
            self._roll_day(row, now)
            agent_id = row.agent_id
            limit = row.rate_limit_per_minute or default_rate
            start = _naive(row.window_start)
            if not row.enabled:
                admission = Admission(False, "disabled")
            elif row.paused_reason is not None:
                admission = Admission(False, row.paused_reason)
            elif row.max_runs_per_day is not None and row.runs_today >= row.max_runs_per_day:
                paused = row.paused_reason = self._runs_reason(row)
                admission = Admission(False, paused)
            elif row.max_cost_usd_per_day is not None and row.cost_today >= row.max_cost_usd_per_day:
                paused = row.paused_reason = self._cost_reason(row)
                admission = Admission(False, paused)
            elif start is not None and timedelta(0) <= now - start < timedelta(minutes=1) and row.window_count >= limit:
                admission = Admission(False, f"rate limit: {limit} run(s) per minute")
            else:
                if start is None or not timedelta(0) <= now - start < timedelta(minutes=1):
                    row.window_start, row.window_count = now, 0
                before = _naive(row.last_fired_at)
                row.window_count += 1
                row.runs_today += 1
                row.fire_count += 1
                row.last_fired_at = now
                reached = None
                if row.max_runs_per_day is not None and row.runs_today >= row.max_runs_per_day:
                    reached = row.paused_reason = self._runs_reason(row)
                admission = Admission(True, "", now, before, reached)
        if paused is not None:
            self._audit_pause(trigger_id, agent_id, paused)
        return admission

    def started(self, trigger_id: str, agent_id: str, admission: Admission) -> None:
        """The admitted firing's run started: audit the pause its counting reached."""
        if admission.paused is not None:
            self._audit_pause(trigger_id, agent_id, admission.paused)

    def refund(self, trigger_id: str, admission: Admission) -> None:
        """Undo an admitted firing whose run was refused: it does not count towards the
        rate limit, the day's runs or `fire_count`, and lifts the pause it reached. The
        row's counters are decremented rather than restored, so firings other daemons
        counted meanwhile still count."""
        at = admission.at
        if at is None:
            return  # not admitted: nothing was counted
        with self._lock, _write:
            row = self.store.e.TriggerRow.get_for_update(id=trigger_id)
            if row is None:
                return
            if row.day == at.date().isoformat():
                row.runs_today = max(row.runs_today - 1, 0)
                if row.paused_reason is not None and row.paused_reason.startswith(CAP_REASONS[0]) \
                        and row.max_runs_per_day is not None and row.runs_today < row.max_runs_per_day:
                    row.paused_reason = None
            start = _naive(row.window_start)
            if start is not None and start <= at:
                row.window_count = max(row.window_count - 1, 0)
            row.fire_count = max(row.fire_count - 1, 0)
            if _naive(row.last_fired_at) == at:
                row.last_fired_at = admission.before

    def add_cost(self, trigger_id: str, cost: float) -> None:
        """Add a run's cost to the day's; reaching `max_cost_usd_per_day` pauses the trigger."""
        paused = None
        with self._lock, _write:
            row = self.store.e.TriggerRow.get_for_update(id=trigger_id)
            if row is None:
                return
            self._roll_day(row, _now())
            row.cost_today += cost
            if (row.max_cost_usd_per_day is not None and row.cost_today >= row.max_cost_usd_per_day
                    and row.paused_reason is None):
                paused = row.paused_reason = self._cost_reason(row)
            agent_id = row.agent_id
        if paused is not None:
            self._audit_pause(trigger_id, agent_id, paused)

    @staticmethod
    def _roll_day(row: Any, now: datetime) -> None:
        """A new UTC day: the counters start over and a pause for a daily cap ends."""
        today = now.date().isoformat()
        if row.day != today:
            row.day, row.runs_today, row.cost_today = today, 0, 0.0
            if row.paused_reason is not None and row.paused_reason.startswith(CAP_REASONS):
                row.paused_reason = None

    @staticmethod
    def _runs_reason(row: Any) -> str:
        return (f"max_runs_per_day reached: {row.runs_today} of {row.max_runs_per_day} run(s) today "
                "(resumes at 00:00 UTC)")

    @staticmethod
    def _cost_reason(row: Any) -> str:
        return (f"max_cost_usd_per_day reached: {_money(row.cost_today)} of {_money(row.max_cost_usd_per_day)} "
                "today (resumes at 00:00 UTC)")

    def _audit_pause(self, trigger_id: str, agent_id: str, reason: str) -> None:
        if self.audit is not None:
            self.audit("trigger.paused", trigger_id, {"trigger_id": trigger_id, "agent_id": agent_id,
                                                      "reason": reason})


def _pause(row: Any) -> str | None:
    """The row's pause as of now: one for a daily cap ends with its UTC day, before the row
    itself is rolled over by the next admission."""
    reason = row.paused_reason
    if reason is not None and reason.startswith(CAP_REASONS) and row.day != _today():
        return None
    return reason


def _today() -> str:
    return _now().date().isoformat()


def _now() -> datetime:
    """Now in UTC, naive: the window arithmetic compares it with `_naive` stored times (the
    store takes either form and hands back aware UTC)."""
    return utcnow().replace(tzinfo=None)
