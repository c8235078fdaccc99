"""What each scoped API key spent today and this month (UTC), and the refusal of its runs
once it has spent its budget.

Spend is summed from the usage rows the key paid for, so every daemon sharing the
database sees the same spend and enforces the same budget.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from pony import orm

from agentd.errors import TooManyRequests
from agentd.metering import month_bounds
from agentd.money import format_usd
from agentd.store import Store
from agentd.store.leases import global_lock
from agentd.timestamps import utcnow


def day_bounds(now: datetime) -> tuple[datetime, datetime]:
    start = datetime(now.year, now.month, now.day, tzinfo=timezone.utc)
    return start, start + timedelta(days=1)


class KeyOverBudget(TooManyRequests):
    """A key's run refused for its budget; `record()` audits it, once the refused transaction
    is over (an entry written inside it would be rolled back with it)."""

    def __init__(self, message: str, retry_after: float, record: Callable[[], None]) -> None:
        super().__init__(message, retry_after=retry_after, code="key_budget_exceeded")
        self.record = record


class KeyBudgets:
    """Spend per key and the daily and monthly budget check made before each of its runs."""

    def __init__(self, store: Store, audit: Callable[[str, str, dict[str, Any]], None],
                 now: Callable[[], datetime] = utcnow) -> None:
        self.store = store
        self.audit = audit
        self._now = now

    def _sum(self, key_id: str, start: datetime, end: datetime) -> float:
        with orm.db_session:  # (inside the caller's, when it has one)
            return float(self.store.db.select(
                "SELECT COALESCE(SUM(cost_usd), 0) FROM usage WHERE key_id = $k AND at >= $s AND at < $e",
                {"k": key_id, "s": start, "e": end})[0])

    def spend(self, key_id: str) -> tuple[float, float]:
        """(today's, this month's) spend of a key, UTC, as every daemon recorded it."""
        now = self._now()
        return self._sum(key_id, *day_bounds(now)), self._sum(key_id, *month_bounds(now))

    def check_budget(self, key_id: str) -> None:
        """429 with Retry-After to the period's end when the key spent its day's or month's budget."""
        if not key_id:
            return
        try:
            with orm.db_session:
                self._check(key_id)
        except KeyOverBudget as refused:
            refused.record()
            raise

    def budgeted(self, key_id: str) -> bool:
        """Whether the key has a daily or monthly budget."""
        with orm.db_session:
            row = self.store.e.ApiKeyRow.get(id=key_id)
            return row is not None and (row.budget_usd_per_day is not None or row.budget_usd_per_month is not None)

    def admit(self, key_id: str) -> bool:
        """Inside the db_session that starts a run of the key: check its budget counting what
        its runs in flight reserved, under a database-wide lock of the key's own, so parallel
        runs on any number of daemons are admitted one after another (429 when spent). False
        when the key has no budget (nothing to reserve for it)."""
        global_lock(self.store, f"agentd:key-budget:{key_id}")
        reserved = float(self.store.db.select(
            "SELECT COALESCE(SUM(reserve_usd), 0) FROM agent_runs WHERE key_id = $k AND status = 'running' "
            "AND lease_expires >= $now", {"k": key_id, "now": time.time()})[0])
        return self._check(key_id, reserved)

    def _check(self, key_id: str, reserved: float = 0.0) -> bool:
        """Inside a db_session: 429 when the key's spend (plus `reserved`) reached a budget;
        whether it has one."""
        row = self.store.e.ApiKeyRow.get(id=key_id)
        if row is None or (row.budget_usd_per_day is None and row.budget_usd_per_month is None):
            return False
        name, per_day, per_month = row.name, row.budget_usd_per_day, row.budget_usd_per_month
        now = self._now()
        # The month first: when both are spent, the refusal holds until the month's end.
        for limit, (start, end), period in ((per_month, month_bounds(now), "this month"),
                                            (per_day, day_bounds(now), "today")):
            if limit is None:
                continue
            spent = self._sum(key_id, start, end)
            if spent + reserved >= limit:
                held = f" (+ {format_usd(reserved)} reserved by runs in flight)" if reserved > 0 else ""
                detail = {"key_id": key_id, "reason": "budget", "period": period}
                raise KeyOverBudget(
                    f"message delivery failed: quota exceeded: API key '{name}' is over its budget: "
                    f"{format_usd(spent)}{held} of {format_usd(limit)} spent {period}",
                    max(1, math.ceil((end - now).total_seconds())),
                    lambda: self.audit("key.refused", name, detail))
        return True
