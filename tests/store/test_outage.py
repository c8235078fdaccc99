"""Which failures are the database's outage (503, or 507 for a full disk), through every
wrapper they arrive in, and the log's one line at each end of an outage."""

from __future__ import annotations

import errno
import logging
import sqlite3
import sys
import time

import psycopg2
import pytest
from pony.orm import dbapiprovider
from pony.orm.core import CommitException

from channel_fixtures import wait_for

from agentd.store import outage
from agentd.store.outage import (DatabaseUnavailable, Outage, ReadOnly, StorageFull, _classify, log_failure,
                                  translate, unless_unavailable)


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


def _server_error(base: type, code: str) -> Exception:
    """A psycopg2 error as the server sends it: with its SQLSTATE in `pgcode`."""
    return type("ServerError", (base,), {"pgcode": code})("from the server")


PG_GONE = "database unavailable: the PostgreSQL server cannot be reached or is restarting; retry shortly"


@pytest.mark.parametrize("exc, kind, message", [
    (psycopg2.OperationalError("connection refused"), DatabaseUnavailable, PG_GONE),
    (_server_error(psycopg2.errors.AdminShutdown, "57P01"), DatabaseUnavailable, PG_GONE),
    (_server_error(psycopg2.errors.CannotConnectNow, "57P03"), DatabaseUnavailable, PG_GONE),
    (_server_error(psycopg2.errors.TooManyConnections, "53300"), DatabaseUnavailable, PG_GONE),
    (_server_error(psycopg2.OperationalError, "08006"), DatabaseUnavailable, PG_GONE),
    (_server_error(psycopg2.errors.DiskFull, "53100"), StorageFull,
     "insufficient storage: the database server's disk is full; retry once space is freed"),
    (sqlite3.OperationalError("Database or disk is full"), StorageFull,
     "insufficient storage: the disk holding the database is full; free some space and retry"),
    (sqlite3.OperationalError("unable to open database file"), ReadOnly,
     "database unavailable: the database file or its directory is read-only; make the home writable and retry"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), StorageFull,
     "insufficient storage: the disk holding the daemon's home is full; free some space and retry"),
    (OSError(errno.EROFS, "Read-only file system"), ReadOnly,
     "database unavailable: the daemon's home is on a read-only file system"),
])
def test_each_outage_says_what_failed(exc: Exception, kind: type, message: str) -> None:
    error = _classify(exc)
    assert (type(error), error.message, str(error)) == (kind, message, message)


@pytest.mark.parametrize("exc", [
    _server_error(psycopg2.errors.DeadlockDetected, "40P01"),
    _server_error(psycopg2.errors.QueryCanceled, "57014"),  # a statement timeout: "57", not "57P"
    _server_error(psycopg2.OperationalError, "XX000"),
])
def test_a_server_error_of_the_statement_is_not_an_outage(exc: Exception) -> None:
    assert _classify(exc) is None


def test_wrapped_failures_are_followed_only_where_pony_keeps_them() -> None:
    full = sqlite3.OperationalError("database or disk is full")
    assert type(_classify(CommitException("commit failed", [(None, full)]))) is StorageFull
    assert type(_classify(CommitException("commit failed", [(None, full, None)]))) is StorageFull
    # Anything but a (type, value, ...) tuple is not an exception record: nothing to follow.
    for odd in ([full], [(full,)], [[None, full]], [None]):
        assert _classify(CommitException("commit failed", odd)) is None, odd


def test_the_cause_chain_is_followed_twelve_deep() -> None:
    def chain(depth: int) -> Exception:
        exc: Exception = OSError(errno.ENOSPC, "No space left on device")
        for n in range(depth):
            outer = RuntimeError(f"wrapper {n}")
            outer.__cause__ = exc
            exc = outer
        return exc

    assert type(_classify(chain(11))) is StorageFull
    assert _classify(chain(12)) is None


def test_without_psycopg2_loaded_sqlite_failures_are_still_classified(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    assert type(_classify(sqlite3.OperationalError("database or disk is full"))) is StorageFull
    assert _classify(ValueError("bad")) is None


def test_an_outage_error_carries_its_status_and_retry_after() -> None:
    error = DatabaseUnavailable("gone", status=504)
    assert (error.status, error.retry_after, error.message) == (504, 2.0, "gone")
    assert (DatabaseUnavailable("gone").status, StorageFull("full").status, ReadOnly("ro").status) == (503, 507, 503)
    fresh = Outage()
    assert (fresh.active, fresh.writes_blocked, fresh.error, fresh.since) == (False, False, None, None)


def test_translate_records_the_outage_and_log_failure_logs_only_other_failures(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    fresh = Outage()
    monkeypatch.setattr(outage, "OUTAGE", fresh)
    assert translate(ValueError("bad")) is None and not fresh.active
    error = translate(sqlite3.OperationalError("database or disk is full"))
    assert type(error) is StorageFull and fresh.active and fresh.error is error
    caplog.set_level(logging.WARNING)
    jobs = logging.getLogger("agentd.test.jobs")
    fresh.cleared(wrote=True)
    caplog.clear()
    log_failure(jobs, sqlite3.OperationalError("database or disk is full"), "job %s failed", "j1")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("agentd.store", "WARNING", "insufficient storage: the disk holding the database is full; free some "
                                    "space and retry (answering 507 until it recovers)")]
    caplog.clear()
    boom = ValueError("boom")
    log_failure(jobs, boom, "job %s failed", "j2")
    assert [(r.name, r.levelname, r.getMessage(), r.exc_info[1]) for r in caplog.records] == [
        ("agentd.test.jobs", "ERROR", "job j2 failed", boom)]


def test_a_reader_that_can_go_without_gets_none_during_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = Outage()
    monkeypatch.setattr(outage, "OUTAGE", fresh)
    assert unless_unavailable(lambda: 7)() == 7

    def down() -> int:
        raise sqlite3.OperationalError("database or disk is full")

    def broken() -> int:
        raise ValueError("bad")

    assert unless_unavailable(down)() is None and type(fresh.error) is StorageFull
    with pytest.raises(ValueError, match="bad"):
        unless_unavailable(broken)()


def test_leases_run_out_on_time_except_from_an_outage_start_until_one_lease_after_its_end() -> None:
    outage = Outage()
    later = time.time() + 100
    assert outage.lease_cutoff(later, 0.3) == later  # never an outage: a lease ends when it says
    before = time.time()
    outage.noticed(DatabaseUnavailable("gone"))
    began = time.time()
    cutoff = outage.lease_cutoff(later, 0.3)
    assert before <= cutoff <= began  # only what ran out before the outage began
    assert outage.lease_cutoff(before - 5, 0.3) == before - 5  # never a time still to come
    outage.cleared(wrote=True)
    assert outage.lease_cutoff(later, 0.3) == cutoff  # the owners get one lease to renew
    wait_for(lambda: outage.lease_cutoff(later, 0.3) == later, timeout=10, what="the lease after the outage")
