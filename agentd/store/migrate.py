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

The steps themselves are in agentd/store/schema_steps.py. On SQLite the store then applies
what an earlier agentd's message journal beside the database still holds
(agentd/store/message_journal.py) and removes the file.

Pony creates the tables of its entities. The cluster coordination tables (leases, daemons,
agent run records, approvals: agentd/store/leases.py) are plain SQL outside Pony; they are
created by the steps in `RAW_TABLES`, which also run on a fresh database, so they are
versioned like every other table (a change to one is a new step).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from agentd.store.schema_probe import param, table_exists
from agentd.store.schema_steps import LATE_STEPS, RAW_TABLES, STEPS

log = logging.getLogger("agentd.store")

# Arbitrary constant shared by every agentd daemon: the key of the migration lock.
MIGRATION_LOCK = 0x6167_6E74_6400_0001

# The schema this code writes. Bump it with a step in schema_steps.STEPS when an existing table changes.
# New tables need no step (Pony creates them); a new column or a data move does.
SCHEMA_VERSION = 11

VERSION_TABLE = "agentd_schema"


class SchemaError(Exception):
    """The database's schema cannot be used by this daemon."""


def found_version(cur: Any, backend: str) -> int:
    """The database's schema version: 0 = empty database, 1 = made before versioning."""
    cur.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER PRIMARY KEY, "
                "applied_at TEXT NOT NULL, description TEXT NOT NULL)")
    cur.execute(f"SELECT MAX(version) FROM {VERSION_TABLE}")
    row = cur.fetchone()
    if row and row[0] is not None:
        return int(row[0])
    if not table_exists(cur, backend, "agents"):
        return 0
    # Made before versioning: that schema is version 1; say so once.
    p = param(backend)
    cur.execute(f"INSERT INTO {VERSION_TABLE} (version, applied_at, description) VALUES (1, {p}, {p})",
                (datetime.now(timezone.utc).isoformat(), "existing schema adopted by agentd"))
    return 1


def newer_schema(version: int) -> str:
    """Why a database at `version` is refused (by the start, and by `agentd doctor`)."""
    return f"database schema version {version} is newer than this agentd's ({SCHEMA_VERSION}); upgrade agentd"


def run_steps(cur: Any, backend: str) -> int:
    """Bring existing tables to SCHEMA_VERSION; returns the version found. Call with the
    migration lock held, before Pony maps (and creates) the tables."""
    version = found_version(cur, backend)
    if version > SCHEMA_VERSION:
        raise SchemaError(newer_schema(version))
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
    p = param(backend)
    for version in range(found + 1, SCHEMA_VERSION + 1):
        what = "created" if found == 0 else "migrated"
        cur.execute(f"INSERT INTO {VERSION_TABLE} (version, applied_at, description) VALUES ({p}, {p}, {p})",
                    (version, now, f"{what} by agentd"))


def lock(cur: Any, backend: str) -> None:
    """Take the migration lock (PostgreSQL: session advisory lock; waits for the holder)."""
    if backend == "postgres":
        cur.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))


def unlock(cur: Any, backend: str) -> None:
    """Release what `lock` took."""
    if backend == "postgres":
        cur.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
