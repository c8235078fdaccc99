"""What a migration step asks of the database: the parameter marker, whether a table or a
column exists (SQLite and PostgreSQL alike)."""

from __future__ import annotations

from typing import Any


def param(backend: str) -> str:
    return "%s" if backend == "postgres" else "?"


def table_exists(cur: Any, backend: str, name: str) -> bool:
    if backend == "postgres":
        cur.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() "
                    "AND table_name = %s", (name,))
    else:
        cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return cur.fetchone() is not None


def column_exists(cur: Any, backend: str, table: str, column: str) -> bool:
    if backend == "postgres":
        cur.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
                    "AND table_name = %s AND column_name = %s", (table, column))
        return cur.fetchone() is not None
    cur.execute(f"PRAGMA table_info({table})")
    return any(row[1] == column for row in cur.fetchall())
