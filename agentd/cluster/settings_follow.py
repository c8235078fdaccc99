"""Settings other daemons change, followed on a shared database.

A few settings live in the database but are also held in memory for speed: custom models
(in the catalog), provider URL overrides and the monthly budget limit and alert levels. On the embedded
SQLite database one daemon writes them, so memory is always current. When several daemons
share PostgreSQL, a change made through one must reach the others: this follower asks each
owner to re-read its settings every `interval` seconds. Each owner reads under the lock its
own writes hold, so a read that raced a local write cannot undo it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pony import orm

from agentd.store import Store
from agentd.store.outage import translate

log = logging.getLogger("agentd.settings")


class SettingsFollower:
    """Polls the followed settings and applies changes made by other daemons."""

    def __init__(self, store: Store, custom_models: Any, providers: Any, metering: Any,
                 interval: float = 1.0) -> None:
        self.store = store
        self.custom_models = custom_models
        self.providers = providers
        self.metering = metering
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="agentd-settings", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll_once()
            except Exception as exc:  # noqa: BLE001 - a lost connection must not end the follower
                if translate(exc) is None:  # an outage is logged once, by the store
                    log.warning("cannot read shared settings; retrying", exc_info=True)

    def poll_once(self) -> None:
        """Read the followed settings once and apply them."""
        self.custom_models.follow()
        self.providers.follow_urls()
        with orm.db_session:
            limit = self.store.get_setting("budget_limit_usd")
            levels = self.store.get_setting("budget_alert_levels")
        self.metering.follow_limit(float(limit or 0.0), levels)
