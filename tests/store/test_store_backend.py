"""The store's backends: database_url / AGENTD_DATABASE_URL, schema versions, the migration
lock (several daemons starting at once on one empty PostgreSQL database), secrets in URLs.

The PostgreSQL tests use a real server: the suite's temp cluster (tests/pgtest.py), started
on first use whatever backend the rest of the suite runs on.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import struct
import uuid
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import psycopg2
import pytest

import pgtest
from support import FAST_API, Daemon, free_port, make_home, run_cli

from agentd.config import load_config, parse_config
from agentd.errors import ConfigError
from agentd.store.backend import has_password, mask_url, parse_database_url
from agentd.store.migrate import SCHEMA_VERSION

SECRET = "s3cr3t-Pa55"
T0 = datetime(2026, 1, 1)


# -- the URL -------------------------------------------------------------------------------

def test_mask_url_hides_password_everywhere() -> None:
    assert mask_url(f"postgresql://app:{SECRET}@db.example:5433/agentd") == \
        "postgresql://app:***@db.example:5433/agentd"
    assert mask_url(f"postgresql://app@db/agentd?sslmode=require&password={SECRET}") == \
        "postgresql://app@db/agentd?sslmode=require&password=***"
    assert mask_url("postgresql://app@db/agentd") == "postgresql://app@db/agentd"
    assert has_password(f"postgresql://app:{SECRET}@db/agentd")
    assert has_password(f"postgresql://app@db/agentd?password={SECRET}")
    assert not has_password("postgresql://app@db/agentd?sslmode=require")


def test_config_database_url_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_config({}, tmp_path).database is None
    cfg = parse_config({"database_url": "postgresql://app@db.example/agentd"}, tmp_path)
    assert cfg.database.url == "postgresql://app@db.example/agentd"
    with pytest.raises(ConfigError) as err:
        parse_config({"database_url": f"postgresql://app:{SECRET}@db/agentd"}, tmp_path)
    assert "must not contain a password" in err.value.message and SECRET not in err.value.message
    with pytest.raises(ConfigError, match="must be a postgresql:// URL"):
        parse_config({"database_url": "mysql://app@db/agentd"}, tmp_path)
    with pytest.raises(ConfigError, match="names no database"):
        parse_config({"database_url": "postgresql://app@db"}, tmp_path)
    with pytest.raises(ConfigError, match="database_url: expected a string"):
        parse_config({"database_url": 5}, tmp_path)
    # The environment wins over config.toml, and may carry the password.
    (tmp_path / "config.toml").write_text('database_url = "postgresql://app@one/agentd"\n')
    monkeypatch.setenv("AGENTD_DATABASE_URL", f"postgresql://app:{SECRET}@two/agentd")
    assert load_config(tmp_path).database.url == f"postgresql://app:{SECRET}@two/agentd"
    monkeypatch.delenv("AGENTD_DATABASE_URL")
    assert load_config(tmp_path).database.url == "postgresql://app@one/agentd"


def test_start_refuses_password_in_config_toml(tmp_path: Path) -> None:
    # A top-level key: before FAST_API's [api] table.
    home = make_home(tmp_path, f'database_url = "postgresql://app:{SECRET}@127.0.0.1/agentd"\n' + FAST_API)
    result = run_cli(home, "start", port=free_port(), timeout=60)
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert "database_url: must not contain a password" in out
    assert SECRET not in out


def test_start_fails_clearly_when_server_unreachable(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    url = f"postgresql://app:{SECRET}@127.0.0.1:{free_port()}/agentd"
    result = run_cli(home, "start", port=free_port(), timeout=60, env_extra={"AGENTD_DATABASE_URL": url})
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert "cannot connect to database postgresql://app:***@127.0.0.1:" in out
    assert SECRET not in out


# -- schema versions -----------------------------------------------------------------------

def _sqlite_versions(path: Path) -> list[tuple]:
    conn = sqlite3.connect(str(path))
    try:
        return conn.execute("SELECT version, description FROM agentd_schema ORDER BY version").fetchall()
    finally:
        conn.close()


def test_sqlite_schema_is_versioned_and_old_databases_adopted(tmp_path: Path) -> None:
    from agentd.store import open_store
    from agentd.store.db import StoreError

    path = tmp_path / "agentd.db"
    open_store(path).close()
    assert _sqlite_versions(path) == [(v, "created by agentd") for v in range(1, SCHEMA_VERSION + 1)]
    # A database from before versioning (tables, no version table) is version 1.
    conn = sqlite3.connect(str(path))
    conn.execute("DROP TABLE agentd_schema")
    conn.execute("ALTER TABLE uploads DROP COLUMN content")  # what schema 2 added
    conn.commit()
    conn.close()

    open_store(path).close()
    rows = _sqlite_versions(path)
    assert rows[0] == (1, "existing schema adopted by agentd")
    assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))
    conn = sqlite3.connect(str(path))
    stamps = [r[0] for r in conn.execute("SELECT applied_at FROM agentd_schema")]
    conn.close()
    assert all(datetime.fromisoformat(t).utcoffset().total_seconds() == 0 for t in stamps), stamps
    # A database at this daemon's version opens as it is; one a version newer does not.
    open_store(path).close()
    assert _sqlite_versions(path) == rows
    conn = sqlite3.connect(str(path))
    conn.execute("INSERT INTO agentd_schema VALUES (?, 'x', 'from the future')", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(StoreError) as err:
        open_store(path)
    assert err.value.message == (f"database {path}: database schema version {SCHEMA_VERSION + 1} is newer "
                                 f"than this agentd's ({SCHEMA_VERSION}); upgrade agentd")


def test_start_refuses_newer_schema(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    daemon = Daemon(home).start()
    assert daemon.stop() == 0
    if pgtest.ENABLED:  # the suite's switch gives this home a PostgreSQL database
        with psycopg2.connect(pgtest.url_for_home(home)) as pg, pg.cursor() as cur:
            cur.execute("INSERT INTO agentd_schema VALUES (99, 'x', 'from the future')")
    else:
        conn = sqlite3.connect(str(home / "data" / "agentd.db"))
        conn.execute("INSERT INTO agentd_schema VALUES (99, 'x', 'from the future')")
        conn.commit()
        conn.close()
    result = run_cli(home, "start", port=free_port(), timeout=60)
    assert result.returncode == 1
    assert f"database schema version 99 is newer than this agentd's ({SCHEMA_VERSION})" in \
        result.stdout + result.stderr


# -- PostgreSQL: several daemons, one empty database -----------------------------------------

def _pg_rows(url: str, sql: str) -> list[tuple]:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


@pytest.mark.slow
def test_three_daemons_start_at_once_on_one_empty_database(tmp_path: Path) -> None:
    url = pgtest.databases().new_url()
    daemons = [Daemon(make_home(tmp_path / f"d{i}"), env_extra={"AGENTD_DATABASE_URL": url})
               for i in range(3)]
    for daemon in daemons:
        daemon.start(wait=False)  # all three race for the empty schema
    for daemon in daemons:
        daemon.wait_healthy(timeout=60)
    for daemon in daemons:
        detail = daemon.get("/api/health/detail").json()
        assert detail["database"] == "connected"
    # One creation recorded, and every table there once.
    assert _pg_rows(url, "SELECT version, description FROM agentd_schema ORDER BY version") == \
        [(v, "created by agentd") for v in range(1, SCHEMA_VERSION + 1)]
    tables = {r[0] for r in _pg_rows(url, "SELECT table_name FROM information_schema.tables "
                                          "WHERE table_schema = 'public'")}
    assert {"agents", "sessions", "memory_kv", "usage", "workflows", "workflow_runs", "audit",
            "memory_fragments", "kg_entities", "kg_relations", "settings", "agentd_schema"} <= tables
    # The data lives in PostgreSQL, not in the homes.
    created = daemons[0].post("/api/agents", json={"manifest_toml": 'name = "pg-one"\n'})
    assert created.status_code == 201, created.text
    assert _pg_rows(url, "SELECT name FROM agents") == [("pg-one",)]
    for daemon in daemons:
        assert not (daemon.home / "data" / "agentd.db").exists()
        assert daemon.stop() == 0


def test_the_documented_setup_gives_a_database_a_daemon_runs_on(tmp_path: Path) -> None:
    """docs/postgresql.md's one-time setup, run as written by the superuser, makes a role and
    a database on which a daemon logging in as that role creates its tables and keeps data."""
    import re
    import subprocess
    from urllib.parse import urlsplit

    page = (Path(__file__).resolve().parents[2] / "docs" / "postgresql.md").read_text()
    setup = re.search(r"```sh\n(createuser[^`]*)```", page).group(1)
    admin = urlsplit(pgtest.databases().admin_url)
    env = {**os.environ, "PGHOST": admin.hostname, "PGPORT": str(admin.port), "PGUSER": admin.username or "postgres"}
    done = subprocess.run(["bash", "-e", "-c", setup], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    url = f"postgresql://agentd@{admin.hostname}:{admin.port}/agentd"
    try:
        daemon = Daemon(make_home(tmp_path, FAST_API), env_extra={"AGENTD_DATABASE_URL": url}).start()
        assert daemon.get("/api/health/detail").json()["database"] == "connected"
        assert daemon.post("/api/agents", json={"manifest_toml": 'name = "on-pg"\n'}).status_code == 201
        assert daemon.stop() == 0
        assert _pg_rows(url, "SELECT name FROM agents") == [("on-pg",)]
        assert _pg_rows(url, "SELECT tableowner FROM pg_tables WHERE tablename = 'agents'") == [("agentd",)]
    finally:
        pgtest.databases()._admin("DROP DATABASE IF EXISTS agentd WITH (FORCE)")
        pgtest.databases()._admin("DROP ROLE IF EXISTS agentd")


def test_password_from_environment_is_masked_in_the_log(tmp_path: Path) -> None:
    url = pgtest.databases().new_url()
    assert url.startswith("postgresql://postgres@"), url
    # The temp cluster trusts local connections, so any password is accepted: what matters
    # is that it never reaches the log.
    url = url.replace("postgres@", f"postgres:{SECRET}@", 1)
    home = make_home(tmp_path, 'log_level = "debug"\n' + FAST_API)
    daemon = Daemon(home, env_extra={"AGENTD_DATABASE_URL": url}).start()
    assert daemon.get("/api/health/detail").json()["database"] == "connected"
    assert daemon.stop() == 0
    log = daemon.log()
    assert "database: postgres postgresql://postgres:***@127.0.0.1:" in log
    assert SECRET not in log


def test_migration_2_moves_upload_files_into_the_database(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A schema-1 home (uploads as files) is migrated at start: bytes into `uploads.content`,
    files removed, version 2 recorded, and the upload still attaches."""
    from pony import orm

    from agentd.store import open_store

    path = tmp_path / "data" / "agentd.db"
    store = open_store(path)
    with orm.db_session:
        store.e.AgentRow(id="a1", name="old", manifest_toml='name = "old"\n', manifest={}, created_at=T0,
                         last_active=T0, session_id="s1")
    store.close()
    upload_file = tmp_path / "uploads" / "u1"
    upload_file.parent.mkdir()
    upload_file.write_bytes(b"\x00\x01old bytes\xff")
    # Turn it back into schema 1: no content column, the file path in the row.
    conn = sqlite3.connect(str(path))
    conn.execute("ALTER TABLE uploads DROP COLUMN content")
    conn.execute("DELETE FROM agentd_schema WHERE version > 1")
    conn.execute("INSERT INTO uploads (id, agent, filename, content_type, size, path, created_at) "
                 "VALUES ('u1', 'a1', 'old.bin', 'application/pdf', 12, ?, '2026-01-01 00:00:00')",
                 (str(upload_file),))
    conn.execute("INSERT INTO uploads (id, agent, filename, content_type, size, path, created_at) "
                 "VALUES ('u2', 'a1', 'gone.bin', 'application/pdf', 3, ?, '2026-01-01 00:00:00')",
                 (str(tmp_path / "uploads" / "missing"),))
    later_file = tmp_path / "uploads" / "u3"
    later_file.write_bytes(b"after the gap")
    conn.execute("INSERT INTO uploads (id, agent, filename, content_type, size, path, created_at) "
                 "VALUES ('u3', 'a1', 'later.bin', 'application/pdf', 13, ?, '2026-01-01 00:00:00')",
                 (str(later_file),))
    conn.commit()
    conn.close()
    caplog.set_level(logging.INFO, logger="agentd.store")
    store = open_store(path)
    assert [r.getMessage() for r in caplog.records if r.name == "agentd.store"][:4] == [
        "migrating database schema to version 2",
        f"upload u2: file {tmp_path / 'uploads' / 'missing'} is gone; the upload stays without content",
        "migrating database schema to version 3", "migrating database schema to version 4"]
    with orm.db_session:
        assert store.e.UploadRow["u3"].content == b"after the gap", "BUG: a missing file stopped the move"
        moved = store.e.UploadRow["u1"]
        assert (moved.content, moved.path) == (b"\x00\x01old bytes\xff", "")
        gone = store.e.UploadRow["u2"]
        assert gone.content is None and gone.path.endswith("missing")
    store.close()
    assert not upload_file.exists()
    assert [r[0] for r in _sqlite_versions(path)] == list(range(1, SCHEMA_VERSION + 1))
    assert _sqlite_versions(path)[1] == (2, "migrated by agentd")


COORDINATION = {"cluster_leases", "cluster_daemons", "agent_runs", "cluster_approvals"}


def _execute(path: Path, url: str | None, statements: list[str]) -> None:
    """Run `statements` on the SQLite file at `path`, or the PostgreSQL database at `url`."""
    if url:
        with psycopg2.connect(url) as pg, pg.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
        return
    conn = sqlite3.connect(str(path))
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()


@contextlib.contextmanager
def _upgraded(tmp_path: Path, backend: str, caplog: pytest.LogCaptureFixture,
              statements: list[str]) -> Iterator[tuple[Any, list[str]]]:
    """A store opened on a new database that `statements` first took back to an older
    schema (its rows as an earlier agentd left them): the store and what it logged."""
    from agentd.store import open_store

    path = tmp_path / "data" / "agentd.db"
    url = pgtest.databases().new_url() if backend == "postgres" else None
    target = parse_database_url(url, "test", allow_password=True) if url else None
    open_store(path, target).close()
    _execute(path, url, statements)
    caplog.set_level(logging.INFO, logger="agentd.store")
    store = open_store(path, target)
    try:
        yield store, [r.getMessage() for r in caplog.records if r.name == "agentd.store"]
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_schema_probe_sees_tables_and_columns_of_this_schema_alike_on_both_backends(tmp_path: Path,
                                                                                       backend: str) -> None:
    from agentd.store.schema_probe import column_exists, param, table_exists

    url = pgtest.databases().new_url() if backend == "postgres" else None
    # On PostgreSQL a table of another schema, by the same name, is not this database's.
    _execute(tmp_path / "probe.db", url, ["CREATE TABLE things (id INTEGER, label TEXT)"] + (
        ["CREATE SCHEMA elsewhere", "CREATE TABLE elsewhere.others (id INTEGER, hidden TEXT)"] if url else []))
    conn = psycopg2.connect(url) if url else sqlite3.connect(str(tmp_path / "probe.db"))
    try:
        cur = conn.cursor()
        assert param(backend) == ("%s" if url else "?")
        assert [table_exists(cur, backend, name) for name in ("things", "others", "missing")] == [True, False, False]
        assert [column_exists(cur, backend, "things", name) for name in ("id", "label", "hidden")] == [True, True, False]
        assert column_exists(cur, backend, "others", "hidden") is False
        cur.execute(f"INSERT INTO things (id, label) VALUES ({param(backend)}, {param(backend)})", (1, "one"))
        cur.execute("SELECT label FROM things")
        assert cur.fetchall() == [("one",)]
    finally:
        conn.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migration_4_moves_session_messages_into_rows(tmp_path: Path, backend: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A schema-3 database (each session one JSON array in `sessions.messages`) is migrated
    in place: every message becomes a row of `session_messages` in order, as its own JSON
    text; empty sessions get none; rows of a move cut off midway are written again, not
    twice; the column goes, version 4 is recorded, and the agent goes on appending."""
    from pony import orm

    from agentd.store import open_store

    path = tmp_path / "data" / "agentd.db"
    url = pgtest.databases().new_url() if backend == "postgres" else None
    target = parse_database_url(url, "test", allow_password=True) if url else None
    store = open_store(path, target)
    with orm.db_session:
        agent = store.e.AgentRow(id="a1", name="old", manifest_toml='name = "old"\n', manifest={}, created_at=T0,
                                 last_active=T0, session_id="s1")
        for sid in ("s1", "s2", "s3", "s4"):
            store.e.SessionRow(id=sid, agent=agent, created_at=T0)
    store.close()
    old = [{"role": "user", "content": "grüß \"dich\""}, {"role": "assistant", "content": "a", "tool_calls": []},
           {"role": "tool", "content": "r", "tool_call_id": "c1"}]
    text = json.dumps(old).replace("'", "''")
    # Back to schema 3: the JSON column, no rows table, and a half-done move of s4.
    _execute(path, url, [
        "DROP TABLE session_messages", "DELETE FROM agentd_schema WHERE version > 3",
        "ALTER TABLE sessions ADD COLUMN messages TEXT",
        f"UPDATE sessions SET messages = '{text}' WHERE id IN ('s1', 's4')",
        "UPDATE sessions SET messages = '[]' WHERE id = 's2'", "UPDATE sessions SET messages = '' WHERE id = 's3'"])
    store = open_store(path, target)
    store.close()
    _execute(path, url, ["DELETE FROM session_messages WHERE session <> 's4'", "DELETE FROM agentd_schema WHERE version > 3",
                         "ALTER TABLE sessions ADD COLUMN messages TEXT",
                         f"UPDATE sessions SET messages = '{text}' WHERE id = 's1'",
                         f"UPDATE sessions SET messages = '{text}' WHERE id = 's4'"])
    caplog.set_level(logging.INFO, logger="agentd.store")
    store = open_store(path, target)
    assert [r.getMessage() for r in caplog.records if r.name == "agentd.store"] == [
        "migrating database schema to version 4", "migrating database schema to version 5",
        "migrating database schema to version 6", "migrating database schema to version 7",
        "migrating database schema to version 8",
        "migrating database schema to version 9", "migrating database schema to version 10",
        "migrating database schema to version 11",
        "session s1: 3 messages moved to rows", "session s4: 3 messages moved to rows"]
    try:
        with orm.db_session:
            rows = store.raw_rows("SELECT session, body FROM session_messages ORDER BY id", {})
            columns = list(store.db.select(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name = 'sessions'") if url else [r[1] for r in store.raw_rows("PRAGMA table_info(sessions)", {})])
            versions = list(store.db.select("SELECT version, description FROM agentd_schema ORDER BY version"))
    finally:
        store.close()
    bodies = [json.dumps(m, ensure_ascii=False) for m in old]
    assert sorted(rows) == sorted([("s1", b) for b in bodies] + [("s4", b) for b in bodies])
    assert [b for s, b in rows if s == "s1"] == bodies and [b for s, b in rows if s == "s4"] == bodies
    assert "messages" not in columns
    assert [tuple(v) for v in versions][3:] == [(4, "migrated by agentd"), (5, "migrated by agentd"),
                                                (6, "migrated by agentd"), (7, "migrated by agentd"),
                                                (8, "migrated by agentd"), (9, "migrated by agentd"),
                                                (10, "migrated by agentd"),
                                                (11, "migrated by agentd")]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migration_3_gives_workflow_runs_an_owner_and_versions_the_cluster_tables(tmp_path: Path,
                                                                                 backend: str) -> None:
    """A schema-2 database (workflow runs without owners; coordination tables made by the
    daemons at start, or not yet) is migrated in place: `workflow_runs.daemon_id` added
    (old runs get none), the coordination tables created, version 3 recorded."""
    from pony import orm

    from agentd.store import open_store
    from agentd.workflows.store import WorkflowStore

    path = tmp_path / "data" / "agentd.db"
    url = pgtest.databases().new_url() if backend == "postgres" else None
    target = parse_database_url(url, "test", allow_password=True) if url else None
    open_store(path, target).close()
    # Back to schema 2: no owner column, no coordination tables, one old run.
    statements = ["ALTER TABLE workflow_runs DROP COLUMN daemon_id", "DELETE FROM agentd_schema WHERE version > 2",
                  *(f"DROP TABLE {t}" for t in sorted(COORDINATION)),
                  "INSERT INTO workflow_runs (id, workflow_id, workflow_name, status, input, step_results, "
                  "steps_completed, created_at) VALUES ('r1', 'w1', 'old', 'running', 'x', '[]', 0, "
                  "'2026-01-01 00:00:00')"]
    if url:
        with psycopg2.connect(url) as pg, pg.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    else:
        conn = sqlite3.connect(str(path))
        for statement in statements:
            conn.execute(statement)
        conn.commit()
        conn.close()
    store = open_store(path, target)
    try:
        run = WorkflowStore(store).run("r1")
        assert run["daemon_id"] is None and run["state"] == {"status": "running"}
        with orm.db_session:
            tables = set(store.db.select("SELECT table_name FROM information_schema.tables "
                                         "WHERE table_schema = current_schema()") if url else
                         store.db.select("SELECT name FROM sqlite_master WHERE type = 'table'"))
            versions = list(store.db.select("SELECT version, description FROM agentd_schema ORDER BY version"))
    finally:
        store.close()
    assert COORDINATION <= tables
    assert [tuple(v) for v in versions][2:] == [(3, "migrated by agentd"), (4, "migrated by agentd"),
                                                (5, "migrated by agentd"), (6, "migrated by agentd"),
                                                (7, "migrated by agentd"), (8, "migrated by agentd"),
                                                (9, "migrated by agentd"), (10, "migrated by agentd"),
                                                (11, "migrated by agentd")]
    assert [v[0] for v in versions] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] == list(range(1, SCHEMA_VERSION + 1))



def test_doctor_checks_the_postgresql_database(tmp_path: Path) -> None:
    def database_check(url: str) -> dict:
        r = run_cli(make_home(tmp_path / uuid.uuid4().hex), "doctor", "--json", port=free_port(),
                    env_extra={"AGENTD_DATABASE_URL": url})
        return {c["check"]: c for c in json.loads(r.stdout)}["database"]

    url = pgtest.databases().new_url()
    empty = database_check(url)
    assert empty["status"] == "warn" and "is empty; the schema is created on first start" in empty["message"]
    from agentd.store import open_store

    open_store(tmp_path / "unused.db", parse_database_url(url, "test", allow_password=True)).close()
    ready = database_check(url)
    assert ready == {"check": "database", "status": "ok",
                     "message": f"PostgreSQL {url}, schema version {SCHEMA_VERSION}"}
    down = database_check(f"postgresql://app:{SECRET}@127.0.0.1:{free_port()}/agentd")
    assert down["status"] == "fail" and "cannot connect to postgresql://app:***@127.0.0.1:" in down["message"]
    assert SECRET not in json.dumps(down)


def _indexes(store, url: str | None, table: str) -> set[str]:
    from pony import orm

    with orm.db_session:
        if url:
            return set(store.db.select("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
                                       "AND tablename = $t", {"t": table}))
        return set(store.db.select("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = $t",
                                   {"t": table}))


# What migration 7 says of the usage row the tests above insert at '2026-01-01 00:00:00'
# (SQLite text without a fraction; PostgreSQL's timestamp needs no rewrite).
REWRITTEN_USAGE_TIME = {"sqlite": ["usage.at: 1 time(s) rewritten as naive UTC"], "postgres": []}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migration_5_drops_the_indexes_no_query_uses(tmp_path: Path, backend: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A schema-4 database (usage indexed on agent_id and model, every run record in the
    status index) is migrated in place to what a fresh database has: usage indexed on `at`
    only, run records' status index holding running ones only; rows stay, version 5 is
    recorded, and expired running records are still found and failed."""
    from pony import orm

    from agentd.store import open_store
    from agentd.store.leases import RunLog

    path = tmp_path / "data" / "agentd.db"
    url = pgtest.databases().new_url() if backend == "postgres" else None
    target = parse_database_url(url, "test", allow_password=True) if url else None
    store = open_store(path, target)
    fresh = {t: _indexes(store, url, t) for t in ("usage", "agent_runs")}
    store.close()
    pk = {"usage": "usage_pkey", "agent_runs": "agent_runs_pkey"} if url else \
        {"usage": None, "agent_runs": "sqlite_autoindex_agent_runs_1"}
    assert fresh["usage"] - {pk["usage"]} == {"idx_usage__at"}
    assert fresh["agent_runs"] - {pk["agent_runs"]} == {"agent_runs_running", "agent_runs_agent"}
    # Back to schema 4, with a usage row, a finished run and an expired running one.
    _execute(path, url, [
        "DELETE FROM agentd_schema WHERE version > 4", "DROP INDEX agent_runs_running",
        "CREATE INDEX agent_runs_status ON agent_runs (status, lease_expires)",
        "CREATE INDEX idx_usage__agent_id ON usage (agent_id)", "CREATE INDEX idx_usage__model ON usage (model)",
        "INSERT INTO usage (agent_id, agent_name, provider, model, input_tokens, output_tokens, cost_usd, priced, at) "
        "VALUES ('a1', 'old', 'openai', 'gpt-4o', 10, 5, 0.25, true, '2026-01-01 00:00:00')",
        "INSERT INTO agent_runs (id, agent_id, session_id, daemon_id, status, started_at, ended_at, lease_expires, "
        "reserve_usd) VALUES ('r1', 'a1', 's1', 'd1', 'completed', 1, 2, 2, 0)",
        "INSERT INTO agent_runs (id, agent_id, session_id, daemon_id, status, started_at, lease_expires, "
        "reserve_usd) VALUES ('r2', 'a1', 's1', 'd1', 'running', 1, 5, 0)"])
    caplog.set_level(logging.INFO, logger="agentd.store")
    store = open_store(path, target)
    try:
        assert [r.getMessage() for r in caplog.records if r.name == "agentd.store"] == [
            "migrating database schema to version 5", "migrating database schema to version 6",
            "migrating database schema to version 7"] + REWRITTEN_USAGE_TIME[backend] + ["migrating database schema to version 8",
            "migrating database schema to version 9", "migrating database schema to version 10",
            "migrating database schema to version 11"]
        assert {t: _indexes(store, url, t) for t in ("usage", "agent_runs")} == fresh
        with orm.db_session:
            assert list(store.db.select("SELECT agent_id, model, cost_usd FROM usage")) == [("a1", "gpt-4o", 0.25)]
            versions = list(store.db.select("SELECT version, description FROM agentd_schema ORDER BY version"))
            if not url:
                plan = " ".join(str(r[-1]) for r in store.raw_rows(
                    "EXPLAIN QUERY PLAN SELECT id FROM agent_runs WHERE status = 'running' AND lease_expires < $n",
                    {"n": 10.0}))
                assert "agent_runs_running" in plan, plan
        assert RunLog(store).reap(30, now=10.0) == [("r2", "a1", "d1")]
        assert sorted((r["id"], r["status"]) for r in RunLog(store).list()) == [("r1", "completed"), ("r2", "failed")]
    finally:
        store.close()
    assert [tuple(v) for v in versions][4:] == [(5, "migrated by agentd"), (6, "migrated by agentd"),
                                                (7, "migrated by agentd"), (8, "migrated by agentd"), (9, "migrated by agentd"),
                                                (10, "migrated by agentd"),
                                                (11, "migrated by agentd")]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migration_6_names_the_key_of_each_usage_row(tmp_path: Path, backend: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A schema-5 database (usage rows without `key_id`) gets the column; its rows stay and
    name no key (the admin's), and version 6 is recorded."""
    from pony import orm

    with _upgraded(tmp_path, backend, caplog, [
        "DELETE FROM agentd_schema WHERE version > 5", "ALTER TABLE usage DROP COLUMN key_id",
        "INSERT INTO usage (agent_id, agent_name, provider, model, input_tokens, output_tokens, cost_usd, priced, at) "
        "VALUES ('a1', 'old', 'openai', 'gpt-4o', 10, 5, 0.25, true, '2026-01-01 00:00:00')"]) as (store, logged):
        assert logged == [
            "migrating database schema to version 6", "migrating database schema to version 7"
        ] + REWRITTEN_USAGE_TIME[backend] + ["migrating database schema to version 8",
            "migrating database schema to version 9", "migrating database schema to version 10",
            "migrating database schema to version 11"]
        with orm.db_session:
            assert list(store.db.select("SELECT agent_id, cost_usd, key_id FROM usage")) == [("a1", 0.25, None)]
            versions = list(store.db.select("SELECT version, description FROM agentd_schema ORDER BY version"))
    assert [tuple(v) for v in versions][5:] == [(6, "migrated by agentd"), (7, "migrated by agentd"),
                                                (8, "migrated by agentd"), (9, "migrated by agentd"),
                                                (10, "migrated by agentd"),
                                                (11, "migrated by agentd")]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migration_7_writes_every_time_as_naive_utc(tmp_path: Path, backend: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A schema-6 database whose SQLite times carry an offset or no fraction (as an earlier
    agentd wrote them) gets them rewritten as naive UTC with microseconds: they read back
    as the same instants, sort as times in SQL, and their rows update (Pony's optimistic
    check compares the text it writes with the text stored)."""
    from pony import orm

    from agentd.audit import AuditLog
    from agentd.store import open_store
    from agentd.workflows.store import WorkflowStore

    path = tmp_path / "data" / "agentd.db"
    url = pgtest.databases().new_url() if backend == "postgres" else None
    target = parse_database_url(url, "test", allow_password=True) if url else None
    open_store(path, target).close()
    # (PostgreSQL's `timestamp` drops an offset on input: its rows were UTC wall time already.)
    old = {"r1": "2026-03-01 12:00:05+00:00", "r2": "2026-03-01 12:00:04.5" if url else "2026-03-01T14:00:04.5+02:00",
           "r3": "2026-03-01 12:00:04"}
    broken = [] if url else ["INSERT INTO tasks (id, title, description, status, created_at) "
                             "VALUES ('t1', 't', '', 'pending', 'soon')"]
    _execute(path, url, ["DELETE FROM agentd_schema WHERE version > 6"] + broken + [
        "INSERT INTO workflow_runs (id, workflow_id, workflow_name, status, input, step_results, steps_completed, "
        f"created_at, started_at) VALUES ('{run}', 'w', 'w', 'running', '', '[]', 0, '{text}', '{text}')"
        for run, text in old.items()] + [
        f"INSERT INTO audit (at, event, subject, detail) VALUES ('{text}', '{run}', '', '{{}}')"
        for run, text in old.items()])
    caplog.set_level(logging.INFO, logger="agentd.store")
    store = open_store(path, target)
    try:
        rewritten = [] if url else ["workflow_runs.created_at: 3 time(s) rewritten as naive UTC",
                                    "workflow_runs.started_at: 3 time(s) rewritten as naive UTC",
                                    "audit.at: 3 time(s) rewritten as naive UTC",
                                    "tasks.created_at of row 1 is not a time ('soon'); left as it is"]
        assert [r.getMessage() for r in caplog.records if r.name == "agentd.store"] == [
            "migrating database schema to version 7"] + rewritten + ["migrating database schema to version 8",
            "migrating database schema to version 9", "migrating database schema to version 10",
            "migrating database schema to version 11"]
        with orm.db_session:
            texts = list(store.db.select("SELECT id, created_at FROM workflow_runs ORDER BY created_at, id"))
            versions = list(store.db.select("SELECT version, description FROM agentd_schema ORDER BY version"))
        if not url:
            assert [tuple(r) for r in texts] == [("r3", "2026-03-01 12:00:04.000000"),
                                                 ("r2", "2026-03-01 12:00:04.500000"),
                                                 ("r1", "2026-03-01 12:00:05.000000")]
        runs = WorkflowStore(store)
        assert [(r["id"], r["started_at"]) for r in runs.runs("w")] == [
            ("r1", "2026-03-01T12:00:05+00:00"), ("r2", "2026-03-01T12:00:04.500000+00:00"),
            ("r3", "2026-03-01T12:00:04+00:00")]
        since = datetime(2026, 3, 1, 12, 0, 4, 500000)
        assert sorted(e["event"] for e in AuditLog(store).recent(since=since)) == ["r1", "r2"]
        with orm.db_session(optimistic=True):
            row = store.e.WorkflowRunRow["r1"]
            assert row.started_at == datetime(2026, 3, 1, 12, 0, 5, tzinfo=timezone.utc)
            row.status = "failed"
        assert runs.run("r1")["state"] == {"status": "failed"}
    finally:
        store.close()
    assert [tuple(v) for v in versions][6:] == [(7, "migrated by agentd"), (8, "migrated by agentd"), (9, "migrated by agentd"),
                                                (10, "migrated by agentd"),
                                                (11, "migrated by agentd")]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migration_9_names_the_key_of_each_cron_job_and_trigger(tmp_path: Path, backend: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A schema-8 database (cron jobs and triggers without `key_id`) gets the column; its
    jobs and triggers stay and name no key (the admin's), and version 9 is recorded."""
    from pony import orm

    with _upgraded(tmp_path, backend, caplog, [
        "DELETE FROM agentd_schema WHERE version > 8", "ALTER TABLE cron_jobs DROP COLUMN key_id",
        "ALTER TABLE triggers DROP COLUMN key_id",
        "INSERT INTO cron_jobs (id, name, agent_id, schedule, action, delivery, enabled, one_shot, catch_up, origin, "
        "failures, created_at) VALUES ('j1', 'old job', 'a1', '{}', '{}', '{}', true, false, 'skip', 'api', 0, "
        "'2026-01-01 00:00:00.000000')",
        "INSERT INTO triggers (id, agent_id, kind, pattern, prompt_template, enabled, source, day, runs_today, "
        "cost_today, window_count, fire_count, created_at) VALUES ('t1', 'a1', 'content_match', '{}', 'x', true, "
        "'api', '', 0, 0, 0, 0, '2026-01-01 00:00:00.000000')"]) as (store, logged):
        assert logged == ["migrating database schema to version 9", "migrating database schema to version 10",
            "migrating database schema to version 11"]
        with orm.db_session:
            assert list(store.db.select("SELECT id, name, key_id FROM cron_jobs")) == [("j1", "old job", None)]
            assert list(store.db.select("SELECT id, key_id FROM triggers")) == [("t1", None)]
            versions = list(store.db.select("SELECT version, description FROM agentd_schema ORDER BY version"))
    assert [tuple(v) for v in versions][8:] == [(9, "migrated by agentd"), (10, "migrated by agentd"),
                                                (11, "migrated by agentd")]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migration_10_names_the_key_of_each_agent_from_its_manifest_work(tmp_path: Path, backend: str,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A schema-9 database (agents without `key_id`) gets the column; an agent takes the key
    its manifest's job or trigger acts as, and one whose key made only an API job of it, or
    whose manifest work is the admin's, names none; version 10 is recorded."""
    from pony import orm

    def agent(agent_id: str) -> str:
        return ("INSERT INTO agents (id, name, manifest_toml, manifest, mode, state, created_at, last_active, "
                f"session_id) VALUES ('{agent_id}', '{agent_id}', 'name = \"{agent_id}\"', '{{}}', 'Auto', 'Running', "
                f"'2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000', 's-{agent_id}')")

    def job(job_id: str, agent_id: str, origin: str, key: str) -> str:
        return ("INSERT INTO cron_jobs (id, name, agent_id, schedule, action, delivery, enabled, one_shot, catch_up, "
                f"origin, failures, created_at, key_id) VALUES ('{job_id}', '{job_id}', '{agent_id}', '{{}}', '{{}}', "
                f"'{{}}', true, false, 'skip', '{origin}', 0, '2026-01-01 00:00:00.000000', {key})")

    with _upgraded(tmp_path, backend, caplog, [
        "DELETE FROM agentd_schema WHERE version > 9", "ALTER TABLE agents DROP COLUMN key_id",
        *(agent(a) for a in ("a1", "a2", "a3", "a4")),
        job("j1", "a1", "manifest", "'k1'"), job("j3", "a3", "api", "'k3'"), job("j4", "a4", "manifest", "NULL"),
        "INSERT INTO triggers (id, agent_id, kind, pattern, prompt_template, enabled, source, day, runs_today, "
        "cost_today, window_count, fire_count, created_at, key_id) VALUES ('t2', 'a2', 'content_match', '{}', 'x', "
        "true, 'manifest', '', 0, 0, 0, 0, '2026-01-01 00:00:00.000000', 'k2')"]) as (store, logged):
        assert logged == ["migrating database schema to version 10",
            "migrating database schema to version 11"]
        with orm.db_session:
            assert sorted(store.db.select("SELECT id, key_id FROM agents")) == [
                ("a1", "k1"), ("a2", "k2"), ("a3", None), ("a4", None)]
            versions = list(store.db.select("SELECT version, description FROM agentd_schema ORDER BY version"))
    assert [tuple(v) for v in versions][9:] == [(10, "migrated by agentd"),
                                                (11, "migrated by agentd")]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migration_11_lets_run_records_name_the_key_paying_for_them(tmp_path: Path, backend: str,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A schema-10 database (run records without `key_id`) gets the column; its records name
    no key."""
    from pony import orm

    with _upgraded(tmp_path, backend, caplog, [
        "DELETE FROM agentd_schema WHERE version > 10", "ALTER TABLE agent_runs DROP COLUMN key_id",
        "INSERT INTO agent_runs (id, agent_id, session_id, daemon_id, status, started_at, lease_expires) "
        "VALUES ('r1', 'a1', 's1', 'd1', 'completed', 1, 1)"]) as (store, logged):
        assert logged == ["migrating database schema to version 11"]
        with orm.db_session:
            assert list(store.db.select("SELECT id, key_id FROM agent_runs")) == [("r1", None)]


SCHEMA_FILE = Path(__file__).resolve().parents[1] / "data" / "schema_sqlite.json"


def _sqlite_schema(path: Path) -> dict:
    """Every table's columns (name, type, NOT NULL, primary key position), foreign keys and
    every index (table, columns, unique, partial) of the SQLite database at `path`."""
    conn = sqlite3.connect(str(path))
    try:
        tables, indexes = {}, {}
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                            "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        for table in names:
            tables[table] = {
                "columns": [[r[1], r[2], r[3], r[5]] for r in conn.execute(f"PRAGMA table_info({table})")],
                "foreign_keys": sorted([r[2], r[3], r[4], r[6]] for r in conn.execute(
                    f"PRAGMA foreign_key_list({table})")),
            }
            for _seq, name, unique, _origin, partial in conn.execute(f"PRAGMA index_list({table})"):
                columns = [r[2] for r in conn.execute(f"PRAGMA index_info({name})")]
                indexes[name] = [table, columns, unique, partial]
        return {"tables": tables, "indexes": dict(sorted(indexes.items()))}
    finally:
        conn.close()


# The message journal an earlier agentd kept beside a SQLite database (`agentd.db-messages`),
# written here byte by byte in its format: per record a big-endian 32-bit payload length and
# CRC-32, then the JSON payload `[seq, [[n, new SQL], ...], [[n, params], ...]]`.
def _journal_record(seq: int, new: list, named: list) -> bytes:
    payload = json.dumps([seq, new, named]).encode("utf-8")
    return struct.pack(">II", len(payload), zlib.crc32(payload)) + payload


_APPEND = ("INSERT INTO session_messages (session, body) SELECT $session, column1 FROM "
           "(VALUES ($b0, 0), ($b1, 1)) AS added WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $session) "
           "ORDER BY column2")
_LAST_ACTIVE = "UPDATE agents SET last_active = $now WHERE id = $agent"
_SESSION_ROW = ("INSERT INTO sessions (id, agent, created_at) SELECT $session, $agent, $now "
                "WHERE EXISTS (SELECT 1 FROM agents WHERE id = $agent) ON CONFLICT (id) DO NOTHING")


def _exchange(session_id: str, question: str, answer: str) -> dict:
    return {"session": session_id, "b0": json.dumps({"role": "user", "content": question}),
            "b1": json.dumps({"role": "assistant", "content": answer})}


def test_migration_applies_the_message_journal_of_a_killed_daemon_once_and_removes_it(tmp_path: Path) -> None:
    """A home whose daemon was killed with message writes still in its journal: the next
    start applies the records the database does not have yet (the first was applied
    before the kill), ignores a record torn by the kill, serves the result, and the file
    and its mark in `settings` are gone."""
    home = make_home(tmp_path)
    sqlite_only = {"AGENTD_DATABASE_URL": ""}  # (the journal only ever sat beside SQLite)
    daemon = Daemon(home, env_extra=sqlite_only).start()
    r = daemon.post("/api/agents", json={"manifest_toml": 'name = "journaled"\nprofile = "minimal"\n'})
    assert r.status_code == 201, r.text
    agent_id = r.json()["agent_id"]
    session_id = daemon.get(f"/api/agents/{agent_id}/session").json()["session_id"]
    assert daemon.stop() == 0
    db = home / "data" / "agentd.db"
    journal = home / "data" / "agentd.db-messages"
    conn = sqlite3.connect(str(db))
    conn.execute("INSERT INTO settings (key, value) VALUES ('run_journal_applied', '{\"seq\": 1}')")
    conn.commit()
    conn.close()
    ids = {"agent": agent_id, "session": session_id}
    journal.write_bytes(
        _journal_record(1, [[0, _LAST_ACTIVE], [1, _SESSION_ROW], [2, _APPEND]],
                        [[0, {**ids, "now": "2026-03-01 10:00:00"}], [1, {**ids, "now": "2026-03-01 10:00:00"}],
                         [2, _exchange(session_id, "applied before the kill", "twice?")]])
        + _journal_record(2, [], [[0, {**ids, "now": "2026-03-01 10:00:01"}],
                                  [1, {**ids, "now": "2026-03-01 10:00:01"}],
                                  [2, _exchange(session_id, "first", "echo: first")]])
        # (with an offset, as a daemon writing aware times journaled it: rewritten as naive UTC)
        + _journal_record(3, [], [[0, {**ids, "now": "2026-03-01T11:00:02.5+01:00"}],
                                  [2, _exchange(session_id, "grüß \"dich\"", "echo: grüß \"dich\"")]])
        + _journal_record(4, [], [[2, _exchange(session_id, "torn", "by the kill")]])[:-3])

    again = Daemon(home, env_extra=sqlite_only).start()
    try:
        messages = again.get(f"/api/agents/{agent_id}/session").json()["messages"]
        assert [(m["role"], m["content"]) for m in messages] == [
            ("User", "first"), ("Assistant", "echo: first"),
            ("User", 'grüß "dich"'), ("Assistant", 'echo: grüß "dich"')]
        assert not journal.exists()
        assert f"applying 2 message write(s) left in {journal}" in again.log()
        conn = sqlite3.connect(str(db))
        try:
            assert conn.execute("SELECT last_active FROM agents WHERE id = ?", (agent_id,)).fetchall() == [
                ("2026-03-01 10:00:02.500000",)]
            assert conn.execute("SELECT value FROM settings WHERE key = 'run_journal_applied'").fetchall() == []
        finally:
            conn.close()
    finally:
        assert again.stop() == 0
    third = Daemon(home, env_extra=sqlite_only).start()  # nothing is applied twice
    try:
        assert len(third.get(f"/api/agents/{agent_id}/session").json()["messages"]) == 4
        assert not journal.exists()
    finally:
        assert third.stop() == 0


def test_migration_of_a_message_journal_drops_a_refused_record_and_keeps_the_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from agentd.store import open_store

    path = tmp_path / "agentd.db"
    open_store(path).close()
    insert = "INSERT INTO settings (key, value) VALUES ($k, $v)"
    journal = tmp_path / "agentd.db-messages"
    journal.write_bytes(_journal_record(1, [[0, insert]], [[0, {"k": "a", "v": "1"}]])
                        + _journal_record(2, [], [[0, {"k": "b", "v": "2"}], [0, {"k": "a", "v": "again"}]])
                        + _journal_record(3, [], [[0, {"k": "c", "v": "3"}]])
                        + _journal_record(4, [[1, "INSERT INTO session_messages (session, body) VALUES ($s, $b)"]],
                                          [[1, {"s": "no-such-session", "b": "{}"}]]))
    caplog.set_level(logging.INFO, logger="agentd.store")
    open_store(path).close()
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "agentd.store"] == [
        ("INFO", f"applying 4 message write(s) left in {journal}"),
        ("ERROR", "a message write (journal record 2) was refused by the database and dropped: "
                  "UNIQUE constraint failed: settings.key"),
        ("ERROR", "a message write (journal record 4) was refused by the database and dropped: "
                  "FOREIGN KEY constraint failed")]
    conn = sqlite3.connect(str(path))
    rows = conn.execute("SELECT key, value FROM settings ORDER BY key").fetchall()
    assert conn.execute("SELECT COUNT(*) FROM session_messages").fetchone() == (0,)
    conn.close()
    assert rows == [("a", 1), ("c", 3)]  # the whole refused record, "b" with it, is dropped
    assert not journal.exists()


def test_migration_leaves_a_message_journal_its_daemon_still_holds_until_released(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    from agentd.store import open_store

    path = tmp_path / "agentd.db"
    open_store(path).close()
    journal = tmp_path / "agentd.db-messages"
    journal.write_bytes(_journal_record(1, [[0, "INSERT INTO settings (key, value) VALUES ($k, $v)"]],
                                        [[0, {"k": "held", "v": "1"}]]))
    with open(journal, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        caplog.set_level(logging.INFO, logger="agentd.store")
        open_store(path).close()
    assert [r.getMessage() for r in caplog.records if r.name == "agentd.store"] == [
        f"{journal} is held by another process; left to it"]
    assert journal.exists()
    conn = sqlite3.connect(str(path))
    assert conn.execute("SELECT COUNT(*) FROM settings WHERE key = 'held'").fetchone() == (0,)
    conn.close()
    (tmp_path / "agentd.db-messages.tmp").write_bytes(b"")  # (a rewrite cut off by the kill)
    open_store(path).close()  # released: applied now
    conn = sqlite3.connect(str(path))
    assert conn.execute("SELECT value FROM settings WHERE key = 'held'").fetchall() == [(1,)]
    conn.close()
    assert sorted(p.name for p in tmp_path.iterdir() if "messages" in p.name) == []


def test_migration_stops_at_a_message_journal_it_cannot_apply_and_keeps_it(tmp_path: Path) -> None:
    from agentd.store import open_store
    from agentd.store.db import StoreError

    path = tmp_path / "agentd.db"
    open_store(path).close()
    journal = tmp_path / "agentd.db-messages"
    journal.write_bytes(_journal_record(1, [[0, "INSERT INTO no_such_table (v) VALUES ($v)"]], [[0, {"v": 1}]]))
    with pytest.raises(StoreError) as err:
        open_store(path)
    assert err.value.message == f"cannot apply the message writes left in {journal}: no such table: no_such_table"
    assert journal.exists()


def test_a_fresh_sqlite_database_has_the_recorded_schema(tmp_path: Path) -> None:
    """The schema Pony and the migration steps create, column by column and index by index,
    is the one recorded in tests/data/schema_sqlite.json. A change to it is a schema change:
    it needs a migration step (and SCHEMA_VERSION + 1) so existing databases get it too;
    then record the new shape with `AGENTD_RECORD_SCHEMA=1 python -m pytest -k recorded_schema`."""
    from agentd.store import open_store

    path = tmp_path / "data" / "agentd.db"
    open_store(path).close()
    actual = {"version": SCHEMA_VERSION, **_sqlite_schema(path)}
    if os.environ.get("AGENTD_RECORD_SCHEMA"):
        # One line per table and per index, so a schema change reads as a small diff.
        def block(items: dict) -> str:
            return ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in items.items())
        SCHEMA_FILE.write_text(f'{{\n "version": {SCHEMA_VERSION},\n "tables": {{\n{block(actual["tables"])}\n }},\n'
                               f' "indexes": {{\n{block(actual["indexes"])}\n }}\n}}\n')
    assert actual == json.loads(SCHEMA_FILE.read_text())
