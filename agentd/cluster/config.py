"""The `[cluster]` table of config.toml: this daemon's id among the daemons sharing one
database, how long its leases last (see agentd/cluster/run_leases.py) and the URL the other
daemons reach it at (agentd/cluster/relay.py)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agentd.errors import ConfigError


@dataclass
class ClusterSettings:
    daemon_id: str
    lease_secs: float = 10.0
    advertise_url: str = ""

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
    url = table.get("advertise_url", "")
    if not isinstance(url, str) or len(url) > 300 or (url and not _is_base_url(url)):
        raise ConfigError("config key cluster.advertise_url: must be the http:// or https:// URL other "
                          "daemons reach this one at (like http://10.0.0.5:4200), without query or fragment")
    return ClusterSettings(daemon_id=daemon_id, lease_secs=float(lease),
                           advertise_url=url.rstrip("/") or derived_url(listen))


def _is_base_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query and not parts.fragment


def derived_url(listen: str) -> str:
    """The URL of the listen address: its host, or this machine's name when it listens on
    every interface (a name the other daemons must resolve; else set advertise_url)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
