"""Schema versions: create or migrate the schema at start, safely with several daemons.

The table `agentd_schema` records every version applied. At start the store:

1. takes the migration lock (PostgreSQL: `pg_advisory_lock(MIGRATION_LOCK)` on a side
   connection, so daemons starting at the same instant migrate one after another; SQLite:
   the database file is one daemon's, and a write transaction guards the version table);
2. reads the version: none and no tables = a fresh database (Pony creates every table at
   the current shape); none but an `agents` table = a database made before versioning
   (version 1); newer than this code = refuse to start (an older daemon must not write a
   schema it does not know);
3. runs the steps from the found version up to `SCHEMA_VERSION` (changes to existing
   tables: new columns, data moves), then lets Pony create tables that are new, then runs
   the steps that fill those new tables from old ones (`LATE_STEPS`), and records the
   versions; then releases the lock.

On SQLite it then applies what an earlier agentd's message journal beside the database
still holds (`apply_message_journal`) and removes the file.

Pony creates the tables of its entities. The cluster coordination tables (leases, daemons,
agent run records, approvals: agentd/store/leases.py) are plain SQL outside Pony; they are
created by the steps in `RAW_TABLES`, which also run on a fresh database, so they are
versioned like every other table (a change to one is a new step).
"""

from __future__ import annotations

import fcntl
import json
import logging
import re
import sqlite3
import struct
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from agentd.store import utc

log = logging.getLogger("agentd.store")

# Arbitrary constant shared by every agentd daemon: the key of the migration lock.
MIGRATION_LOCK = 0x6167_6E74_6400_0001

# The schema this code writes. Bump it with a step in STEPS when an existing table changes.
# New tables need no step (Pony creates them); a new column or a data move does.
SCHEMA_VERSION = 8

VERSION_TABLE = "agentd_schema"


def _step_2(cur: Any, backend: str) -> None:
    """Uploads move from files under the home into the database (`uploads.content`), so a
    file uploaded through one daemon can be attached through another."""
    if not _column_exists(cur, backend, "uploads", "content"):
        blob = "BYTEA" if backend == "postgres" else "BLOB"
        cur.execute(f"ALTER TABLE uploads ADD COLUMN content {blob}")
    p = _param(backend)
    cur.execute("SELECT id, path FROM uploads WHERE path <> '' ORDER BY id")
    for upload_id, path in cur.fetchall():
        try:
            data = Path(path).read_bytes()
        except OSError:
            log.warning("upload %s: file %s is gone; the upload stays without content", upload_id, path)
            continue
        cur.execute(f"UPDATE uploads SET content = {p}, path = '' WHERE id = {p}", (data, upload_id))
        Path(path).unlink(missing_ok=True)


# The coordination tables as schema 3 has them (frozen: change them with a new step).
COORDINATION_V3 = (
    "CREATE TABLE IF NOT EXISTS cluster_leases (name TEXT PRIMARY KEY, owner TEXT NOT NULL, "
    "token TEXT NOT NULL, expires_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS cluster_daemons (id TEXT PRIMARY KEY, listen TEXT NOT NULL, "
    "pid INTEGER NOT NULL, started_at DOUBLE PRECISION NOT NULL, heartbeat_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS agent_runs (id TEXT PRIMARY KEY, agent_id TEXT NOT NULL, "
    "session_id TEXT NOT NULL, daemon_id TEXT NOT NULL, status TEXT NOT NULL, "
    "started_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION, lease_expires DOUBLE PRECISION NOT NULL, "
    "error TEXT, cost_usd DOUBLE PRECISION, reserve_usd DOUBLE PRECISION NOT NULL DEFAULT 0, "
    "stop_requested INTEGER NOT NULL DEFAULT 0)",
    "CREATE INDEX IF NOT EXISTS agent_runs_status ON agent_runs (status, lease_expires)",
    "CREATE INDEX IF NOT EXISTS agent_runs_agent ON agent_runs (agent_id, started_at)",
    "CREATE TABLE IF NOT EXISTS cluster_approvals (id TEXT PRIMARY KEY, agent_id TEXT NOT NULL, "
    "agent_name TEXT NOT NULL, tool TEXT NOT NULL, input TEXT NOT NULL, requested_at TEXT NOT NULL, "
    "daemon_id TEXT NOT NULL, decision TEXT, decided_at DOUBLE PRECISION)",
    "CREATE INDEX IF NOT EXISTS cluster_approvals_pending ON cluster_approvals (decision, requested_at)",
)


def _coordination_3(cur: Any, backend: str) -> None:
    """The cluster coordination tables (before schema 3 each daemon created them at start
    with IF NOT EXISTS; a database that has them keeps them as they are)."""
    for statement in COORDINATION_V3:
        cur.execute(statement)


def _step_3(cur: Any, backend: str) -> None:
    """Workflow runs record the daemon that drives them (`workflow_runs.daemon_id`), so each
    daemon recovers only its own runs; existing runs get no owner."""
    if _table_exists(cur, backend, "workflow_runs") and not _column_exists(cur, backend, "workflow_runs",
                                                                          "daemon_id"):
        cur.execute("ALTER TABLE workflow_runs ADD COLUMN daemon_id TEXT")


def _late_step_4(cur: Any, backend: str) -> None:
    """Sessions become rows: each message of `sessions.messages` (one JSON array, rewritten
    whole by every message) moves to a row of `session_messages`, in order, and the column
    goes. One session per transaction, and a session whose text is still there has its rows
    written again: a move cut off midway (the daemon killed) is done again from the start."""
    if not _column_exists(cur, backend, "sessions", "messages"):
        return
    p = _param(backend)
    cur.execute("SELECT id FROM sessions WHERE messages IS NOT NULL AND messages NOT IN ('', '[]') ORDER BY id")
    for (session_id,) in cur.fetchall():
        cur.execute("BEGIN")
        cur.execute(f"SELECT messages FROM sessions WHERE id = {p}", (session_id,))
        messages = json.loads(cur.fetchone()[0])
        cur.execute(f"DELETE FROM session_messages WHERE session = {p}", (session_id,))
        for message in messages:
            cur.execute(f"INSERT INTO session_messages (session, body) VALUES ({p}, {p})",
                        (session_id, json.dumps(message, ensure_ascii=False)))
        cur.execute(f"UPDATE sessions SET messages = '[]' WHERE id = {p}", (session_id,))
        cur.execute("COMMIT")
        log.info("session %s: %d messages moved to rows", session_id, len(messages))
    cur.execute("ALTER TABLE sessions DROP COLUMN messages")


def _step_5(cur: Any, backend: str) -> None:
    """Usage rows lose the indexes on `agent_id` and `model`: every report reads a window of
    `at` (then groups), so no query used them, and every message paid for them: each index
    is another page written in the message's commit."""
    for name in ("idx_usage__agent_id", "idx_usage__model"):
        cur.execute(f"DROP INDEX IF EXISTS {name}")


def _coordination_5(cur: Any, backend: str) -> None:
    """The run records' status index holds running records only (`agent_runs_running`).
    Every query that used it looks for `status = 'running'`; a record written complete (a
    lone daemon's run) no longer adds an index entry, one page less per message."""
    cur.execute("DROP INDEX IF EXISTS agent_runs_status")
    cur.execute("CREATE INDEX IF NOT EXISTS agent_runs_running ON agent_runs (lease_expires) "
                "WHERE status = 'running'")


def _step_6(cur: Any, backend: str) -> None:
    """Usage rows name the scoped API key that paid for them (`usage.key_id`), so a key's
    spend is a sum every daemon on the database reads alike."""
    if not _column_exists(cur, backend, "usage", "key_id"):
        cur.execute("ALTER TABLE usage ADD COLUMN key_id TEXT")


def _coordination_8(cur: Any, backend: str) -> None:
    """Each daemon records the URL the others reach it at (`cluster_daemons.url`, from
    `[cluster] advertise_url`): a standby relays a channel's webhook to the daemon holding it."""
    if not _column_exists(cur, backend, "cluster_daemons", "url"):
        cur.execute("ALTER TABLE cluster_daemons ADD COLUMN url TEXT")


# The time columns of the entities at schema 7 (frozen: a later step names its own).
TIME_COLUMNS_V7 = {
    "agents": ("created_at", "last_active"), "sessions": ("created_at",), "memory_kv": ("updated_at",),
    "uploads": ("created_at",), "usage": ("at",), "workflows": ("created_at", "updated_at"),
    "workflow_runs": ("created_at", "started_at", "completed_at"), "audit": ("at",),
    "api_keys": ("expires_at", "created_at", "updated_at", "last_used_at"), "cron_jobs": ("created_at",),
    "memory_fragments": ("created_at", "accessed_at"), "kg_entities": ("created_at", "updated_at"),
    "kg_relations": ("created_at",), "openai_responses": ("created_at",),
    "triggers": ("window_start", "last_fired_at", "created_at"),
    "tasks": ("created_at", "claimed_at", "completed_at"),
}
_CANONICAL_TIME = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9].[0-9][0-9][0-9][0-9][0-9][0-9]"


def _step_7(cur: Any, backend: str) -> None:
    """SQLite times become one form, naive UTC with microseconds (agentd/store/utc.py).
    Earlier rows may carry an offset ("+00:00") or no fraction: they sorted apart from the
    others in SQL, and Pony's optimistic checks, comparing the text it would write with
    the text stored, refused to update them. PostgreSQL's `timestamp` columns already hold
    UTC wall time."""
    if backend == "postgres":
        return
    for table, columns in TIME_COLUMNS_V7.items():
        if not _table_exists(cur, backend, table):
            continue
        for column in columns:
            if not _column_exists(cur, backend, table, column):
                continue
            cur.execute(f"SELECT rowid, {column} FROM {table} WHERE {column} IS NOT NULL "
                        f"AND {column} NOT GLOB '{_CANONICAL_TIME}'")
            rows, rewritten = cur.fetchall(), 0
            cur.execute("BEGIN")
            for rowid, text in rows:
                try:
                    when = utc.from_column(text)
                except ValueError:
                    # Not a time at all: no form to bring it to; the start goes on.
                    log.warning("%s.%s of row %s is not a time (%r); left as it is", table, column, rowid, text)
                    continue
                cur.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (utc.column_text(when), rowid))
                rewritten += 1
            cur.execute("COMMIT")
            if rewritten:
                log.info("%s.%s: %d time(s) rewritten as naive UTC", table, column, rewritten)


# version -> step that brings a database from version-1 to version (existing tables only).
STEPS: dict[int, Callable[[Any, str], None]] = {2: _step_2, 3: _step_3, 5: _step_5, 6: _step_6,
                                                 7: _step_7}
# version -> step that fills tables new at that version (Pony has just created them) from
# existing ones; runs after the mapping, on a database that had an older version only.
LATE_STEPS: dict[int, Callable[[Any, str], None]] = {4: _late_step_4}
# version -> step creating or changing plain-SQL tables at that version; these run on a
# fresh database too (Pony does not know these tables), in order.
RAW_TABLES: dict[int, Callable[[Any, str], None]] = {3: _coordination_3, 5: _coordination_5, 8: _coordination_8}


class SchemaError(Exception):
    """The database's schema cannot be used by this daemon."""


def _param(backend: str) -> str:
    return "%s" if backend == "postgres" else "?"


def _table_exists(cur: Any, backend: str, name: str) -> bool:
    if backend == "postgres":
        cur.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() "
                    "AND table_name = %s", (name,))
    else:
        cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return cur.fetchone() is not None


def _column_exists(cur: Any, backend: str, table: str, column: str) -> bool:
    if backend == "postgres":
        cur.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
                    "AND table_name = %s AND column_name = %s", (table, column))
        return cur.fetchone() is not None
    cur.execute(f"PRAGMA table_info({table})")
    return any(row[1] == column for row in cur.fetchall())


def found_version(cur: Any, backend: str) -> int:
    """The database's schema version: 0 = empty database, 1 = made before versioning."""
    cur.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER PRIMARY KEY, "
                "applied_at TEXT NOT NULL, description TEXT NOT NULL)")
    cur.execute(f"SELECT MAX(version) FROM {VERSION_TABLE}")
    row = cur.fetchone()
    if row and row[0] is not None:
        return int(row[0])
    if not _table_exists(cur, backend, "agents"):
        return 0
    # Made before versioning: that schema is version 1; say so once.
    p = _param(backend)
    cur.execute(f"INSERT INTO {VERSION_TABLE} (version, applied_at, description) VALUES (1, {p}, {p})",
                (datetime.now(timezone.utc).isoformat(), "existing schema adopted by agentd"))
    return 1


def run_steps(cur: Any, backend: str) -> int:
    """Bring existing tables to SCHEMA_VERSION; returns the version found. Call with the
    migration lock held, before Pony maps (and creates) the tables."""
    version = found_version(cur, backend)
    if version > SCHEMA_VERSION:
        raise SchemaError(f"database schema version {version} is newer than this agentd's "
                          f"({SCHEMA_VERSION}); upgrade agentd")
    for step in range(version + 1, SCHEMA_VERSION + 1):
        if version > 0:
            log.info("migrating database schema to version %d", step)
            STEPS.get(step, _nothing)(cur, backend)
        RAW_TABLES.get(step, _nothing)(cur, backend)
    return version


def run_late_steps(cur: Any, backend: str, found: int) -> None:
    """The data moves into new tables, for a database found at version `found` (after Pony
    created the tables, before `record`)."""
    if found == 0:
        return
    for step in range(found + 1, SCHEMA_VERSION + 1):
        LATE_STEPS.get(step, _nothing)(cur, backend)


def _nothing(cur: Any, backend: str) -> None:
    """A version with nothing to do in one of the step tables."""


def record(cur: Any, backend: str, found: int) -> None:
    """Record the versions applied since `found` (after Pony created the new tables)."""
    now = datetime.now(timezone.utc).isoformat()
    p = _param(backend)
    for version in range(found + 1, SCHEMA_VERSION + 1):
        what = "created" if found == 0 else "migrated"
        cur.execute(f"INSERT INTO {VERSION_TABLE} (version, applied_at, description) VALUES ({p}, {p}, {p})",
                    (version, now, f"{what} by agentd"))


# The message journal an earlier agentd kept beside a SQLite database ("<database>-messages"):
# a message's writes were appended there and applied to the database a little later, so a
# daemon killed in between left some behind. Each record is the payload's length and CRC-32
# (big-endian 32-bit each), then the payload, JSON `[seq, [[n, sql], ...], [[n, params],
# ...]]`: its number, the statements whose SQL the file gives for the first time (numbered),
# and its statements by number with their `$name` parameters. The database kept the highest
# number it had applied in `settings`; a rewrite of the file went through "<journal>.tmp".
_JOURNAL_HEAD = struct.Struct(">II")
JOURNAL_APPLIED_KEY = "run_journal_applied"
_NAMED_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def journal_path(path: Path) -> Path:
    """The message journal that belonged to the SQLite database at `path`."""
    return path.with_name(path.name + "-messages")


def _journal_records(data: bytes) -> list[tuple[int, list[tuple[str, dict[str, Any]]]]]:
    """The whole records at the start of `data`; a record torn by a crash (or damaged)
    ends them: it was never acknowledged."""
    out = []
    known: dict[int, str] = {}
    at = 0
    while at + _JOURNAL_HEAD.size <= len(data):
        size, crc = _JOURNAL_HEAD.unpack_from(data, at)
        payload = data[at + _JOURNAL_HEAD.size:at + _JOURNAL_HEAD.size + size]
        if len(payload) < size or zlib.crc32(payload) != crc:
            break
        seq, new, named = json.loads(payload)
        known.update((n, sql) for n, sql in new)
        if any(n not in known for n, _ in named):
            break
        out.append((int(seq), [(known[n], params) for n, params in named]))
        at += _JOURNAL_HEAD.size + size
    return out


def apply_message_journal(path: Path) -> None:
    """SQLite, at start: apply the message writes a killed daemon left in the journal
    beside the database at `path`, each once, then remove the file."""
    journal = journal_path(path)
    try:
        fh = open(journal, "rb")
    except FileNotFoundError:
        return
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            # The daemon that writes it still runs, and applies it itself.
            log.warning("%s is held by another process; left to it", journal)
            return
        conn = sqlite3.connect(str(path), timeout=5.0, isolation_level=None)
        try:
            conn.execute("PRAGMA foreign_keys = ON")  # (a record is refused as the daemon refused it)
            if _apply_journal(conn.cursor(), journal, fh.read()):
                # Its times are in the form the daemon that wrote it used.
                _step_7(conn.cursor(), "sqlite")
            journal.with_name(journal.name + ".tmp").unlink(missing_ok=True)
            journal.unlink()
            conn.execute("DELETE FROM settings WHERE key = ?", (JOURNAL_APPLIED_KEY,))
        finally:
            conn.close()


def _apply_journal(cur: sqlite3.Cursor, journal: Path, data: bytes) -> bool:
    """Apply the records the database has not applied yet; True when there were any."""
    cur.execute("SELECT value FROM settings WHERE key = ?", (JOURNAL_APPLIED_KEY,))
    row = cur.fetchone()
    applied = int(json.loads(row[0])["seq"]) if row is not None and row[0] is not None else 0
    left = [r for r in _journal_records(data) if r[0] > applied]
    if not left:
        return False
    log.info("applying %d message write(s) left in %s", len(left), journal)
    cur.execute("BEGIN IMMEDIATE")
    try:
        for seq, statements in left:
            cur.execute("SAVEPOINT record")
            try:
                for sql, params in statements:
                    cur.execute(_NAMED_PARAM.sub(r":\1", sql), params)
            except sqlite3.IntegrityError as exc:
                cur.execute("ROLLBACK TO record")
                log.error("a message write (journal record %d) was refused by the database and dropped: %s",
                          seq, exc)
            cur.execute("RELEASE record")
        # Marked in the same transaction: a crash before the file is gone must not apply
        # the records twice.
        cur.execute("INSERT INTO settings (key, value) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (JOURNAL_APPLIED_KEY, json.dumps({"seq": left[-1][0]})))
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    return True


def lock(cur: Any, backend: str) -> None:
    """Take the migration lock (PostgreSQL: session advisory lock; waits for the holder)."""
    if backend == "postgres":
        cur.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))


def unlock(cur: Any, backend: str) -> None:
    """Release what `lock` took."""
    if backend == "postgres":
        cur.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
