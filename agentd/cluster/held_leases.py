"""Leases a daemon keeps while it runs something only one daemon may run (a channel's
adapter: `channel:<name>`, agentd/channels/leaders.py), renewed every heartbeat and handed
back at once when the daemon stops, so a standby takes over without waiting them out."""

from __future__ import annotations

import logging
import threading

from agentd.cluster.config import ClusterSettings
from agentd.store.leases import Lease, Leases
from agentd.store.outage import translate

log = logging.getLogger("agentd.cluster")


class HeldLeases:
    """The named leases this daemon holds, other than its runs'."""

    def __init__(self, leases: Leases, settings: ClusterSettings) -> None:
        self.leases = leases
        self.settings = settings
        self._held: dict[str, Lease] = {}
        self._lock = threading.Lock()

    def claim(self, name: str) -> bool:
        """Take (or keep) a lease renewed by the heartbeat; True when this daemon holds it."""
        with self._lock:
            if name in self._held:
                return True
        lease = self.leases.acquire(name, self.settings.lease_secs)
        if lease is None:
            return False
        with self._lock:
            self._held[name] = lease
        return True

    def holds(self, name: str) -> bool:
        with self._lock:
            return name in self._held

    def release(self, name: str) -> None:
        with self._lock:
            lease = self._held.pop(name, None)
        if lease is not None:
            try:
                self.leases.release(lease)
            except Exception as exc:  # noqa: BLE001 - only the database's outage is expected
                if translate(exc) is None:
                    raise
                # Held no more here; the lease runs out by itself and another daemon takes it.

    def holder(self, name: str) -> str | None:
        return self.leases.holder(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def renew(self) -> None:
        """Renew every lease held; one another daemon took meanwhile is held no more."""
        with self._lock:
            held = list(self._held.items())
        for name, lease in held:
            if not self.leases.renew(lease, self.settings.lease_secs):
                with self._lock:
                    # Released and claimed again meanwhile (a channel reconfigured): the
                    # new lease is held, only the old one is gone.
                    if self._held.get(name) is not lease:
                        continue
                    del self._held[name]
                log.warning("lease %s lost", name)

    def release_all(self) -> None:
        """Hand every lease back (best effort: the daemon is on its way out)."""
        with self._lock:
            held = list(self._held.values())
            self._held.clear()
        for lease in held:
            try:
                self.leases.release(lease)
            except Exception:  # noqa: BLE001 - best effort on the way out
                log.debug("lease %s not released", lease.name)
