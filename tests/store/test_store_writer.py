"""The store's writer (agentd/store/writer.py): the end-of-run writes on one SQLite connection.

What it must keep: a write is committed (visible to every other connection) when `write`
returns, a failing write leaves nothing behind, writes from many threads and Pony's own
writers in between all land without SQLITE_BUSY, a write inside a db_session belongs to
that session's transaction, and a message through the daemon's manager is one commit.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from pathlib import Path

import pytest
from pony import orm

from agentd.store import open_store
from agentd.store.writer import PonyWriter, SqliteTx, SqliteWriter

INSERT = "INSERT INTO settings (key, value) VALUES ($k, $v)"


@pytest.fixture()
def store(tmp_path: Path):
    s = open_store(tmp_path / "agentd.db")
    yield s
    s.close()


def _keys(store) -> list[str]:
    with orm.db_session:
        return sorted(store.db.select("SELECT key FROM settings"))


def _outside(store) -> list[str]:
    """The keys as a separate connection (another process, say) sees them."""
    conn = sqlite3.connect(str(store.path))
    try:
        return sorted(k for (k,) in conn.execute("SELECT key FROM settings"))
    finally:
        conn.close()


def test_a_write_is_committed_when_write_returns_and_gives_its_result(store) -> None:
    assert store.write(lambda tx: tx.execute(INSERT, {"k": "a", "v": '"1"'})) == 1
    assert isinstance(store._writer, SqliteWriter)
    assert _outside(store) == ["a"] and _keys(store) == ["a"]
    assert store.write(lambda tx: tx.execute("UPDATE settings SET value = $v WHERE key = $k",
                                             {"k": "nobody", "v": "0"})) == 0
    assert store._writer.commits == 2


def test_a_failing_write_rolls_back_all_of_it_and_raises(store) -> None:
    def half_then_fail(tx):
        tx.execute(INSERT, {"k": "half", "v": "1"})
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        store.write(half_then_fail)
    with pytest.raises(sqlite3.IntegrityError):  # a second row with the same key
        store.write(lambda tx: [tx.execute(INSERT, {"k": "dup", "v": "1"}) for _ in range(2)])
    assert _outside(store) == []
    assert store._writer.commits == 0
    store.write(lambda tx: tx.execute(INSERT, {"k": "after", "v": "1"}))
    assert _outside(store) == ["after"], "BUG: a failed write left the connection in a transaction"


def test_a_write_inside_a_db_session_is_part_of_that_transaction(store) -> None:
    with pytest.raises(RuntimeError):
        with orm.db_session:
            store.write(lambda tx: tx.execute(INSERT, {"k": "inner", "v": "1"}))
            raise RuntimeError("the outer transaction fails")
    assert _outside(store) == []
    with orm.db_session:
        store.write(lambda tx: tx.execute(INSERT, {"k": "inner", "v": "1"}))
        # the same transaction: this session sees the row before it commits
        assert store.db.select("SELECT key FROM settings") == ["inner"]
    assert _outside(store) == ["inner"]


def test_writes_from_many_threads_and_ponys_writers_all_land(store) -> None:
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(25):
                store.write(lambda tx: tx.execute(INSERT, {"k": f"w{n}-{i}", "v": "1"}))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def pony_writer(n: int) -> None:
        try:
            for i in range(25):
                with orm.db_session:
                    store.e.Setting(key=f"p{n}-{i}", value=1)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    threads += [threading.Thread(target=pony_writer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(_outside(store)) == 6 * 25 + 3 * 25
    assert store._writer.commits == 6 * 25


def test_a_closed_store_refuses_writes(tmp_path: Path) -> None:
    s = open_store(tmp_path / "agentd.db")
    s.write(lambda tx: tx.execute(INSERT, {"k": "a", "v": "1"}))
    writer = s._writer
    s.close()
    assert s._writer is None
    with pytest.raises(sqlite3.ProgrammingError, match="^the store is closed$"):
        writer.run(lambda tx: tx.execute(INSERT, {"k": "b", "v": "1"}))


def test_the_writers_connection_has_the_stores_settings(store) -> None:
    store.write(lambda tx: 0)
    conn = store._writer.conn
    settings = {name: conn.execute(f"PRAGMA {name}").fetchone()[0]
                for name in ("foreign_keys", "synchronous", "busy_timeout", "journal_mode")}
    # synchronous 1 = NORMAL: with WAL, a commit is safe from a killed process without an fsync each
    assert settings == {"foreign_keys": 1, "synchronous": 1, "busy_timeout": 5000, "journal_mode": "wal"}


def test_the_connection_enforces_foreign_keys(store) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        store.write(lambda tx: tx.execute(
            "INSERT INTO session_messages (session, body) VALUES ($s, $b)", {"s": "no-such-session", "b": "{}"}))


def _connection(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level="IMMEDIATE", check_same_thread=False)
    conn.execute("CREATE TABLE t (a, b, c)")
    return conn


def test_dollar_parameters_are_bound_by_position_and_a_change_opens_the_transaction(tmp_path: Path) -> None:
    conn = _connection(tmp_path / "t.db")
    # A table name of its own: the conversion is cached per statement for the process, and
    # this test must see it done.
    sql = f"INSERT INTO t (a, b, c) SELECT $a_1, $B, $a_1 WHERE '{uuid.uuid4().hex}' <> ''"
    tx = SqliteTx(conn.cursor())
    for _ in range(2):  # converted, then taken from the cache
        assert tx.execute(sql, {"a_1": 1, "B": 2, "unused": 3}) == 1
    assert conn.in_transaction
    assert SqliteTx._converted[sql][:3] == (sql.replace("$a_1", "?").replace("$B", "?"), ("a_1", "B", "a_1"), True)
    assert tx.execute("  update t SET b = $b WHERE a = $a", {"a": 1, "b": 5}) == 2
    conn.commit()
    assert conn.execute("SELECT a, b, c FROM t").fetchall() == [(1, 5, 1), (1, 5, 1)]


def test_a_write_that_reads_first_holds_the_write_lock_from_its_read(tmp_path: Path) -> None:
    conn = _connection(tmp_path / "t.db")
    other = sqlite3.connect(str(tmp_path / "t.db"), timeout=0, isolation_level=None)
    tx = SqliteTx(conn.cursor())
    assert tx.execute("SELECT count(*) FROM t WHERE a = $a", {"a": 1}) == -1
    assert conn.in_transaction
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        other.execute("BEGIN IMMEDIATE")
    conn.rollback()
    other.execute("BEGIN IMMEDIATE")
    other.rollback()


def test_a_shared_database_writes_through_pony(store) -> None:
    writer = PonyWriter(store.db)
    assert writer.run(lambda tx: tx.execute(INSERT, {"k": "p", "v": "1"})) == 1
    assert writer.run(lambda tx: tx.execute(INSERT, {"k": "q", "v": "1"})) == 1
    assert _outside(store) == ["p", "q"] and writer.commits == 2


def test_the_statement_cache_stays_bounded(monkeypatch) -> None:
    monkeypatch.setattr(SqliteTx, "_converted", {})
    tx = SqliteTx(sqlite3.connect(":memory:", isolation_level="IMMEDIATE").cursor())
    for i in range(SqliteTx.CACHE_SIZE + 10):
        tx.execute(f"SELECT $a{i}", {f"a{i}": i})
    assert 0 < len(SqliteTx._converted) <= SqliteTx.CACHE_SIZE
    assert SqliteTx._converted[f"SELECT $a{SqliteTx.CACHE_SIZE + 9}"][:3] == ("SELECT ?", (f"a{SqliteTx.CACHE_SIZE + 9}",), False)


def test_the_statement_cache_holds_its_size_then_starts_over(monkeypatch) -> None:
    monkeypatch.setattr(SqliteTx, "_converted", {})
    tx = SqliteTx(sqlite3.connect(":memory:", isolation_level="IMMEDIATE").cursor())
    for i in range(SqliteTx.CACHE_SIZE):
        tx.execute(f"SELECT $a{i}", {f"a{i}": i})
    assert len(SqliteTx._converted) == SqliteTx.CACHE_SIZE == 256
    tx.execute("SELECT $b", {"b": 0})   # one past the size: the cache starts over with it
    assert list(SqliteTx._converted) == ["SELECT $b"]


def test_a_statement_is_converted_once_then_taken_from_the_cache(tmp_path: Path, monkeypatch) -> None:
    from agentd.store import writer

    real = writer._PARAM
    converted: list[str] = []

    class CountingParam:
        def sub(self, repl: str, sql: str) -> str:
            converted.append(sql)
            return real.sub(repl, sql)

        def findall(self, sql: str) -> list[str]:
            return real.findall(sql)

    monkeypatch.setattr(SqliteTx, "_converted", {})
    monkeypatch.setattr(writer, "_PARAM", CountingParam())
    conn = _connection(tmp_path / "t.db")
    tx = SqliteTx(conn.cursor())
    for i in range(3):
        assert tx.execute("INSERT INTO t (a) VALUES ($a)", {"a": i}) == 1
    assert converted == ["INSERT INTO t (a) VALUES ($a)"]
    conn.commit()
    assert conn.execute("SELECT a FROM t").fetchall() == [(0,), (1,), (2,)]
