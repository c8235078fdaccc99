"""Each SQLite connection's page cache is bounded (agentd.store.checkpoint.PAGE_CACHE_KIB), and
GET /api/health/detail reports the bound and SQLite's heap.

Real SQLite files in a temp dir and a real daemon."""

from __future__ import annotations

from pathlib import Path

import pgtest
from pony import orm

from agentd.store.checkpoint import PAGE_CACHE_KIB
from agentd.store.db import open_store
from agentd.store.sqlite_memory import sqlite_heap_kib
from support import FAST_API, Daemon, make_home


def test_every_connection_of_the_store_has_the_bound(tmp_path: Path) -> None:
    assert PAGE_CACHE_KIB == 512
    store = open_store(tmp_path / "a.db")
    try:
        store.write(lambda tx: tx.execute("INSERT INTO settings (key, value) VALUES ('k', '1')", {}))
        with orm.db_session:
            pony = store.db.get_connection().execute("PRAGMA cache_size").fetchone()
        assert pony == (-512,)
        assert store._writer.conn.execute("PRAGMA cache_size").fetchone() == (-512,)
    finally:
        store.close()


def test_reading_a_large_database_fills_the_cache_to_the_bound_only(tmp_path: Path) -> None:
    store = open_store(tmp_path / "big.db")
    try:
        # 8 MB of rows, four times SQLite's own default bound of 2,000 KiB.
        for i in range(8):
            store.write(lambda tx, i=i: [tx.execute("INSERT INTO settings (key, value) VALUES ($k, $v)",
                                                    {"k": f"k{i}-{j}", "v": '"' + "x" * 1000 + '"'})
                                         for j in range(1000)])
        store.close()
        store = open_store(tmp_path / "big.db")
        with orm.db_session:
            conn = store.db.get_connection()
            before = sqlite_heap_kib()
            assert conn.execute("SELECT COUNT(*), SUM(LENGTH(value)) FROM settings").fetchone()[0] >= 8000
            grown = sqlite_heap_kib() - before
        # The pages read stay in the cache up to the bound (and SQLite's own bound, 2,000 KiB,
        # would have kept about four times as much).
        assert PAGE_CACHE_KIB * 0.8 < grown < PAGE_CACHE_KIB * 1.5, grown
    finally:
        store.close()


def test_the_daemon_reports_the_bound_and_sqlites_heap(tmp_path: Path) -> None:
    daemon = Daemon(make_home(tmp_path, FAST_API)).start()
    try:
        detail = daemon.get("/api/health/detail").json()
        if pgtest.ENABLED:  # no SQLite in the daemon
            assert (detail["sqlite_page_cache_kib"], detail["sqlite_heap_kib"]) == (None, None)
        else:
            assert detail["sqlite_page_cache_kib"] == 512
            assert isinstance(detail["sqlite_heap_kib"], int) and 100 < detail["sqlite_heap_kib"] < 100_000
    finally:
        daemon.stop()
