"""Budget admission from the database: N daemons cannot overspend the monthly limit.

`Metering.check_budget` refuses a run once this month's spend has reached the limit.
Runs admitted at the same moment on different daemons would all see the same total and
all go ahead. So when a run starts, under one database-wide lock (a PostgreSQL
transaction-level advisory lock; SQLite's write transaction on one daemon), the gate
reads the limit and the month's spend from the database, adds what the runs in flight
have *reserved*, and admits the run only while that sum is under the limit. An admitted
run reserves an estimate of its cost: the largest run this agent completed this month
(else the largest of any agent; 0 when nothing has been spent yet). The reservation is
released when the run ends (its real cost is then in `usage`).

The result: parallel runs on any number of daemons are admitted as if they had arrived
one after another on one daemon, which may cross the limit by at most the one run that
was admitted while the spend was still under it.

A scoped API key's daily and monthly budgets are admitted the same way, under a lock of
the key's own (`KeyBudgets.admit`): the run record names the key, and the key's spend
plus what its runs in flight reserved must be under its budget.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from agentd.errors import TooManyRequests
from agentd.key_budgets import KeyBudgets
from agentd.metering import Metering, _naive, month_bounds
from agentd.money import format_usd
from agentd.store.leases import global_lock

BUDGET_LOCK = "agentd:budget"


class BudgetGate:
    """admit() runs inside the db_session that starts a run record."""

    def __init__(self, metering: Metering, keys: KeyBudgets | None = None) -> None:
        self.metering = metering
        self.store = metering.store
        self.keys = keys

    def applies(self, key_id: str = "") -> bool:
        """Whether a run (paid by `key_id`, when a scoped key) has a budget to be admitted
        against: the daemon's monthly limit, or the key's own."""
        return self.metering.limit_usd > 0 or bool(key_id and self.keys is not None and self.keys.budgeted(key_id))

    def limit(self) -> float:
        """The limit as stored (another daemon may have changed it)."""
        return float(self.store.get_setting("budget_limit_usd", 0.0) or 0.0)

    def admit(self, agent_id: str, key_id: str = "") -> float:
        """Inside a db_session: refuse (429) or return the amount to reserve for the run."""
        keyed = bool(key_id and self.keys is not None and self.keys.admit(key_id))
        limit = self.limit_in_session()
        now = self.metering._now()
        start, end = month_bounds(now)
        if limit <= 0:
            return self._estimate(agent_id, start.timestamp()) if keyed else 0.0
        global_lock(self.store, BUDGET_LOCK)
        db = self.store.db
        spent = float(db.select("SELECT COALESCE(SUM(cost_usd), 0) FROM usage WHERE at >= $s AND at < $e",
                                {"s": _naive(start), "e": _naive(end)})[0])
        reserved = float(db.select("SELECT COALESCE(SUM(reserve_usd), 0) FROM agent_runs "
                                   "WHERE status = 'running' AND lease_expires >= $now",
                                   {"now": time.time()})[0])
        if spent + reserved >= limit:
            held = f" (+ {format_usd(reserved)} reserved by runs in flight)" if reserved > 0 else ""
            raise TooManyRequests(
                f"message delivery failed: quota exceeded: monthly budget reached: {format_usd(spent)}{held} of {format_usd(limit)} "
                "spent this month", retry_after=max(1, math.ceil((end - now).total_seconds())))
        return self._estimate(agent_id, start.timestamp())

    def limit_in_session(self) -> float:
        """The stored limit, read inside the caller's db_session (once per run: a plain
        SELECT, not a Pony entity load)."""
        rows = self.store.db.select("SELECT value FROM settings WHERE key = $k", {"k": "budget_limit_usd"})
        value: Any = rows[0] if rows else None
        if isinstance(value, str):  # SQLite keeps the JSON text; PostgreSQL's driver decodes it
            value = json.loads(value)
        return float(value or 0.0)

    def _estimate(self, agent_id: str, since: float) -> float:
        db = self.store.db
        own = db.select("SELECT MAX(cost_usd) FROM agent_runs WHERE agent_id = $a AND status = 'completed' "
                        "AND started_at >= $t", {"a": agent_id, "t": since})[0]
        if own:
            return float(own)
        anyone = db.select("SELECT MAX(cost_usd) FROM agent_runs WHERE status = 'completed' AND started_at >= $t",
                           {"t": since})[0]
        return float(anyone or 0.0)
