"""The store's times (agentd/store/utc.py): every datetime attribute is written as naive UTC
and read back as aware UTC, whatever the value's zone or fraction; rows an earlier agentd
wrote with an offset read back as the same instant."""

from __future__ import annotations

import os
import sqlite3
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest
from pony import orm

from agentd.audit import AuditLog
from agentd.store import Store, open_store
from agentd.store.schema_steps import TIME_COLUMNS_V7
from agentd.store.utc import aware_utc, column_text, from_column, naive_utc
from agentd.workflows.store import WorkflowStore
from support import store_url_for

UTC = timezone.utc
PLUS2 = timezone(timedelta(hours=2))
WHOLE = datetime(2026, 3, 1, 12, 0, 5, tzinfo=UTC)


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(tmp_path / "agentd.db", store_url_for(tmp_path))
    yield s
    s.close()


def stored(store: Store, sql: str, params: dict) -> list:
    with orm.db_session:
        return [r[0] for r in store.raw_rows(sql, params)]


def naive_text_or_timestamp(value: object, when: datetime) -> bool:
    """A time column's content is `when` as naive UTC (SQLite text, or a PostgreSQL timestamp)."""
    if isinstance(value, str):
        return value == column_text(when)
    return value == naive_utc(when)


def test_every_datetime_attribute_goes_through_the_utc_converter(store: Store) -> None:
    sqlite = store.db.provider.dialect == "SQLite"
    expected = "SqliteUtcDatetimeConverter" if sqlite else "PostgresUtcDatetimeConverter"
    found = []
    for entity in store.db.entities.values():
        for attr in entity._attrs_:
            if attr.py_type is datetime:
                found.append(f"{entity._table_}.{attr.column}")
                assert type(attr.converters[0]).__name__ == expected, found[-1]
    if sqlite:  # plain-SQL parameters on SQLite get the same text
        assert sqlite3.adapters[(datetime, sqlite3.PrepareProtocol)] is column_text
    # (and the columns migration 7 brought to this form are all of them)
    assert sorted(found) == sorted(f"{t}.{c}" for t, columns in TIME_COLUMNS_V7.items() for c in columns)


def test_opening_a_sqlite_store_registers_the_adapter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sqlite3.adapters, (datetime, sqlite3.PrepareProtocol), raising=False)
    open_store(tmp_path / "agentd.db").close()
    assert sqlite3.adapters[(datetime, sqlite3.PrepareProtocol)] is column_text


def test_a_whole_second_reads_back_as_an_aware_time_and_updates(store: Store) -> None:
    e = store.e
    with orm.db_session:
        e.WorkflowRunRow(id="whole", workflow_id="w", workflow_name="w", status="pending", created_at=WHOLE)
        e.WorkflowRunRow(id="naive", workflow_id="w", workflow_name="w", status="pending",
                         created_at=datetime(2026, 3, 1, 12, 0, 6))
        e.WorkflowRunRow(id="zoned", workflow_id="w", workflow_name="w", status="pending",
                         created_at=datetime(2026, 3, 1, 14, 0, 7, 250, tzinfo=PLUS2))
    with orm.db_session:
        got = {r.id: r.created_at for r in e.WorkflowRunRow.select()}
    assert got == {"whole": WHOLE, "naive": datetime(2026, 3, 1, 12, 0, 6, tzinfo=UTC),
                   "zoned": datetime(2026, 3, 1, 12, 0, 7, 250, tzinfo=UTC)}
    assert all(v.tzinfo is UTC for v in got.values())
    values = stored(store, "SELECT created_at FROM workflow_runs WHERE id = $i", {"i": "zoned"})
    assert naive_text_or_timestamp(values[0], datetime(2026, 3, 1, 12, 0, 7, 250, tzinfo=UTC))
    # Pony checks what it read against the row when it writes (optimistic checks).
    with orm.db_session(optimistic=True):
        row = e.WorkflowRunRow["whole"]
        assert row.created_at == WHOLE
        row.status, row.started_at = "running", WHOLE + timedelta(seconds=1)
    with orm.db_session:
        row = e.WorkflowRunRow["whole"]
        assert (row.status, row.started_at) == ("running", WHOLE + timedelta(seconds=1))
        # A value just written reads back aware in the same session too.
        row.completed_at = datetime(2026, 3, 1, 12, 0, 9)
        assert row.completed_at == datetime(2026, 3, 1, 12, 0, 9, tzinfo=UTC)


def test_queries_compare_whole_seconds_aware_or_naive(store: Store) -> None:
    log = AuditLog(store)
    with orm.db_session:
        for n, when in enumerate([WHOLE, WHOLE + timedelta(microseconds=1), WHOLE + timedelta(seconds=1)]):
            store.e.AuditRow(at=when, event=f"e{n}")
    assert [e["event"] for e in log.recent(since=WHOLE)] == ["e2", "e1", "e0"]
    assert [e["event"] for e in log.recent(since=WHOLE.astimezone(PLUS2), until=WHOLE)] == ["e0"]
    assert [e["event"] for e in log.recent(since=naive_utc(WHOLE) + timedelta(microseconds=1))] == ["e2", "e1"]
    assert [e["timestamp"] for e in log.recent()] == ["2026-03-01T12:00:06+00:00", "2026-03-01T12:00:05.000001+00:00",
                                                      "2026-03-01T12:00:05+00:00"]
    with orm.db_session:
        assert orm.max(a.at for a in store.e.AuditRow) == WHOLE + timedelta(seconds=1)


def test_plain_sql_stores_a_time_as_entities_do(store: Store) -> None:
    with orm.db_session:
        store.e.AuditRow(at=WHOLE, event="e")
    store.write(lambda tx: tx.execute("UPDATE audit SET at = $t", {"t": datetime(2026, 3, 1, 14, 0, 8, tzinfo=PLUS2)}))
    assert naive_text_or_timestamp(stored(store, "SELECT at FROM audit", {})[0], WHOLE + timedelta(seconds=3))
    with orm.db_session:
        store.db.execute("UPDATE audit SET at = $t", {"t": WHOLE})
    assert naive_text_or_timestamp(stored(store, "SELECT at FROM audit", {})[0], WHOLE)
    assert [e["timestamp"] for e in AuditLog(store).recent()] == ["2026-03-01T12:00:05+00:00"]


def test_rows_written_by_an_earlier_agentd_read_back_through_the_store(tmp_path: Path) -> None:
    """SQLite text an earlier agentd wrote (an offset, no fraction, a `T`) reads back as the
    same instant through the store calls of the routes that list it. (Opening the database
    rewrites such text, migration 7; these rows come after it.)"""
    path = tmp_path / "agentd.db"
    open_store(path).close()
    old = ["2026-03-01 12:00:05+00:00", "2026-03-01 12:00:06.250000+00:00", "2026-03-01T14:00:07+02:00",
           "2026-03-01 12:00:08"]
    conn = sqlite3.connect(str(path))
    for n, text in enumerate(old):
        conn.execute("INSERT INTO workflow_runs (id, workflow_id, workflow_name, status, input, step_results, "
                     "steps_completed, created_at, started_at, completed_at) "
                     "VALUES (?, 'w', 'w', 'completed', '', '[]', 1, ?, ?, ?)", (f"r{n}", text, text, text))
        conn.execute("INSERT INTO audit (at, event, subject, detail) VALUES (?, ?, '', '{}')", (text, f"e{n}"))
    conn.commit()
    conn.close()
    store = open_store(path)
    try:
        expected = ["2026-03-01T12:00:05+00:00", "2026-03-01T12:00:06.250000+00:00", "2026-03-01T12:00:07+00:00",
                    "2026-03-01T12:00:08+00:00"]
        runs = WorkflowStore(store).runs("w")
        assert sorted((r["id"], r["started_at"], r["completed_at"]) for r in runs) == [
            (f"r{n}", t, t) for n, t in enumerate(expected)]
        assert sorted((e["event"], e["timestamp"]) for e in AuditLog(store).recent()) == [
            (f"e{n}", t) for n, t in enumerate(expected)]
    finally:
        store.close()


def test_the_helpers() -> None:
    assert naive_utc(datetime(2026, 3, 1, 14, 0, tzinfo=PLUS2)) == datetime(2026, 3, 1, 12, 0)
    assert naive_utc(datetime(2026, 3, 1, 12, 0)) == datetime(2026, 3, 1, 12, 0)
    assert aware_utc(datetime(2026, 3, 1, 12, 0)) == datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    assert aware_utc(datetime(2026, 3, 1, 14, 0, tzinfo=PLUS2)).tzinfo is UTC
    assert column_text(WHOLE) == "2026-03-01 12:00:05.000000"
    assert column_text(datetime(2026, 3, 1, 14, 0, 5, 7, tzinfo=PLUS2)) == "2026-03-01 12:00:05.000007"
    assert from_column("2026-03-01 12:00:05.000000") == WHOLE
    assert from_column("2026-03-01T14:00:05+02:00") == WHOLE and from_column("2026-03-01T12:00:05Z").tzinfo is UTC
    assert from_column(datetime(2026, 3, 1, 12, 0, 5)) == WHOLE
    with pytest.raises(ValueError, match="^not a stored time: 1772366405$"):
        from_column(1772366405)
    with pytest.raises(ValueError):
        from_column("yesterday")


@pytest.fixture()
def tokyo() -> Iterator[None]:
    """The process's local time zone is Asia/Tokyo (UTC+9) for the test."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_a_host_in_another_zone_stores_the_same_utc(tokyo: None, store: Store) -> None:
    assert naive_utc(datetime(2026, 3, 1, 14, 0, tzinfo=PLUS2)) == datetime(2026, 3, 1, 12, 0)
    with orm.db_session:
        store.e.AuditRow(at=datetime(2026, 3, 1, 14, 0, 5, tzinfo=PLUS2), event="e")
    assert naive_text_or_timestamp(stored(store, "SELECT at FROM audit", {})[0], WHOLE)
    assert [e["timestamp"] for e in AuditLog(store).recent()] == ["2026-03-01T12:00:05+00:00"]
