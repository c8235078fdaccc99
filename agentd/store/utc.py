"""Times in the database: written as naive UTC, read back as aware UTC, on both backends.

Every `datetime` attribute of every entity goes through one Pony converter, registered on
the bound provider by `install`: it accepts aware or naive values (naive ones are UTC),
writes the naive UTC wall time and hands back an aware UTC datetime. Pony's own SQLite
converter wrote an aware value with its offset and read a time on a whole second back as
the raw text; its optimistic checks, comparing what it wrote with what it read, failed on
the others.

On SQLite a time is the text `YYYY-MM-DD HH:MM:SS.ffffff` (one width, so text order is time
order in SQL). Plain-SQL statements get the same text from the sqlite3 adapter `install`
registers; what they read back is that text (`from_column` reads it). On PostgreSQL the
columns are `timestamp` (without time zone) and every connection's session time zone is UTC
(agentd/store/backend.py), so psycopg2's aware values land as UTC wall time.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from pony.orm.dbproviders.sqlite import SQLiteDatetimeConverter


def naive_utc(when: datetime) -> datetime:
    """`when` as naive UTC wall time (a naive `when` is UTC already)."""
    if when.tzinfo is None:
        return when
    return when.astimezone(timezone.utc).replace(tzinfo=None)


def aware_utc(when: datetime) -> datetime:
    """`when` as an aware UTC datetime (a naive `when` is UTC)."""
    if when.tzinfo is None:
        return when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc)


def column_text(when: datetime) -> str:
    """The SQLite column text of a time: naive UTC, always with microseconds."""
    return naive_utc(when).isoformat(" ", timespec="microseconds")


def from_column(value: Any) -> datetime:
    """An aware UTC datetime from what a time column holds: a datetime (PostgreSQL) or its
    text (SQLite: rows written before this form may carry an offset, or no fraction)."""
    if isinstance(value, datetime):
        return aware_utc(value)
    if isinstance(value, str):
        return aware_utc(datetime.fromisoformat(value))
    raise ValueError(f"not a stored time: {value!r}")


class _UtcConverter:
    """The validate/read/write rules shared by both backends' datetime converters."""

    def validate(self, val: Any, obj: Any = None) -> datetime:
        return aware_utc(super().validate(val, obj))  # type: ignore[misc]

    def sql2py(self, val: Any) -> datetime:
        return from_column(val)


class SqliteUtcDatetimeConverter(_UtcConverter, SQLiteDatetimeConverter):
    def py2sql(self, val: datetime) -> str:
        return column_text(val)


def install(db: Any) -> None:
    """Make a freshly bound `db` store its datetimes through the converter above (call
    between `bind` and `generate_mapping`, which makes every attribute's converter)."""
    provider = db.provider
    if provider.dialect == "SQLite":
        converter: type = SqliteUtcDatetimeConverter
        # Plain-SQL parameters (Pony's raw `execute`, the run writer's own connection) are
        # stored as entities store them. Process-wide, as sqlite3 adapters are.
        sqlite3.register_adapter(datetime, column_text)
    else:
        converter = _postgres_converter()
    provider.converter_classes = [(py_type, converter if py_type is datetime else cls)
                                  for py_type, cls in type(provider).converter_classes]


@lru_cache(maxsize=None)
def _postgres_converter() -> type:
    # Pony's PostgreSQL module imports psycopg2, an optional extra an idle SQLite daemon
    # never loads: built on first use.
    from pony.orm.dbproviders.postgres import PGDatetimeConverter

    class PostgresUtcDatetimeConverter(_UtcConverter, PGDatetimeConverter):
        def py2sql(self, val: datetime) -> datetime:
            return naive_utc(val)

    return PostgresUtcDatetimeConverter
