"""Settings other daemons change, followed on a shared database.

A few settings live in the database but are also held in memory for speed: custom models
(in the catalog), provider URL overrides and the monthly budget limit and alert levels. On the embedded
SQLite database one daemon writes them, so memory is always current. When several daemons
share PostgreSQL, a change made through one must reach the others: this follower re-reads
those settings every `interval` seconds (one small query) and applies what changed.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pony import orm

from agentd.store import Store
from agentd.store.outage import translate

log = logging.getLogger("agentd.settings")

FOLLOWED = ("custom_models", "provider_urls", "budget_limit_usd", "budget_alert_levels")


class SettingsFollower:
    """Polls the followed settings and applies changes made by other daemons."""

    def __init__(self, store: Store, custom_models: Any, url_overrides: dict[str, str], metering: Any,
                 interval: float = 1.0) -> None:
        self.store = store
        self.custom_models = custom_models
        self.url_overrides = url_overrides
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
        with orm.db_session:
            rows = {s.key: s.value for s in orm.select(s for s in self.store.e.Setting if s.key in FOLLOWED)}
        self.custom_models.follow(rows.get("custom_models") or [])
        urls = rows.get("provider_urls") or {}
        if urls != self.url_overrides:
            # Replace in place: the agent manager holds this very dict.
            for name in list(self.url_overrides):
                if name not in urls:
                    del self.url_overrides[name]
            self.url_overrides.update(urls)
        self.metering.follow_limit(float(rows.get("budget_limit_usd") or 0.0), rows.get("budget_alert_levels"))
