"""agentd.store.checkpoint: the WAL is checkpointed on the store's own thread, not by a request.

Real SQLite files in a temp dir; nothing asserts on time (waits poll with a deadline)."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path

import pytest
from pony import orm

from agentd.store.checkpoint import AUTOCHECKPOINT_PAGES, CHECKPOINT_SECS, WalCheckpointer
from agentd.store.db import open_store
from support import wait_until

WAIT = 10.0


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "agentd-wal-checkpoint"]


_written = [0]


def _write(store, n: int) -> None:
    for _ in range(n):  # one commit each: each appends frames to the log
        _written[0] += 1
        store.set_setting(f"k{_written[0]}", "x" * 2000)


def test_the_stores_connections_leave_checkpoints_to_the_thread(tmp_path: Path) -> None:
    store = open_store(tmp_path / "a.db")
    try:
        assert AUTOCHECKPOINT_PAGES == 10_000 and CHECKPOINT_SECS == 0.5
        with orm.db_session:
            cursor = store.db.get_connection().cursor()
            assert cursor.execute("PRAGMA wal_autocheckpoint").fetchone() == (AUTOCHECKPOINT_PAGES,)
            assert cursor.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        # 700 commits of ~2 KB: past SQLite's default mark of 1,000 pages, and none of them
        # checkpointed the log (no checkpointer runs here).
        _write(store, 700)
        assert Path(f"{tmp_path / 'a.db'}-wal").stat().st_size > 1000 * (4096 + 24)
        checker = WalCheckpointer(tmp_path / "a.db")
        conn = sqlite3.connect(str(tmp_path / "a.db"), isolation_level=None)
        try:
            assert checker.checkpoint(conn) is True
            busy, in_log, done = checker.last
            assert busy == 0 and in_log == done and in_log > 1000
            assert checker.checkpoints == 1
        finally:
            conn.close()
    finally:
        store.close()


def test_the_writers_connection_leaves_checkpoints_to_the_thread_too(tmp_path: Path) -> None:
    # Every message's session rows go through the store's writer, on a connection of its
    # own: with SQLite's default mark there, requests checkpointed every 1,000 pages anyway.
    store = open_store(tmp_path / "w.db")
    try:
        for i in range(700):
            store.write(lambda tx, i=i: tx.execute(
                "INSERT INTO settings (key, value) VALUES ($k, $v)", {"k": f"w{i}", "v": '"' + "x" * 2000 + '"'}))
        checker = WalCheckpointer(tmp_path / "w.db")
        conn = sqlite3.connect(str(tmp_path / "w.db"), isolation_level=None)
        try:  # all 700 commits' frames are still in the log: none of them checkpointed it
            assert checker.checkpoint(conn) is True and checker.last[1] > 1000
        finally:
            conn.close()
        assert store._writer.conn.execute("PRAGMA wal_autocheckpoint").fetchone() == (AUTOCHECKPOINT_PAGES,)
        assert store._writer.conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
        assert store._writer.conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
        assert store.get_setting("w699") == "x" * 2000
    finally:
        store.close()


def test_each_look_copies_what_came_since(tmp_path: Path) -> None:
    store = open_store(tmp_path / "b.db")
    checker = WalCheckpointer(tmp_path / "b.db")
    conn = sqlite3.connect(str(tmp_path / "b.db"), isolation_level=None)
    try:
        _write(store, 5)
        assert checker.checkpoint(conn) is True
        first = checker.last
        assert first[0] == 0 and first[1] == first[2] > 0
        assert checker.checkpoint(conn) is True and checker.last == first  # nothing new, nothing copied
        _write(store, 1)  # the log starts again from its beginning
        assert checker.checkpoint(conn) is True
        assert checker.checkpoints == 3 and 0 < checker.last[1] == checker.last[2] < first[1]
    finally:
        conn.close()
        store.close()


def test_each_look_ends_with_commits_held_off(tmp_path: Path) -> None:
    # A look that finds frames in the log ends with a second pass while the store's commits
    # are held off, so it ends with all of the log copied, whatever came in meanwhile.
    store = open_store(tmp_path / "q.db")
    entered: list[int] = []

    @contextlib.contextmanager
    def quiet():
        entered.append(1)
        with store._writes_held():
            yield

    checker = WalCheckpointer(tmp_path / "q.db", quiet=quiet)
    conn = sqlite3.connect(str(tmp_path / "q.db"), isolation_level=None)
    try:
        assert isinstance(store._writes_held(), contextlib.nullcontext)  # no run writer yet
        _write(store, 3)
        assert checker.checkpoint(conn) is True
        assert len(entered) == 1 and checker.last[0] == 0 and checker.last[1] == checker.last[2] > 0
        _write(store, 1)  # the log starts again from its beginning: all of it had been copied
        assert checker.checkpoint(conn) is True
        assert len(entered) == 2 and 0 < checker.last[1] == checker.last[2] <= 4
        _write(store, 1)
        # An empty log (truncated here): no pass with commits held.
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert checker.checkpoint(conn) is True and checker.last == (0, 0, 0) and len(entered) == 2
        store.write(lambda tx: tx.execute("DELETE FROM settings WHERE key = 'none'", {}))
        assert store._writes_held() is store._writer.held()  # the run writer's own lock
    finally:
        conn.close()
        store.close()


def test_under_steady_commits_the_log_still_starts_again(tmp_path: Path) -> None:
    # Commits from several threads without a pause: each look's last pass, with commits
    # held, copies all of the log, so the first commit after the look starts it again from
    # its beginning and the file stays small. (Before, the log grew to the 10,000-page
    # backstop and a request checkpointed it: about 41 MB here.)
    store = open_store(tmp_path / "s.db")
    store.write(lambda tx: tx.execute("INSERT INTO settings (key, value) VALUES ('s', '1')", {}))
    writer = store._writer
    wal = Path(f"{tmp_path / 's.db'}-wal")

    def salt() -> bytes:  # SQLite draws a new one each time it starts the log again
        with wal.open("rb") as fh:
            return fh.read(24)[16:24]

    # (commits, salt) where each look's held pass ended and where the next look began. How
    # many commits fall between two looks is up to the scheduler, so the test waits for
    # looks with at least one commit between them and asserts on those alone.
    marks: list[tuple[str, int, bytes]] = []

    @contextlib.contextmanager
    def quiet():
        with store._writes_held():
            yield
            marks.append(("held", writer.commits, salt()))

    checker = WalCheckpointer(tmp_path / "s.db", interval=0.02, quiet=quiet)
    look = checker.checkpoint

    def recorded(conn: sqlite3.Connection) -> bool:
        marks.append(("look", writer.commits, salt()))
        return look(conn)

    def committed_after_a_look() -> list[tuple[bytes, bytes]]:
        seen = list(marks)
        return [(a[2], b[2]) for a, b in zip(seen, seen[1:]) if a[0] == "held" and b[0] == "look" and b[1] > a[1]]

    stop = threading.Event()

    def commits(j: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            store.write(lambda tx: tx.execute("INSERT INTO settings (key, value) VALUES ($k, $v)",
                                              {"k": f"s{j}-{i}", "v": '"' + "y" * 300 + '"'}))

    threads = [threading.Thread(target=commits, args=(j,)) for j in range(4)]
    checker.checkpoint = recorded  # type: ignore[method-assign]
    checker.start()
    try:
        for t in threads:
            t.start()
        wait_until(lambda: len(committed_after_a_look()) >= 8, "8 looks each followed by a commit", WAIT)
        checker.stop()
        pairs = committed_after_a_look()
        # The first commit after each look started the log again (without the held pass,
        # commits that came in while it copied kept the log growing to the backstop).
        assert [held != found for held, found in pairs] == [True] * len(pairs), pairs
    finally:
        stop.set()
        for t in threads:
            if t.is_alive():
                t.join()
        checker.stop()
        store.close()


def test_a_log_a_reader_still_needs_is_copied_later(tmp_path: Path) -> None:
    store = open_store(tmp_path / "c.db")
    checker = WalCheckpointer(tmp_path / "c.db")
    conn = sqlite3.connect(str(tmp_path / "c.db"), isolation_level=None)
    reader = sqlite3.connect(str(tmp_path / "c.db"), isolation_level=None)
    try:
        _write(store, 2)
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM settings").fetchone()[0] >= 2  # holds its snapshot
        _write(store, 3)
        assert checker.checkpoint(conn) is True
        assert checker.last[2] < checker.last[1]  # the reader's snapshot kept the newest frames
        reader.execute("COMMIT")
        assert checker.checkpoint(conn) is True
        assert checker.last[1] == checker.last[2]
    finally:
        reader.close()
        conn.close()
        store.close()


def test_a_failed_checkpoint_is_logged_and_tried_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(tmp_path / "d.db")
    checker = WalCheckpointer(tmp_path / "d.db")
    conn = sqlite3.connect(str(tmp_path / "d.db"), isolation_level=None)
    try:
        _write(store, 2)
        conn.close()  # a closed connection: the PRAGMA fails
        with caplog.at_level("WARNING", logger="agentd.store"):
            assert checker.checkpoint(conn) is False
        assert checker.checkpoints == 0 and checker.last is None
        assert [r.getMessage() for r in caplog.records] == [
            f"WAL checkpoint of {tmp_path / 'd.db'} failed: Cannot operate on a closed database."]
        conn = sqlite3.connect(str(tmp_path / "d.db"), isolation_level=None)
        assert checker.checkpoint(conn) is True and checker.last[1] == checker.last[2] > 0
    finally:
        conn.close()
        store.close()


def test_the_store_runs_its_checkpointer_until_closed(tmp_path: Path) -> None:
    before = len(_threads())
    store = open_store(tmp_path / "e.db")
    store.start_checkpoints()
    checker = store.checkpointer
    assert checker is not None and checker.interval == CHECKPOINT_SECS
    store.start_checkpoints()  # a second start changes nothing
    assert store.checkpointer is checker and len(_threads()) == before + 1
    assert checker._thread.daemon  # never holds the process open
    _write(store, 20)
    # The thread's own checkpoint copied the 20 commits (a database not in WAL mode, or
    # another file, would answer (0, -1, -1)).
    wait_until(lambda: checker.last is not None and checker.last[0] == 0 and checker.last[1] == checker.last[2] >= 20,
               "the thread's checkpoint of 20 commits", WAIT)
    store.close()
    assert store.checkpointer is None and len(_threads()) == before


def test_the_kernel_starts_and_stops_the_checkpointer(tmp_path: Path) -> None:
    from agentd.config import parse_config
    from agentd.kernel import Kernel

    before = len(_threads())
    kernel = Kernel.open(parse_config({"memory": {"auto_remember": False}}, tmp_path))
    try:
        assert kernel.store.checkpointer is not None and len(_threads()) == before + 1
    finally:
        kernel.close()
    assert len(_threads()) == before


def test_postgresql_has_no_checkpointer(tmp_path: Path) -> None:
    from agentd.store.db import Store

    before = len(_threads())
    store = Store(db=None, e=None, path=tmp_path / "unused", backend="postgres")  # type: ignore[arg-type]
    store.start_checkpoints()
    assert store.checkpointer is None and len(_threads()) == before
