"""Keep every daemon's semantic search matrix current through PostgreSQL LISTEN/NOTIFY.

Each daemon searches an in-memory matrix per agent (agentd/memory/vectors.py), built
from the vectors stored in the database (float32 bytea). When one daemon changes an
agent's fragments it sends `NOTIFY agentd_memory, '<daemon id>|<agent id>'`; every
other daemon listens on a dedicated connection and drops that agent's matrix, which
the next search rebuilds from the database. A listener that lost its connection drops
every matrix after reconnecting (it may have missed notifications).

On SQLite (one daemon) nothing is sent and nobody listens.
"""

from __future__ import annotations

import logging
import select
import threading
from typing import Any, Callable

from pony import orm

from agentd.store import Store
from agentd.store.outage import log_failure, translate

log = logging.getLogger("agentd.memory.notify")

CHANNEL = "agentd_memory"
RECONNECT_SECS = 1.0


class MemoryNotifier:
    """publish(agent_id) after a local write; a listener thread applies remote writes."""

    def __init__(self, store: Store, daemon_id: str, invalidate: Callable[[str | None], None]) -> None:
        self.store = store
        self.daemon_id = daemon_id
        self.invalidate = invalidate
        self.enabled = store.shared
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self.listening = threading.Event()  # set once LISTEN is in place (tests wait for it)
        self.received = 0

    def start(self) -> None:
        if not self.enabled:
            return
        self._thread = threading.Thread(target=self._listen, name="agentd-memory-listen", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass
        if self._thread is not None:
            self._thread.join(timeout=3)

    def publish(self, agent_id: str) -> None:
        """Tell the other daemons that `agent_id`'s fragments changed (never raises)."""
        if not self.enabled:
            return
        try:
            with orm.db_session:
                self.store.db.execute("SELECT pg_notify($c, $p)",
                                      {"c": CHANNEL, "p": f"{self.daemon_id}|{agent_id}"})
        except Exception as exc:  # noqa: BLE001 - others rebuild late, but this write stands
            log_failure(log, exc, "memory change notification failed")

    def _connect(self) -> Any:
        import psycopg2

        # Pony's own connection arguments (the password, if any, came from the environment).
        pool = self.store.db.provider.pool
        conn = psycopg2.connect(*pool.args, **pool.kwargs)
        conn.autocommit = True
        conn.cursor().execute(f"LISTEN {CHANNEL}")
        return conn

    def _listen(self) -> None:
        first = True
        while not self._stop.is_set():
            try:
                self._conn = self._connect()
            except Exception as exc:  # noqa: BLE001
                _report("memory listener cannot connect: %s", exc)
                self._stop.wait(RECONNECT_SECS)
                continue
            if not first:
                self.invalidate(None)  # notifications may have been missed meanwhile
            first = False
            self.listening.set()
            try:
                self._pump(self._conn)
            except Exception as exc:  # noqa: BLE001
                if not self._stop.is_set():
                    _report("memory listener lost its connection: %s", exc)
            finally:
                self.listening.clear()
                try:
                    self._conn.close()
                except Exception:  # noqa: BLE001
                    pass
                self._conn = None

    def _pump(self, conn: Any) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([conn], [], [], 1.0)
            if not ready:
                continue
            conn.poll()
            while conn.notifies:
                note = conn.notifies.pop(0)
                sender, _, agent_id = note.payload.partition("|")
                if sender != self.daemon_id and agent_id:
                    self.received += 1
                    self.invalidate(agent_id)


def _report(message: str, exc: BaseException) -> None:
    # The database's outage is logged once, by the store: here it is only a debug line.
    log.log(logging.DEBUG if translate(exc) is not None else logging.WARNING, message, exc)
