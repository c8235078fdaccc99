"""Usage metering and the monthly budget.

Every model call is a `UsageRow` (agent, provider, model, tokens, cost, time).
Reports are SQL aggregates over the period, so they stay exact however many
agents spend at once. The budget is enforced before each run from an in-memory
running total that is rebuilt from the database at start and at each new month.
"""

from __future__ import annotations

import calendar
import math
import threading
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Callable

from pony import orm

from agentd.errors import TooManyRequests
from agentd.timestamps import iso, utcnow
from agentd.llm.catalog import Catalog
from agentd.money import format_usd
from agentd.store import Store

if TYPE_CHECKING:
    from agentd.store.writer import Tx

# Fractions of the limit at which an alert fires, unless PUT /api/budget set others.
DEFAULT_ALERT_LEVELS = (0.8, 1.0)
MAX_ALERT_LEVELS = 10
_EXHAUSTED = "budget exhausted: {spent} of {limit} spent; new agent runs are refused until the period ends"
_REACHED = "{percent}% of the monthly budget is spent: {spent} of {limit}"


def alert_levels(levels: Any) -> list[float]:
    """The stored alert levels, or the default when none are stored."""
    return sorted({float(x) for x in levels}) if levels else list(DEFAULT_ALERT_LEVELS)


def _alert(fraction: float) -> tuple[str, str]:
    """The level name and message template of an alert at `fraction` of the limit."""
    if fraction >= 1.0:
        return "critical", _EXHAUSTED
    return "warning", _REACHED.replace("{percent}", f"{fraction * 100:g}")


_USAGE_COLUMNS = ("agent_id", "agent_name", "provider", "model", "input_tokens", "output_tokens",
                  "cost_usd", "priced", "at", "key_id")
# Pony binds `$name` from the locals mapping passed to execute().
_INSERT_USAGE = (f"INSERT INTO usage ({', '.join(_USAGE_COLUMNS)}) "
                 f"VALUES ({', '.join('$' + c for c in _USAGE_COLUMNS)})")


def month_bounds(now: datetime) -> tuple[datetime, datetime]:
    """Start and end (exclusive) of the calendar month holding `now`, UTC."""
    start = datetime(now.year, now.month, 1, tzinfo=timezone.utc)
    days = calendar.monthrange(now.year, now.month)[1]
    return start, start + timedelta(days=days)


def _naive(dt: datetime) -> datetime:
    # The database stores UTC wall time without an offset.
    return dt.astimezone(timezone.utc).replace(tzinfo=None) if dt.tzinfo else dt


class Metering:
    """Records model calls, reports usage and enforces the budget."""

    def __init__(self, store: Store, catalog: Catalog,
                 now: Callable[[], datetime] = utcnow, shared: bool = False, enabled: bool = True) -> None:
        self.store = store
        self.catalog = catalog
        self.enabled = enabled
        # The clock (UTC, aware); tests pass one they can move across a month end.
        self._now = now
        self._lock = threading.Lock()
        self._period_start, self._period_end = month_bounds(self._now())
        self._spent = self._sum_cost(self._period_start, self._period_end)
        # Read on every run and every model call: kept in memory, written through.
        self._limit = float(self.store.get_setting("budget_limit_usd") or 0.0)
        self._levels = alert_levels(self.store.get_setting("budget_alert_levels"))
        # Several daemons share the database: the totals and the limit are read from it on
        # every check, since other daemons spend and set them too.
        self.shared = shared

    def _refresh(self, spend: bool = True) -> None:
        """Shared database: the limit, and this month's spend (always with `spend`, else only
        under a limit), as every daemon wrote them.

        A check without a limit needs no spend: summing the month's usage rows (twice per
        message, and more rows every day) was the largest query of a run on PostgreSQL."""
        if not self.shared:
            return
        limit = float(self.store.get_setting("budget_limit_usd") or 0.0)
        levels = alert_levels(self.store.get_setting("budget_alert_levels")) if spend else None
        spent = self._sum_cost(self._period_start, self._period_end) if spend or limit > 0 else None
        with self._lock:
            self._limit = limit
            if levels is not None:
                self._levels = levels
            if spent is not None:
                self._spent = spent

    # -- recording --------------------------------------------------------------
    def record(self, agent_id: str, agent_name: str, provider: str, model: str,
               input_tokens: int, output_tokens: int, defer: list[dict[str, Any]] | None = None) -> float | None:
        """Persist one call; returns its cost in USD (None when the model has no price).

        With `defer` (a list), the row is appended there instead of written: the caller
        writes it with `write_rows` in its own transaction (an agent run writes its usage
        together with its session, one commit per run). The running total and the budget
        see the call at once either way."""
        cost = self.catalog.cost_usd(model, input_tokens, output_tokens)
        if not self.enabled:
            return cost
        now = self._now()
        row = {"agent_id": agent_id, "agent_name": agent_name, "provider": provider, "model": model,
               "input_tokens": input_tokens, "output_tokens": output_tokens, "cost_usd": cost or 0.0,
               "priced": cost is not None, "at": _naive(now), "key_id": None}
        if defer is not None:
            defer.append(row)
        else:
            # One plain INSERT: this runs on every model call, and building a Pony entity
            # costs several times the statement itself.
            with orm.db_session:
                self.store.db.execute(_INSERT_USAGE, {}, row)
        with self._lock:
            self._roll(now)
            self._spent += cost or 0.0
            self._maybe_alert(self._spent, now)
        return cost

    def write_rows(self, tx: Tx, rows: list[dict[str, Any]]) -> None:
        """Insert rows `record(..., defer=...)` collected, in the write transaction `tx`."""
        for row in rows:
            tx.execute(_INSERT_USAGE, row)

    def _roll(self, now: datetime) -> None:
        if now >= self._period_end:
            self._period_start, self._period_end = month_bounds(now)
            self._spent = self._sum_cost(self._period_start, self._period_end)

    # -- budget -------------------------------------------------------------------
    @property
    def limit_usd(self) -> float:
        return self._limit

    @property
    def alert_levels(self) -> list[float]:
        return list(self._levels)

    def set_limit(self, limit_usd: float, levels: list[float] | None = None) -> None:
        """Set the monthly limit and, with `levels`, the fractions of it that raise an alert."""
        if levels is not None:
            levels = alert_levels(levels)
            self.store.set_setting("budget_alert_levels", levels)
        self.store.set_setting("budget_limit_usd", float(limit_usd))
        with self._lock:
            self._limit = float(limit_usd)
            if levels is not None:
                self._levels = levels
            self._maybe_alert(self._spent, self._now())

    def follow_limit(self, limit_usd: float, levels: Any = None) -> None:
        """Take over a limit (and alert levels) another daemon set on a shared database (no write back)."""
        with self._lock:
            self._limit = float(limit_usd)
            self._levels = alert_levels(levels)

    def _alerts_key(self) -> str:
        return f"budget_alerts:{self._period_start.date().isoformat()}"

    def _maybe_alert(self, after: float, now: datetime) -> None:
        # Alerts depend on the total after a call only; each level fires once per period.
        limit = self.limit_usd
        if limit <= 0:
            return
        alerts = self.store.get_setting(self._alerts_key()) or []
        seen = {float(a["threshold"]) for a in alerts}
        fired = False
        for fraction in self._levels:
            if after >= limit * fraction and fraction not in seen:
                level, message = _alert(fraction)
                alerts.append({"level": level, "threshold": fraction,
                               "message": message.format(spent=format_usd(after), limit=format_usd(limit)),
                               "limit_usd": limit, "at": iso(now)})
                seen.add(fraction)
                fired = True
        if not fired:
            return
        self.store.set_setting(self._alerts_key(), sorted(alerts, key=lambda a: a["threshold"]))

    def check_budget(self) -> None:
        """Refuse a new run when this month's spend has reached the limit (429)."""
        self._refresh(spend=False)
        limit = self.limit_usd
        if limit <= 0:
            return
        now = self._now()
        with self._lock:
            self._roll(now)
            spent = self._spent
            end = self._period_end
        if spent >= limit:
            raise TooManyRequests(
                f"message delivery failed: quota exceeded: monthly budget reached: {format_usd(spent)} of {format_usd(limit)} "
                "spent this month",
                retry_after=max(1, math.ceil((end - now).total_seconds())))

    def budget(self) -> dict[str, Any]:
        """GET /api/budget."""
        self._refresh()
        now = self._now()
        with self._lock:
            self._roll(now)
            start, end, spent = self._period_start, self._period_end, self._spent
        limit = self.limit_usd
        alerts = self.store.get_setting(f"budget_alerts:{start.date().isoformat()}") or []
        # Always numbers (no limit: limit_usd 0 and remaining_usd 0, as the original reports:
        # with a limit of 0 the max() below is 0); `limited` tells "no limit" apart from "exhausted".
        return {"limit_usd": limit, "spent_usd": round(spent, 10),
                "remaining_usd": round(max(0.0, limit - spent), 10),
                "limited": limit > 0, "alert_levels": self.alert_levels,
                "period_start": iso(start), "period_end": iso(end),
                "alerts": [a for a in alerts if limit > 0]}

    # -- reports ----------------------------------------------------------------------
    def _sum_cost(self, start: datetime, end: datetime) -> float:
        with orm.db_session:
            rows = self.store.db.select("SELECT COALESCE(SUM(cost_usd), 0) FROM usage WHERE at >= $s AND at < $e",
                                        {"s": _naive(start), "e": _naive(end)})
        return float(rows[0])

    def period(self, since: datetime | None, until: datetime | None) -> tuple[datetime, datetime]:
        """The report window: the current month unless `since`/`until` narrow it."""
        start, end = month_bounds(self._now())
        return since or start, until or end

    def totals(self, start: datetime, end: datetime, key_id: str | None = None) -> dict[str, Any]:
        """GET /api/usage (`key_id`: only the calls that scoped key paid for)."""
        where, params = self._window(start, end, key_id)
        with orm.db_session:
            row = self.store.db.select(
                "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), "
                f"COALESCE(SUM(cost_usd), 0), COUNT(*) FROM usage WHERE {where}", params)[0]
        return {"total_input_tokens": int(row[0]), "total_output_tokens": int(row[1]),
                "total_cost_usd": round(float(row[2]), 10), "requests": int(row[3]),
                "period_start": iso(start), "period_end": iso(end)}

    @staticmethod
    def _window(start: datetime, end: datetime, key_id: str | None) -> tuple[str, dict[str, Any]]:
        params: dict[str, Any] = {"s": _naive(start), "e": _naive(end)}
        where = "at >= $s AND at < $e"
        if key_id is not None:
            where += " AND key_id = $k"
            params["k"] = key_id
        return where, params

    def by_model(self, start: datetime, end: datetime, key_id: str | None = None) -> list[dict[str, Any]]:
        """GET /api/usage/by-model."""
        where, params = self._window(start, end, key_id)
        with orm.db_session:
            rows = self.store.db.select(
                "SELECT model, SUM(input_tokens), SUM(output_tokens), SUM(cost_usd), COUNT(*) FROM usage "
                f"WHERE {where} GROUP BY model ORDER BY SUM(cost_usd) DESC, model", params)
        return [{"model": r[0], "input_tokens": int(r[1]), "output_tokens": int(r[2]),
                 "cost_usd": round(float(r[3]), 10), "requests": int(r[4])} for r in rows]

    def by_key(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """Spend per scoped API key (calls no key paid for, the admin's included, are `key_id` null)."""
        with orm.db_session:
            rows = self.store.db.select(
                "SELECT u.key_id, MAX(k.name), SUM(u.cost_usd), SUM(u.input_tokens), SUM(u.output_tokens), "
                "COUNT(*) FROM usage u LEFT JOIN api_keys k ON k.id = u.key_id "
                "WHERE u.at >= $s AND u.at < $e GROUP BY u.key_id ORDER BY SUM(u.cost_usd) DESC",
                {"s": _naive(start), "e": _naive(end)})
        return [{"key_id": r[0], "key_name": r[1],
                 "spent_usd": round(float(r[2]), 10), "input_tokens": int(r[3]), "output_tokens": int(r[4]),
                 "requests": int(r[5])} for r in rows]

    def by_agent(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """GET /api/budget/agents."""
        with orm.db_session:
            rows = self.store.db.select(
                "SELECT agent_id, MAX(agent_name), SUM(cost_usd), SUM(input_tokens), SUM(output_tokens) "
                "FROM usage WHERE at >= $s AND at < $e GROUP BY agent_id ORDER BY SUM(cost_usd) DESC",
                {"s": _naive(start), "e": _naive(end)})
        return [{"agent_id": r[0], "agent_name": r[1], "spent_usd": round(float(r[2]), 10),
                 "input_tokens": int(r[3]), "output_tokens": int(r[4])} for r in rows]

    def by_day(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """Spend per UTC day in the window (days without calls are absent), oldest first."""
        with orm.db_session:
            # date() exists in SQLite and PostgreSQL alike.
            rows = self.store.db.select(
                "SELECT date(at), SUM(cost_usd), SUM(input_tokens), SUM(output_tokens), COUNT(*) FROM usage "
                "WHERE at >= $s AND at < $e GROUP BY date(at) ORDER BY date(at)",
                {"s": _naive(start), "e": _naive(end)})
        return [{"day": str(r[0])[:10], "cost_usd": round(float(r[1]), 10), "input_tokens": int(r[2]),
                 "output_tokens": int(r[3]), "requests": int(r[4])} for r in rows]
