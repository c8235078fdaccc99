"""The schema's version steps: what each version changes in existing tables, which new
tables it fills from old ones, and the plain-SQL tables it creates or changes.

agentd/store/migrate.py runs them in order under the migration lock. A step's tables and
columns are frozen as they were at its version: a later change is a new step.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

from agentd.store import utc
from agentd.store.schema_probe import column_exists, param, table_exists

log = logging.getLogger("agentd.store")


def _step_2(cur: Any, backend: str) -> None:
    """Uploads move from files under the home into the database (`uploads.content`), so a
    file uploaded through one daemon can be attached through another."""
    if not column_exists(cur, backend, "uploads", "content"):
        blob = "BYTEA" if backend == "postgres" else "BLOB"
        cur.execute(f"ALTER TABLE uploads ADD COLUMN content {blob}")
    p = param(backend)
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
    if table_exists(cur, backend, "workflow_runs") and not column_exists(cur, backend, "workflow_runs",
                                                                          "daemon_id"):
        cur.execute("ALTER TABLE workflow_runs ADD COLUMN daemon_id TEXT")


def _late_step_4(cur: Any, backend: str) -> None:
    """Sessions become rows: each message of `sessions.messages` (one JSON array, rewritten
    whole by every message) moves to a row of `session_messages`, in order, and the column
    goes. One session per transaction, and a session whose text is still there has its rows
    written again: a move cut off midway (the daemon killed) is done again from the start."""
    if not column_exists(cur, backend, "sessions", "messages"):
        return
    p = param(backend)
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
    if not column_exists(cur, backend, "usage", "key_id"):
        cur.execute("ALTER TABLE usage ADD COLUMN key_id TEXT")


def _coordination_8(cur: Any, backend: str) -> None:
    """Each daemon records the URL the others reach it at (`cluster_daemons.url`, from
    `[cluster] advertise_url`): a standby relays a channel's webhook to the daemon holding it."""
    if not column_exists(cur, backend, "cluster_daemons", "url"):
        cur.execute("ALTER TABLE cluster_daemons ADD COLUMN url TEXT")


def _coordination_11(cur: Any, backend: str) -> None:
    """Run records name the scoped API key paying for the run (`agent_runs.key_id`): the
    reservations of a key's runs in flight count against its budget on every daemon."""
    if not column_exists(cur, backend, "agent_runs", "key_id"):
        cur.execute("ALTER TABLE agent_runs ADD COLUMN key_id TEXT")


def _step_9(cur: Any, backend: str) -> None:
    """Cron jobs and triggers name the scoped API key that created them (`key_id`): their
    runs act as that key. Existing ones name none (the admin's)."""
    for table in ("cron_jobs", "triggers"):
        if table_exists(cur, backend, table) and not column_exists(cur, backend, table, "key_id"):
            cur.execute(f"ALTER TABLE {table} ADD COLUMN key_id TEXT")


def _step_10(cur: Any, backend: str) -> None:
    """Agents name the scoped API key that spawned them or last changed their manifest
    (`agents.key_id`), so a manifest job made again at a start stays the key's. An existing
    agent takes the key its manifest's jobs or triggers already act as (none: the admin's)."""
    if not column_exists(cur, backend, "agents", "key_id"):
        cur.execute("ALTER TABLE agents ADD COLUMN key_id TEXT")
    for table, origin in (("cron_jobs", "origin"), ("triggers", "source")):
        if table_exists(cur, backend, table) and column_exists(cur, backend, table, "key_id"):
            cur.execute(f"UPDATE agents SET key_id = (SELECT MIN(t.key_id) FROM {table} t WHERE "
                        f"t.agent_id = agents.id AND t.{origin} = 'manifest') WHERE key_id IS NULL")


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


def step_7(cur: Any, backend: str) -> None:
    """SQLite times become one form, naive UTC with microseconds (agentd/store/utc.py).
    Earlier rows may carry an offset ("+00:00") or no fraction: they sorted apart from the
    others in SQL, and Pony's optimistic checks, comparing the text it would write with
    the text stored, refused to update them. PostgreSQL's `timestamp` columns already hold
    UTC wall time."""
    if backend == "postgres":
        return
    for table, columns in TIME_COLUMNS_V7.items():
        if not table_exists(cur, backend, table):
            continue
        for column in columns:
            if not column_exists(cur, backend, table, column):
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
                                                 7: step_7, 9: _step_9, 10: _step_10}
# version -> step that fills tables new at that version (Pony has just created them) from
# existing ones; runs after the mapping, on a database that had an older version only.
LATE_STEPS: dict[int, Callable[[Any, str], None]] = {4: _late_step_4}
# version -> step creating or changing plain-SQL tables at that version; these run on a
# fresh database too (Pony does not know these tables), in order.
RAW_TABLES: dict[int, Callable[[Any, str], None]] = {3: _coordination_3, 5: _coordination_5, 8: _coordination_8,
                                                      11: _coordination_11}
