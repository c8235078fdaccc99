"""What each scoped API key spent today and this month (UTC), and the refusal of its runs
once it has spent its budget.

Spend is summed from the usage rows the key paid for, so every daemon sharing the
database sees the same spend and enforces the same budget.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from pony import orm

from agentd.errors import TooManyRequests
from agentd.metering import month_bounds
from agentd.money import format_usd
from agentd.store import Store
from agentd.timestamps import utcnow


def day_bounds(now: datetime) -> tuple[datetime, datetime]:
    start = datetime(now.year, now.month, now.day, tzinfo=timezone.utc)
    return start, start + timedelta(days=1)


class KeyBudgets:
    """Spend per key and the daily and monthly budget check made before each of its runs."""

    def __init__(self, store: Store, audit: Callable[[str, str, dict[str, Any]], None],
                 now: Callable[[], datetime] = utcnow) -> None:
        self.store = store
        self.audit = audit
        self._now = now

    def _sum(self, key_id: str, start: datetime, end: datetime) -> float:
        with orm.db_session:
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
        with orm.db_session:
            row = self.store.e.ApiKeyRow.get(id=key_id)
            if row is None:
                return
            name, per_day, per_month = row.name, row.budget_usd_per_day, row.budget_usd_per_month
        now = self._now()
        # The month first: when both are spent, the refusal holds until the month's end.
        for limit, (start, end), period in ((per_month, month_bounds(now), "this month"),
                                            (per_day, day_bounds(now), "today")):
            if limit is None:
                continue
            spent = self._sum(key_id, start, end)
            if spent >= limit:
                self.audit("key.refused", name, {"key_id": key_id, "reason": "budget", "period": period})
                raise TooManyRequests(
                    f"message delivery failed: quota exceeded: API key '{name}' is over its budget: {format_usd(spent)} of "
                    f"{format_usd(limit)} spent {period}",
                    retry_after=max(1, math.ceil((end - now).total_seconds())), code="key_budget_exceeded")
