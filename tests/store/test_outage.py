"""Which failures are the database's outage (503, or 507 for a full disk), through every
wrapper they arrive in, and the log's one line at each end of an outage."""

from __future__ import annotations

import errno
import logging
import sqlite3

import psycopg2
import pytest
from pony.orm import dbapiprovider
from pony.orm.core import CommitException

from agentd.store.outage import DatabaseUnavailable, Outage, ReadOnly, StorageFull, _classify


def _raised_from(outer: Exception, inner: Exception) -> Exception:
    try:
        try:
            raise inner
        except Exception:
            raise outer
    except Exception as exc:
        return exc


@pytest.mark.parametrize("exc, kind, status", [
    (psycopg2.OperationalError("connection refused"), DatabaseUnavailable, 503),
    (psycopg2.InterfaceError("connection already closed"), DatabaseUnavailable, 503),
    (dbapiprovider.OperationalError(psycopg2.OperationalError("server closed the connection")),
     DatabaseUnavailable, 503),
    (CommitException("commit failed", [(None, dbapiprovider.InterfaceError(psycopg2.InterfaceError("x")), None)]),
     DatabaseUnavailable, 503),
    (sqlite3.OperationalError("database or disk is full"), StorageFull, 507),
    (sqlite3.OperationalError("disk I/O error"), StorageFull, 507),
    (dbapiprovider.OperationalError(sqlite3.OperationalError("database or disk is full")), StorageFull, 507),
    (sqlite3.OperationalError("attempt to write a readonly database"), ReadOnly, 503),
    (OSError(errno.ENOSPC, "No space left on device"), StorageFull, 507),
    (OSError(errno.EFBIG, "File too large"), StorageFull, 507),
    (OSError(errno.EROFS, "Read-only file system"), ReadOnly, 503),
    (_raised_from(RuntimeError("while saving"), OSError(errno.ENOSPC, "full")), StorageFull, 507),
])
def test_outages_through_their_wrappers(exc: Exception, kind: type, status: int) -> None:
    error = _classify(exc)
    assert type(error) is kind and error.status == status and error.retry_after == 2.0


@pytest.mark.parametrize("exc", [
    sqlite3.OperationalError("no such table: things"),
    sqlite3.IntegrityError("UNIQUE constraint failed"),
    psycopg2.errors.UniqueViolation("duplicate key"),
    # (A server's errors carry their SQLSTATE; these are the statement's, not an outage.)
    psycopg2.errors.DeadlockDetected("deadlock detected"),
    psycopg2.errors.QueryCanceled("canceling statement due to statement timeout"),
    OSError(errno.ENOENT, "No such file"),
    ValueError("bad"),
])
def test_other_failures_are_not_outages(exc: Exception) -> None:
    assert _classify(exc) is None


def test_one_line_when_an_outage_starts_and_one_when_it_ends(caplog) -> None:
    outage = Outage()
    down = DatabaseUnavailable("database unavailable: gone")
    with caplog.at_level(logging.WARNING, logger="agentd.store"):
        for _ in range(20):
            outage.noticed(down)
        outage.cleared(wrote=False)
        outage.cleared(wrote=False)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["database unavailable: gone",
                                                                       "database available again after 0.0s"]
    caplog.clear()
    full = StorageFull("insufficient storage: full")
    outage.noticed(full)
    outage.cleared(wrote=False)  # a read says nothing about a full disk
    assert outage.active and outage.writes_blocked
    outage.cleared(wrote=True)
    assert not outage.active
    assert len(caplog.records) == 2
