"""The end-of-run write: every message's session rows, usage and run record, committed
before the answer goes out, on one connection.

Why not Pony's per-thread connections, as everywhere else: SQLite keeps a page cache per
connection and drops it whenever another connection has committed. With the server's
threads each committing their messages on their own connections, a write at 32 concurrent
requests found its cache stale and read back some thirty pages first (strace: 30 `pread`s
a message at 32 connections, 2 at one). One connection doing all of these writes keeps its
pages warm: the daemon's CPU per message at 32 connections fell by about a tenth.

(Committing the writes that wait together, group commit, was tried too: the hand-over
between threads cost more context switches than the shared commits saved.)

A write is `work(tx)`: plain SQL through `tx.execute`, nothing else touching the database
(on SQLite it runs on the writer's connection), and in-memory changes kept for after
`Writer.run` returns.

PostgreSQL (no such cache; several daemons) keeps a Pony transaction per write.
"""

from __future__ import annotations

import re
from operator import itemgetter
from abc import ABC, abstractmethod
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

from pony import orm
from pony.orm import core as pony_core

from agentd.store.checkpoint import CONNECTION_PRAGMAS

T = TypeVar("T")

_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
# A statement sqlite3 counts as a change (`executemany` takes only those; before one, the
# connection opens its transaction).
_CHANGE = re.compile(r"\s*(?:INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)


class Tx(Protocol):
    """An open write transaction."""

    def execute(self, sql: str, params: dict[str, Any]) -> int:
        """Run one statement (`$name` parameters); the number of rows it changed."""


class PonyTx:
    """Statements through Pony, inside the caller's `db_session`."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def execute(self, sql: str, params: dict[str, Any]) -> int:
        return self.db.execute(sql, params).rowcount


class SqliteTx:
    """Statements on the writer's own connection.

    Every call of sqlite3's that lets other threads run while SQLite works (it releases
    the GIL) is a hand-over of the GIL under load, made with the write lock held, so the
    statements go the way that makes the fewest: positional parameters (sqlite3 releases
    the GIL to look up each named one), a change through `executemany` (which skips the
    last-row-id lookup) opening the transaction itself (the connection's implicit BEGIN
    IMMEDIATE, one call instead of a statement's several)."""

    # `$name` SQL -> sqlite3's `?` form, the names in their order, whether it changes rows
    # and what picks the names' values (one C call): a handful of statements (a run's append
    # has one form per number of messages), bounded all the same.
    _converted: dict[str, tuple[str, tuple[str, ...], bool, Callable[[dict[str, Any]], tuple[Any, ...]]]] = {}
    CACHE_SIZE = 256

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self.cursor = cursor

    def execute(self, sql: str, params: dict[str, Any]) -> int:
        converted = self._converted.get(sql)
        if converted is None:
            if len(self._converted) >= self.CACHE_SIZE:
                self._converted.clear()
            names = tuple(_PARAM.findall(sql))
            pick = itemgetter(*names) if len(names) > 1 else (
                (lambda p, name=names[0]: (p[name],)) if names else (lambda p: ()))
            converted = self._converted[sql] = (_PARAM.sub("?", sql), names, bool(_CHANGE.match(sql)), pick)
        native, _, change, pick = converted
        values = pick(params)
        if change:
            return self.cursor.executemany(native, (values,)).rowcount
        if not self.cursor.connection.in_transaction:
            self.cursor.execute("BEGIN IMMEDIATE")  # a read first: it must see what it writes on
        return self.cursor.execute(native, values).rowcount


class Writer(ABC):
    """`run(work)`: run `work(tx)` in a committed transaction and return its result."""

    commits = 0  # transactions committed (read by tests)

    @abstractmethod
    def run(self, work: Callable[[Tx], T]) -> T:
        """Run `work(tx)` in a committed transaction; its result."""

    def close(self) -> None:
        """Release what the writer holds (its connection)."""


class PonyWriter(Writer):
    """One Pony transaction per write, on the calling thread (PostgreSQL)."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def run(self, work: Callable[[Tx], T]) -> T:
        with orm.db_session:
            result = work(PonyTx(self.db))
        self.commits += 1
        return result


class SqliteWriter(Writer):
    """Every write on one dedicated SQLite connection (see the module doc)."""

    def __init__(self, path: Path, db: Any) -> None:
        self.db = db
        self.conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        # Checkpoints included: they run on the store's own thread (store/checkpoint.py).
        for pragma in CONNECTION_PRAGMAS:
            self.conn.execute(f"PRAGMA {pragma}")
        # A write's first change opens its transaction, taking the write lock at once
        # (SqliteTx); `commit()` ends it.
        self.conn.isolation_level = "IMMEDIATE"
        self._closed = False
        self._lock = threading.Lock()

    def run(self, work: Callable[[Tx], T]) -> T:
        if pony_core.local.db_context_counter:
            # Inside a Pony db_session, whose thread may already hold Pony's write lock:
            # write in that transaction instead of waiting for the lock it holds.
            return work(PonyTx(self.db))
        # Writers queue on a lock of their own, then take Pony's write lock, which keeps
        # Pony's own writers out (no SQLITE_BUSY between the two). Queueing on Pony's pair of
        # locks instead cost a fifth more context switches under load.
        with self._lock:
            return self._transaction(work)

    def _transaction(self, work: Callable[[Tx], T]) -> T:
        provider = self.db.provider
        provider.acquire_lock()
        try:
            if self._closed:
                raise sqlite3.ProgrammingError("the store is closed")
            try:
                result = work(SqliteTx(self.conn.cursor()))
                if self.conn.in_transaction:
                    self.conn.commit()
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.rollback()
                raise
            self.commits += 1
        finally:
            provider.release_lock()
        return result

    def held(self) -> threading.Lock:
        """The lock every write takes first: while it is held, no write commits."""
        return self._lock

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self.conn.close()
