"""The daemons of a cluster: `cluster_daemons`, one row per daemon, and their shared key.

Each daemon writes its row when it starts (its listen address, pid and `[cluster]
advertise_url`, where the others relay webhooks to it: agentd/cluster/relay.py) and
renews its heartbeat time every heartbeat; a daemon counts as live while its heartbeat is
younger than one lease period. Rows a day old are pruned.
"""

from __future__ import annotations

import os
import secrets
import time
from typing import Any

from pony import orm

from agentd.cluster.config import ClusterSettings
from agentd.store import Store

PEER_SECRET = "cluster_peer_secret"  # the settings row holding the daemons' shared key
FORGET_SECS = 86400  # rows of daemons silent this long are deleted


class Members:
    """This daemon's row in `cluster_daemons` and its view of the others."""

    def __init__(self, store: Store, settings: ClusterSettings, listen: str) -> None:
        self.store = store
        self.settings = settings
        self.id = settings.daemon_id
        self.listen = listen
        self._peer_secret: bytes | None = None

    def beat(self, started: bool = False) -> None:
        """Renew this daemon's heartbeat; with `started`, (re)write its whole row."""
        now = time.time()
        with orm.db_session:
            self.store.db.execute(
                "INSERT INTO cluster_daemons (id, listen, pid, started_at, heartbeat_at, url) "
                "VALUES ($d, $l, $p, $now, $now, $u) "
                "ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at"
                + (", listen = excluded.listen, pid = excluded.pid, started_at = excluded.started_at, "
                   "url = excluded.url" if started else ""),
                {"d": self.id, "l": self.listen, "p": os.getpid(), "now": now, "u": self.settings.advertise_url})

    def leave(self) -> None:
        """Delete this daemon's row (it stops: the others see it gone at once)."""
        with orm.db_session:
            self.store.db.execute("DELETE FROM cluster_daemons WHERE id = $d", {"d": self.id})

    def prune(self) -> None:
        """Inside a db_session: forget daemons silent for a day."""
        self.store.db.execute("DELETE FROM cluster_daemons WHERE heartbeat_at < $t", {"t": time.time() - FORGET_SECS})

    def daemons(self) -> list[dict[str, Any]]:
        """Daemons that sent a heartbeat within the last lease period."""
        from agentd.store.leases import _iso

        with orm.db_session:
            rows = self.store.db.select("SELECT id, listen, pid, started_at, heartbeat_at, url FROM cluster_daemons "
                                        "WHERE heartbeat_at >= $t ORDER BY started_at",
                                        {"t": time.time() - self.settings.lease_secs})
        return [{"id": r[0], "listen": r[1], "url": r[5] or "", "pid": r[2], "started_at": _iso(r[3]),
                 "heartbeat_at": _iso(r[4]), "self": r[0] == self.id} for r in rows]

    def member_url(self, daemon_id: str) -> str | None:
        """The advertised URL of a live daemon (a heartbeat within one lease period), or None."""
        with orm.db_session:
            rows = self.store.db.select("SELECT url FROM cluster_daemons WHERE id = $d AND heartbeat_at >= $t",
                                        {"d": daemon_id, "t": time.time() - self.settings.lease_secs})
        return rows[0] if rows and rows[0] else None

    def peer_secret(self) -> bytes:
        """The key daemons sign their requests to each other with: random, made by the first
        daemon that needs it and kept in the database every member reads (never in a file
        or a log), so only a daemon of this cluster knows it."""
        if self._peer_secret is None:
            secret = self.store.get_setting(PEER_SECRET)
            if not secret:
                try:
                    with orm.db_session:
                        if self.store.e.Setting.get(key=PEER_SECRET) is None:
                            self.store.e.Setting(key=PEER_SECRET, value=secrets.token_hex(32))
                except (orm.TransactionIntegrityError, orm.CommitException):
                    pass  # another daemon made it meanwhile: read theirs
                secret = self.store.get_setting(PEER_SECRET)
            self._peer_secret = str(secret).encode("ascii")
        return self._peer_secret
