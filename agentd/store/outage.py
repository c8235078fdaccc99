"""When the database itself fails: PostgreSQL unreachable or restarting, a connection
killed under the daemon, a full disk or a read-only home under SQLite.

Every such failure, whichever layer meets it (psycopg2, sqlite3, Pony's wrappers, a file
write), becomes one `DatabaseUnavailable` (503, `Retry-After`) or `StorageFull` (507), so
clients get a clear answer to retry instead of a 500, and the log gets one warning when
the outage starts and one line when it ends, not a traceback per request.

The state is the process's: a daemon has one database, and every thread that meets the
outage reports to the same place.
"""

from __future__ import annotations

import errno
import functools
import logging
import sqlite3
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, ParamSpec, TypeVar

from agentd.errors import AgentdError

log = logging.getLogger("agentd.store")

RETRY_AFTER_SECS = 2.0

T = TypeVar("T")
P = ParamSpec("P")

# sqlite3 messages that mean the file cannot grow or be written, not a bug in a statement.
_SQLITE_FULL = ("database or disk is full", "disk i/o error")
_SQLITE_READ_ONLY = ("attempt to write a readonly database", "unable to open database file")
_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
# PostgreSQL error codes of a server that is gone or going (connection exceptions, shutdown,
# starting up, too many connections). Other operational errors (a deadlock, a statement
# timeout) are the statement's, not an outage.
_PG_GONE = ("08", "57P", "53300")
_PG_DISK_FULL = "53100"


class DatabaseUnavailable(AgentdError):
    """The database cannot be reached or written just now; the client should retry."""

    status = 503
    # True when reading still works (a full disk, a read-only file): a successful read then
    # says nothing about the outage, only a write ends it.
    reads_work = False

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message, status=status, retry_after=RETRY_AFTER_SECS)


class StorageFull(DatabaseUnavailable):
    """The disk holding the database (or a file the daemon writes) is full."""

    status = 507
    reads_work = True


class ReadOnly(DatabaseUnavailable):
    """The database file, its directory or the file system is read-only."""

    reads_work = True


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc`, what it wraps (Pony's `original_exc` and `exceptions`) and its chain."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 12:
        item = todo.pop(0)
        if item is None or any(item is s for s in seen):
            continue
        seen.append(item)
        todo.append(getattr(item, "original_exc", None))
        for info in getattr(item, "exceptions", None) or ():
            todo.append(info[1] if isinstance(info, tuple) and len(info) > 1 else None)
        todo.extend((item.__cause__, item.__context__))
    return seen


def _classify(exc: BaseException) -> DatabaseUnavailable | None:
    psycopg2 = sys.modules.get("psycopg2")  # imported by the store only when it uses PostgreSQL
    for cause in _causes(exc):
        if isinstance(cause, DatabaseUnavailable):
            return cause
        if psycopg2 is not None and isinstance(cause, (psycopg2.OperationalError, psycopg2.InterfaceError)):
            code = getattr(cause, "pgcode", None)
            if code == _PG_DISK_FULL:
                return StorageFull("insufficient storage: the database server's disk is full; retry "
                                   "once space is freed")
            dropped = code is None and type(cause) is psycopg2.OperationalError  # libpq's own
            if isinstance(cause, psycopg2.InterfaceError) or dropped or (code or "").startswith(_PG_GONE):
                return DatabaseUnavailable("database unavailable: the PostgreSQL server cannot be reached "
                                           "or is restarting; retry shortly")
        if isinstance(cause, sqlite3.OperationalError):
            text = str(cause).lower()
            if any(t in text for t in _SQLITE_FULL):
                return StorageFull("insufficient storage: the disk holding the database is full; "
                                   "free some space and retry")
            if any(t in text for t in _SQLITE_READ_ONLY):
                return ReadOnly("database unavailable: the database file or its directory is "
                                "read-only; make the home writable and retry")
        if isinstance(cause, OSError):
            if cause.errno in _DISK_FULL_ERRNOS:
                return StorageFull("insufficient storage: the disk holding the daemon's home is full; "
                                   "free some space and retry")
            if cause.errno == errno.EROFS:
                return ReadOnly("database unavailable: the daemon's home is on a read-only file system")
    return None


class Outage:
    """Whether the database is failing now; logs the start and the end of each outage."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None  # monotonic time the current outage was first seen
        self.error: DatabaseUnavailable | None = None
        self._began_at = 0.0  # wall-clock start of the current or the last outage
        self._ended = -float("inf")  # monotonic end of the last outage

    @property
    def active(self) -> bool:
        return self.since is not None

    @property
    def writes_blocked(self) -> bool:
        """An outage that only a successful write can show to be over."""
        error = self.error
        return error is not None and error.reads_work

    def noticed(self, error: DatabaseUnavailable) -> None:
        with self._lock:
            if self.since is not None:
                return
            self.since, self.error, self._began_at = time.monotonic(), error, time.time()
        log.warning("%s (answering %d until it recovers)", error.message, error.status)

    def cleared(self, wrote: bool) -> None:
        """A database call succeeded (`wrote`: a write committed): the outage is over,
        unless reads kept working through it and this was one."""
        if self.since is None:
            return
        with self._lock:
            if self.since is None or (self.writes_blocked and not wrote):
                return
            self._ended = time.monotonic()
            lasted, self.since, self.error = self._ended - self.since, None, None
        log.warning("database available again after %.1fs", lasted)

    def lease_cutoff(self, now: float, lease_secs: float) -> float:
        """The time a lease (or a heartbeat) must have expired before for its owner to be
        taken for gone at `now`.

        A lease that ran out while this daemon could not reach the database either says
        nothing about its owner, most likely cut off too and renewing again at its next
        heartbeat: during an outage and for one lease after it, only leases that expired
        before the outage began count."""
        with self._lock:
            if self.since is None and time.monotonic() - self._ended >= lease_secs:
                return now
            return min(now, self._began_at)


OUTAGE = Outage()


def translate(exc: BaseException) -> DatabaseUnavailable | None:
    """The `DatabaseUnavailable` that `exc` amounts to (recorded as an outage), or None when
    it is some other failure."""
    error = _classify(exc)
    if error is not None:
        OUTAGE.noticed(error)
    return error


@contextmanager
def as_outage() -> Iterator[None]:
    """The block's failure that is the database's outage raises as that outage (a 503 or 507
    the client retries); any other failure as it was."""
    try:
        yield
    except AgentdError:
        raise
    except Exception as exc:
        unavailable = translate(exc)
        if unavailable is None:
            raise
        raise unavailable from None


def log_failure(logger: logging.Logger, exc: BaseException, message: str, *args: object) -> None:
    """For a background loop's failure: the traceback, unless it is the database's outage
    (logged once when it starts)."""
    if translate(exc) is None:
        logger.error(message, *args, exc_info=exc)


def unless_unavailable(read: Callable[P, T]) -> Callable[P, T | None]:
    """`read`, giving None instead of raising while the database is out (for a reader that
    can go without, such as a metrics scrape); other failures still raise."""
    @functools.wraps(read)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> T | None:
        try:
            return read(*args, **kwargs)
        except Exception as exc:
            if translate(exc) is None:
                raise
            return None
    return guarded
