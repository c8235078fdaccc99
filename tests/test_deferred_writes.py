"""Message writes journaled and applied in batches (agentd/store/deferred.py).

What it must keep: a journaled write is visible to every read through the store that
follows it and is never overtaken by a later write; a process killed before the batch
leaves the writes in the journal and the next open applies each exactly once; a torn or
damaged record ends the journal; only one process applies a journal.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from pony import orm

from agentd.store import open_store
from agentd.store import deferred
from agentd.store.deferred import (APPLIED_KEY, Encoder, Journal, JournalBusy, RecordingTx, decode, encode)

INSERT = "INSERT INTO settings (key, value) VALUES ($k, $v)"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def store(tmp_path: Path):
    s = open_store(tmp_path / "agentd.db")
    s.defer_writes(interval=3600)  # batches only when something settles them
    yield s
    s.close()


def _outside(path: Path, sql: str = "SELECT key, value FROM settings WHERE key != ? ORDER BY rowid",
             params: tuple = (APPLIED_KEY,)) -> list[tuple]:
    """What a separate connection (another process, say) sees."""
    conn = sqlite3.connect(str(path))
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _journal(store) -> Path:
    return store.path.with_name(store.path.name + "-messages")


def _put(k: str, v: str):
    return lambda tx: tx.execute(INSERT, {"k": k, "v": v})


def test_records_round_trip_and_a_torn_or_damaged_record_ends_the_journal() -> None:
    a = encode(1, [("S1", {"x": 1, "y": None, "z": "é"})])
    b = encode(2, [("S2", {"f": 0.1 + 0.2, "t": True}), ("S3", {})])
    assert decode(a + b) == [(1, [("S1", {"x": 1, "y": None, "z": "é"})]),
                             (2, [("S2", {"f": 0.30000000000000004, "t": True}), ("S3", {})])]
    assert decode(a + b[:-1]) == decode(a)  # torn mid-record
    assert decode(a + b[:5]) == decode(a)  # torn mid-header
    damaged = bytearray(a + b)
    damaged[len(a) + 12] ^= 0x01  # one bit of the second payload
    assert decode(bytes(damaged) + encode(3, [("S4", {})])) == decode(a)
    assert decode(b"") == []


def test_a_recording_tx_keeps_statements_and_datetimes_are_journaled_as_sqlite_stores_them() -> None:
    tx = RecordingTx()
    when = datetime(2026, 11, 27, 8, 5, 3, 120)
    params = {"at": when, "id": "a"}
    assert tx.execute("UPDATE t SET at = $at WHERE id = $id", params) == 1
    assert tx.execute("X", {"at": datetime(2026, 1, 2)}) == 1
    assert tx.statements[0][1] is params
    assert decode(encode(7, tx.statements)) == [(7, [("UPDATE t SET at = $at WHERE id = $id",
                                                      {"at": "2026-11-27 08:05:03.000120", "id": "a"}),
                                                     ("X", {"at": "2026-01-02 00:00:00"})])]
    # The same text sqlite3 stores for a datetime parameter (as a batch from memory does).
    conn = sqlite3.connect(":memory:")
    assert conn.execute("SELECT ?", (when,)).fetchone()[0] == "2026-11-27 08:05:03.000120"
    with pytest.raises(TypeError, match="a journaled parameter cannot be bytes"):
        encode(1, [("X", {"b": b"raw"})])


def test_a_files_records_name_each_statement_by_number_after_its_first_use() -> None:
    enc = Encoder()
    one = enc.encode(1, [("A", {"x": 1}), ("B", {})])
    two = enc.encode(2, [("B", {"y": 2}), ("A", {}), ("C", {})])
    assert json.loads(two[8:]) == [2, [[2, "C"]], [[1, {"y": 2}], [0, {}], [2, {}]]]
    assert decode(one + two) == [(1, [("A", {"x": 1}), ("B", {})]), (2, [("B", {"y": 2}), ("A", {}), ("C", {})])]
    assert decode(two) == []  # (a record naming SQL the file never gave ends it)
    enc.reset()
    assert decode(enc.encode(3, [("B", {})])) == [(3, [("B", {})])]


def test_a_journaled_write_is_in_the_journal_not_yet_the_database_and_every_read_sees_it(store) -> None:
    assert store.write_later(_put("a", '"1"')) == 1
    assert store._later.pending == 1
    assert _outside(store.path) == []  # not applied yet
    assert _journal(store).stat().st_size > 0
    with orm.db_session:  # a Pony session settles first
        assert store.get_setting("a") == "1"
    assert store._later.pending == 0 and store._later.batches == 1
    assert _outside(store.path) == [("a", '"1"')]
    assert _journal(store).stat().st_size == 0  # nothing pending: the journal is emptied


def test_raw_reads_in_a_session_settle_too(store) -> None:
    store.write_later(_put("raw", '"r"'))
    with orm.db_session:
        assert store.raw_rows("SELECT value FROM settings WHERE key = $k", {"k": "raw"}) == [('"r"',)]


def test_a_later_write_never_overtakes_a_pending_one(store) -> None:
    store.write_later(_put("k", '"old"'))
    store.write_later(lambda tx: tx.execute("UPDATE settings SET value = $v WHERE key = $k", {"k": "k", "v": '"newer"'}))
    assert store.write(lambda tx: tx.execute("DELETE FROM settings WHERE key = $k", {"k": "k"})) == 1
    assert store._later.pending == 0
    store.settle()
    assert _outside(store.path) == []
    assert store._writer.commits == 2  # the two pending in one batch, then the delete


def test_batches_apply_on_their_own_within_the_interval(tmp_path) -> None:
    s = open_store(tmp_path / "agentd.db")
    s.defer_writes(interval=0.01)
    try:
        for i in range(5):
            s.write_later(_put(f"k{i}", str(i)))
        deadline = time.monotonic() + 10
        while _outside(s.path) != [(f"k{i}", i) for i in range(5)] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _outside(s.path) == [(f"k{i}", i) for i in range(5)]
        assert s._later.pending == 0 and 1 <= s._later.batches <= 5
        assert s.get_setting(APPLIED_KEY) == {"seq": 5}
    finally:
        s.close()


def test_same_shaped_records_run_statement_by_statement_keeping_each_tables_order(store) -> None:
    store.write(lambda tx: tx.execute("CREATE TABLE a (id INTEGER PRIMARY KEY, v TEXT)", {}))
    store.write(lambda tx: tx.execute("CREATE TABLE b (id INTEGER PRIMARY KEY, v TEXT)", {}))

    def two(n: int):
        return lambda tx: (tx.execute("INSERT INTO a (v) VALUES ($v)", {"v": f"a{n}"}),
                           tx.execute("INSERT INTO b (v) VALUES ($v)", {"v": f"b{n}"}))

    for n in range(2):
        store.write_later(two(n))
    store.write_later(lambda tx: tx.execute("INSERT INTO b (v) VALUES ($v)", {"v": "lone"}))
    for n in range(2, 5):
        store.write_later(two(n))
    store.settle()
    assert _outside(store.path, "SELECT v FROM a ORDER BY id", ()) == [(f"a{n}",) for n in range(5)]
    assert _outside(store.path, "SELECT v FROM b ORDER BY id", ()) == [
        ("b0",), ("b1",), ("lone",), ("b2",), ("b3",), ("b4",)]
    assert store._later.batches == 1
    store.write_later(two(5))
    store.settle()
    assert store._later.batches == 2


def test_a_record_the_database_refuses_is_dropped_and_logged_the_others_applied(store, caplog) -> None:
    store.write(_put("taken", '"x"'))
    store.write_later(_put("before", '"1"'))
    store.write_later(_put("taken", '"again"'))  # primary key: refused
    store.write_later(_put("after", '"3"'))
    with caplog.at_level(logging.ERROR, logger="agentd.store"):
        store.settle()
    assert _outside(store.path) == [("taken", '"x"'), ("before", '"1"'), ("after", '"3"')]
    assert [r.getMessage() for r in caplog.records] == [
        "a message write (journal record 2) was refused by the database and dropped: "
        "UNIQUE constraint failed: settings.key"]
    assert store.get_setting(APPLIED_KEY) == {"seq": 3}
    assert store._later.pending == 0
    store.write_later(_put("taken", '"once more"'))  # refused, and the last of its batch
    with caplog.at_level(logging.ERROR, logger="agentd.store"):
        store.settle()
    assert store.get_setting(APPLIED_KEY) == {"seq": 4}  # not applied again at the next start


def test_a_failure_other_than_a_refusal_keeps_the_records_pending(store) -> None:
    store.write_later(lambda tx: tx.execute("INSERT INTO no_such_table (v) VALUES ($v)", {"v": 1}))
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        store.settle()
    assert store._later.pending == 1
    with pytest.raises(sqlite3.OperationalError, match="no such table"):  # nor does a write overtake it
        store.write(_put("later", "1"))
    conn = sqlite3.connect(str(store.path))
    conn.execute("CREATE TABLE no_such_table (v INTEGER)")
    conn.commit()
    conn.close()
    store.settle()  # retried: now it applies
    assert store._later.pending == 0
    assert _outside(store.path) == []
    assert _outside(store.path, "SELECT v FROM no_such_table", ()) == [(1,)]


_KILLED = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from agentd.store import open_store
    s = open_store(__import__("pathlib").Path({db!r}))
    s.defer_writes(interval=3600)
    for i in range({n}):
        s.write_later(lambda tx, i=i: tx.execute("INSERT INTO settings (key, value) VALUES ($k, $v)",
                                                 {{"k": f"k{{i}}", "v": str(i)}}))
    print("journaled", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _killed_writer(db: Path, n: int) -> None:
    out = subprocess.run([sys.executable, "-c", _KILLED.format(root=str(ROOT), db=str(db), n=n)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == -9 and out.stdout == "journaled\n", out.stderr


def test_writes_of_a_killed_process_are_applied_once_by_the_next_open(tmp_path, caplog) -> None:
    db = tmp_path / "agentd.db"
    open_store(db).close()
    _killed_writer(db, 3)
    assert _outside(db) == []
    assert len(decode((tmp_path / "agentd.db-messages").read_bytes())) == 3
    with caplog.at_level(logging.INFO, logger="agentd.store"):
        s = open_store(db)
    assert [r.getMessage() for r in caplog.records if r.name == "agentd.store"] == [
        f"applying 3 message write(s) left in {tmp_path / 'agentd.db-messages'}"]
    try:
        assert _outside(db) == [("k0", 0), ("k1", 1), ("k2", 2)]
        assert (tmp_path / "agentd.db-messages").stat().st_size == 0
        assert s.get_setting(APPLIED_KEY) == {"seq": 3}
        s.defer_writes(interval=3600)
        s.write_later(_put("next", "9"))  # numbered after what was applied
        assert s._later.journal.read() == encode(4, [(INSERT, {"k": "next", "v": "9"})])
    finally:
        s.close()
    s = open_store(db)  # a clean close left nothing to apply twice
    s.close()
    assert _outside(db) == [("k0", 0), ("k1", 1), ("k2", 2), ("next", 9)]


def test_records_already_applied_are_skipped_when_the_journal_outlived_its_batch(tmp_path) -> None:
    db = tmp_path / "agentd.db"
    s = open_store(db)
    s.write(lambda tx: tx.execute(INSERT, {"k": APPLIED_KEY, "v": json.dumps({"seq": 2})}))
    s.close()
    # A crash after a batch committed, before the journal was emptied.
    (tmp_path / "agentd.db-messages").write_bytes(b"".join(
        encode(n, [(INSERT, {"k": f"k{n}", "v": str(n)})]) for n in (1, 2, 3)) + b"\x00\x00\x01")
    s = open_store(db)
    s.close()
    assert _outside(db) == [("k3", 3)]


def test_only_one_process_applies_a_journal_a_second_opener_writes_at_once(store) -> None:
    with pytest.raises(JournalBusy):
        Journal(_journal(store))
    other = open_store(store.path)
    try:
        other.defer_writes(interval=3600)
        assert other._journal is None and other._later is None
        assert other.write_later(_put("now", '"1"')) == 1
        assert _outside(store.path) == [("now", '"1"')]
    finally:
        other.close()


def test_close_applies_what_is_pending_and_empties_the_journal(tmp_path) -> None:
    s = open_store(tmp_path / "agentd.db")
    s.defer_writes(interval=3600)
    s.write_later(_put("a", "1"))
    s.write_later(_put("b", "2"))
    s.close()
    assert _outside(tmp_path / "agentd.db") == [("a", 1), ("b", 2)]
    assert (tmp_path / "agentd.db-messages").stat().st_size == 0


def test_a_journal_rewritten_keeps_its_records_and_its_lock(tmp_path) -> None:
    j = Journal(tmp_path / "j")
    j.append(encode(1, [("A", {})]))
    j.rewrite([encode(2, [("B", {})]), encode(3, [("C", {})])])
    assert decode(j.read()) == [(2, [("B", {})]), (3, [("C", {})])]
    assert not (tmp_path / "j.tmp").exists()
    with pytest.raises(JournalBusy):
        Journal(tmp_path / "j")
    j.append(encode(4, [("D", {})]))
    assert [seq for seq, _ in decode((tmp_path / "j").read_bytes())] == [2, 3, 4]
    j.close()
    Journal(tmp_path / "j").close()  # released


def test_a_long_pending_journal_is_rewritten_past_its_size_bound(store, monkeypatch) -> None:
    monkeypatch.setattr(deferred, "REWRITE_BYTES", 10)
    later = store._later
    store.write_later(_put("a", "1"))
    store.write_later(_put("b", "2"))
    batch = threading.Thread(target=later.apply)
    with store._writer.held():  # the batch takes its records, then waits for the writer
        batch.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                f.f_code.co_name == "run_own" for f in _frames(batch)):
            time.sleep(0.001)
        store.write_later(_put("c", "3"))  # journaled while the batch is applied
    batch.join(10)
    assert _outside(store.path) == [("a", 1), ("b", 2)]
    assert later.journal.read() == encode(3, [(INSERT, {"k": "c", "v": "3"})])  # rewritten to it alone
    assert later.pending == 1


def test_the_batch_thread_is_named_and_never_holds_the_process_up(store) -> None:
    thread = store._later._thread
    assert thread.name == "agentd-run-writes" and thread.daemon and thread.is_alive()


def _wait_for(check, what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_a_lone_record_and_one_journaled_during_a_batch_are_applied_by_the_thread(tmp_path) -> None:
    s = open_store(tmp_path / "agentd.db")
    s.defer_writes(interval=0.01)
    try:
        s.write_later(_put("alone", "1"))
        _wait_for(lambda: _outside(s.path) == [("alone", 1)], "the first record's batch")
        s.write_later(_put("a", "2"))
        with s._writer.held():  # the thread's batch takes "a", then waits for the writer
            _wait_for(lambda: any(f.f_code.co_name == "run_own" for f in _frames(s._later._thread)),
                      "the batch to wait for the writer")
            s.write_later(_put("b", "3"))  # journaled meanwhile: nothing else comes after it
        _wait_for(lambda: _outside(s.path) == [("alone", 1), ("a", 2), ("b", 3)], "the record left pending")
        assert s._later.pending == 0
    finally:
        s.close()


def test_a_failing_batch_is_logged_kept_and_retried_by_the_thread(tmp_path, caplog, monkeypatch) -> None:
    monkeypatch.setattr(deferred, "RETRY_SECS", 0.01)
    s = open_store(tmp_path / "agentd.db")
    s.defer_writes(interval=0.01)
    try:
        with caplog.at_level(logging.WARNING, logger="agentd.store"):
            s.write_later(lambda tx: tx.execute("INSERT INTO later_table (v) VALUES ($v)", {"v": 1}))
            _wait_for(lambda: caplog.records, "the warning")
        assert caplog.records[0].getMessage() == (
            "applying message writes failed (kept, retried in 0.01 s): no such table: later_table")
        assert s._later.pending == 1
        conn = sqlite3.connect(str(s.path))
        conn.execute("CREATE TABLE later_table (v INTEGER)")
        conn.commit()
        conn.close()
        _wait_for(lambda: s._later.pending == 0, "the retried batch")
        assert _outside(s.path, "SELECT v FROM later_table", ()) == [(1,)]
    finally:
        s.close()


def test_a_closed_batcher_refuses_and_a_stuck_record_stays_for_the_next_start(tmp_path, caplog) -> None:
    s = open_store(tmp_path / "agentd.db")
    s.defer_writes(interval=3600)
    later = s._later
    s.write_later(lambda tx: tx.execute("INSERT INTO not_yet (v) VALUES ($v)", {"v": 7}))
    with caplog.at_level(logging.ERROR, logger="agentd.store"):
        s.close()  # logs, does not raise: the record is kept
    assert [r.getMessage() for r in caplog.records] == [
        f"1 message write(s) could not be applied and stay in {tmp_path / 'agentd.db-messages'} "
        "for the next start: no such table: not_yet"]
    with pytest.raises(sqlite3.ProgrammingError, match="^the store is closed$"):
        later.record(_put("x", "1"))
    assert len(decode((tmp_path / "agentd.db-messages").read_bytes())) == 1
    conn = sqlite3.connect(str(tmp_path / "agentd.db"))
    conn.execute("CREATE TABLE not_yet (v INTEGER)")
    conn.commit()
    conn.close()
    open_store(tmp_path / "agentd.db").close()
    assert _outside(tmp_path / "agentd.db", "SELECT v FROM not_yet", ()) == [(7,)]


def test_the_journal_is_the_users_alone_and_says_which_file_is_busy(store) -> None:
    assert _journal(store).stat().st_mode & 0o777 == 0o600
    with pytest.raises(JournalBusy, match=f"^{_journal(store)}$"):
        Journal(_journal(store))


def _frames(thread: threading.Thread):
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        yield frame
        frame = frame.f_back
