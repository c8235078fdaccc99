"""The `[cluster]` table of config.toml: this daemon's id among the daemons sharing one
database, and how long its leases last (see agentd/cluster/__init__.py)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from agentd.errors import ConfigError


@dataclass
class ClusterSettings:
    daemon_id: str
    lease_secs: float = 10.0

    @property
    def heartbeat_secs(self) -> float:
        return max(0.2, self.lease_secs / 3)


def cluster_settings(raw: Any, listen: str) -> ClusterSettings:
    """The `[cluster]` table of config.toml (validated)."""
    table = raw.get("cluster", {}) if isinstance(raw, dict) else {}
    if not isinstance(table, dict):
        raise ConfigError("config key cluster: must be a table")
    daemon_id = table.get("daemon_id", "")
    if not isinstance(daemon_id, str) or len(daemon_id) > 100:
        raise ConfigError("config key cluster.daemon_id: must be a string of at most 100 characters")
    if not daemon_id:
        daemon_id = f"{socket.gethostname()}:{listen.rsplit(':', 1)[-1]}"
    lease = table.get("lease_secs", 10.0)
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 1 <= lease <= 3600:
        raise ConfigError("config key cluster.lease_secs: must be a number between 1 and 3600")
    return ClusterSettings(daemon_id=daemon_id, lease_secs=float(lease))
