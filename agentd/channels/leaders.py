"""One daemon per channel adapter: a leader lease `channel:<name>` in the database.

With several daemons on one database, a bot token must be polled (or a webhook
served, a socket held) by exactly one of them. An adapter starts only on the daemon
that holds its lease; the holder renews it every heartbeat. The others are on
standby: each heartbeat they try to take the lease of every configured adapter that
is not running here, and start it when they get it. A leader that dies stops renewing,
so another daemon takes over within one lease period (`[cluster] lease_secs`) plus one
heartbeat; a leader that stops cleanly hands the lease back, so the takeover follows
at the next heartbeat.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from agentd.channels.runtime import ChannelManager
from agentd.cluster.coordinator import Cluster

log = logging.getLogger("agentd.channels.leader")
RETRY_FAILED_SECS = 60.0


def lease_name(channel: str) -> str:
    return f"channel:{channel}"


class ChannelLeaders:
    """Wires a ChannelManager to the cluster's leases."""

    def __init__(self, cluster: Cluster, channels: ChannelManager) -> None:
        self.cluster = cluster
        self.channels = channels
        channels.may_run = self.may_run
        channels.on_stopped = self.stopped
        self._failed: dict[str, float] = {}  # adapter -> when its last start here failed
        cluster.on_tick.append(self.tick)

    def may_run(self, name: str) -> bool:
        if self.cluster.claim(lease_name(name)):
            return True
        log.info("channel %s runs on daemon %s; this daemon is on standby", name,
                 self.cluster.holder(lease_name(name)))
        return False

    def stopped(self, name: str) -> None:
        self.cluster.release(lease_name(name))

    def tick(self) -> None:
        """Stop adapters whose lease was lost; start standby adapters whose lease is free."""
        if not self.cluster.shared:
            return  # one daemon: every lease is always ours, nothing to take over
        channels = self.channels
        with channels._lock:
            for name in list(channels.running):
                if not self.cluster.holds(lease_name(name)):
                    log.warning("channel %s: leader lease lost; stopping it here", name)
                    channels._stop(name, reason="leader lease lost")
            for name in list(channels.sections):
                if name in channels.running:
                    continue
                if time.monotonic() - self._failed.get(name, -RETRY_FAILED_SECS) < RETRY_FAILED_SECS:
                    continue  # it failed to start here a moment ago: do not flood the audit trail
                if self.cluster.holder(lease_name(name)) is not None:
                    continue  # a live leader elsewhere (cheap read before trying to write)
                if not self.cluster.claim(lease_name(name)):
                    # Taken meanwhile, or one that ran out during a database outage, kept
                    # for its owner for one lease after it: not a failed start, try again
                    # at the next heartbeat.
                    continue
                try:
                    started = channels._start(name)
                except BaseException:
                    self.cluster.release(lease_name(name))  # nothing runs under it here
                    raise
                if started:
                    self._failed.pop(name, None)
                    log.info("channel %s: took over as leader on daemon %s", name, self.cluster.id)
                    channels.audit("channel.leader", name, {"daemon_id": self.cluster.id})
                else:
                    self._failed[name] = time.monotonic()

    def holder(self, name: str) -> str | None:
        """The daemon running adapter `name` (its live lease), or None."""
        return self.cluster.holder(lease_name(name))

    def view(self) -> dict[str, Any]:
        """Which daemon leads each configured adapter."""
        return {name: self.cluster.holder(lease_name(name)) for name in sorted(self.channels.sections)}
