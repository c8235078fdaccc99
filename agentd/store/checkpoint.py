"""SQLite WAL checkpoints on a thread of their own, not on a request.

In WAL mode every commit appends its pages to the log, and the pages go back into the
database file at a checkpoint. By default SQLite checkpoints from the connection whose
commit pushed the log past `wal_autocheckpoint` pages (1,000): about every 80 messages one
request then copied the log into the database file and synced both files. That made the
benchmark's p99 latency at one connection: 7-13 ms, against 2.5 ms with checkpoints
switched off. So the store's connections only checkpoint past a far higher mark (a
backstop: a checkpointer that cannot keep up must not let the log grow without end), and
`WalCheckpointer` checkpoints every `CHECKPOINT_SECS`.

A PASSIVE checkpoint never waits for a lock: it copies what no reader still needs, while
requests go on reading and writing. Commits are durable in the log either way; the
checkpoint only moves them. SQLite starts the log again from its beginning only when a
commit finds all of it copied, which under steady load never happened after such a look
(commits came in while it copied), so each look ends with a second pass, short, while the
store's run writer is held off (`quiet`).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, ContextManager

log = logging.getLogger("agentd.store")

#: Seconds between the checkpointer's looks at the log.
CHECKPOINT_SECS = 0.5

#: `wal_autocheckpoint` of the store's connections, in pages (4 KB each): the backstop.
AUTOCHECKPOINT_PAGES = 10_000

#: Each connection's page cache bound in KiB (SQLite's own is 2,000). Pony keeps a connection for
#: every thread that has used the store, and each one's cache keeps the pages its last
#: transaction read until the thread's next transaction (which starts from an empty cache when
#: another connection has committed since): a thread parked after a large read holds up to the
#: bound for as long as it stays parked, so `[api] threads` of them could hold threads times
#: the bound. Pages read again come back from the OS page cache.
PAGE_CACHE_KIB = 512

#: What every SQLite connection of the store runs first, Pony's and the writer's alike (the
#: writer's once lacked `wal_autocheckpoint`, so requests still checkpointed every 1,000 pages).
CONNECTION_PRAGMAS = ("journal_mode = WAL", "foreign_keys = ON", "synchronous = NORMAL",
                      "busy_timeout = 5000", f"wal_autocheckpoint = {AUTOCHECKPOINT_PAGES}",
                      f"cache_size = -{PAGE_CACHE_KIB}")


class WalCheckpointer:
    """A daemon thread checkpointing the WAL of the SQLite database at `path`."""

    def __init__(self, path: Path, interval: float = CHECKPOINT_SECS,
                 quiet: Callable[[], ContextManager[Any]] | None = None) -> None:
        self.path = path
        self.interval = interval
        # Holds the store's commits off for a moment (see `checkpoint`).
        self.quiet = quiet
        self.checkpoints = 0  # PRAGMA wal_checkpoint runs
        self.last: tuple[int, int, int] | None = None  # (busy, frames in the log, frames checkpointed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentd-wal-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (a checkpoint under way finishes first)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        # (Made on this thread, used only here. A PASSIVE checkpoint waits for no lock, so the
        # busy timeout does not apply.)
        conn = sqlite3.connect(str(self.path))
        try:
            while not self._stop.wait(self.interval):
                self.checkpoint(conn)
        finally:
            conn.close()

    def checkpoint(self, conn: sqlite3.Connection) -> bool:
        """One PASSIVE checkpoint on `conn`; False when it failed (the next look tries again).

        With nothing new in the log it reads the log's index and writes nothing, so it is
        not worth telling a changed log from an unchanged one first (the log's size and
        time do not show it: after a full checkpoint the next commit writes the log from
        its start again)."""
        try:
            row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if self.quiet is not None and row[0] == 0 and row[1] > 0:
                # SQLite starts the log again from its beginning only when a commit finds
                # all of it copied; under steady load commits always came in while it
                # copied, the log grew to the backstop and a request checkpointed it. So the
                # little that came meanwhile is copied with the store's commits held off.
                with self.quiet():
                    row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            log.warning("WAL checkpoint of %s failed: %s", self.path, exc)
            return False
        self.checkpoints += 1
        self.last = (int(row[0]), int(row[1]), int(row[2]))
        return True
