"""The store: one Pony `Database`, bound to SQLite (WAL, FKs on) or PostgreSQL, with the
entities of agentd/store/entities.py.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, ContextManager, TypeVar

from pony import orm
from pony.orm import Database

from agentd.errors import AgentdError
from agentd.store import exact_json, message_journal, migrate, utc
from agentd.store.backend import DatabaseUrl, bind_postgres, connect_postgres
from agentd.store.checkpoint import CONNECTION_PRAGMAS, WalCheckpointer
from agentd.store.entities import define_entities
from agentd.store.outage import OUTAGE, translate
from agentd.timestamps import iso, utcnow
from agentd.store.writer import PonyWriter, SqliteWriter, Tx, Writer

T = TypeVar("T")

SQLITE_MAGIC = b"SQLite format 3\x00"

# Under this much free space on the disk holding a SQLite database, health says `degraded`
# even while a small write still fits in pages SQLite already has: the next larger one will not.
FULL_DISK_BYTES = 1024 * 1024


class StoreError(AgentdError):
    """The database cannot be opened (locked, corrupt, unwritable)."""


@dataclass
class Store:
    """An open database and its entity classes (`store.e.AgentRow`, ...)."""

    db: Database
    e: SimpleNamespace
    path: Path
    # "sqlite" or "postgres"; `where` names the database for logs (a masked URL or a path).
    backend: str = "sqlite"
    where: str = ""
    checkpointer: WalCheckpointer | None = None
    _writer: Writer | None = None
    _pinged_at: float = -1e9
    _ping_ok: bool = True

    @property
    def shared(self) -> bool:
        """True when other daemons may write this database too (PostgreSQL): services
        then re-read what they would otherwise keep in memory."""
        return self.backend == "postgres"

    def ping(self) -> bool:
        """True when a trivial query succeeds (ending a recorded outage, or starting one).
        While writes are known to fail (a full disk), a small write must succeed too."""
        probe = OUTAGE.writes_blocked
        try:
            with orm.db_session:
                self.db.select("SELECT 1")
            if probe:
                self.set_setting(WRITE_PROBE, iso(utcnow()))
        except Exception as exc:  # noqa: BLE001 - any failure means "not healthy"
            translate(exc)
            return False
        OUTAGE.cleared(wrote=probe)
        return not self.disk_full()

    def disk_full(self) -> bool:
        """True when the disk holding a SQLite database has (almost) no room left."""
        if self.backend != "sqlite":
            return False
        try:
            return shutil.disk_usage(self.path.parent).free < FULL_DISK_BYTES
        except OSError:
            return False

    def available(self, max_age: float = 1.0) -> bool:
        """ping(), at most once per `max_age` seconds (a liveness probe may come often)."""
        now = time.monotonic()
        with _PING_LOCK:
            fresh = now - self._pinged_at < max_age
            if fresh:
                return self._ping_ok
            self._pinged_at = now
        self._ping_ok = self.ping()
        return self._ping_ok

    def get_setting(self, key: str, default: Any = None) -> Any:
        with orm.db_session:
            row = self.e.Setting.get(key=key)
            return default if row is None else row.value

    def set_setting(self, key: str, value: Any) -> None:
        with orm.db_session:
            row = self.e.Setting.get(key=key)
            if row is None:
                self.e.Setting(key=key, value=value)
            else:
                row.value = value

    def raw_rows(self, sql: str, params: dict[str, Any]) -> list[tuple]:
        """Rows of a statement on this session's DB-API connection, `$name` parameters bound
        in the backend's own style. For hot paths and statements Pony's `select()` refuses
        (a leading `WITH`); call inside `db_session`."""
        cursor = self.db.get_connection().cursor()
        cursor.execute(_bound(sql, self.db.provider.dialect), params)
        return cursor.fetchall()

    def raw_many(self, sql: str, rows: list[dict[str, Any]]) -> None:
        """A statement once per parameter dict of `rows`, on this session's DB-API connection
        (as `raw_rows`), inside a db_session whose write transaction a statement run through
        Pony has begun (so the session commits it)."""
        self.db.get_connection().cursor().executemany(_bound(sql, self.db.provider.dialect), rows)

    def write(self, work: Callable[[Tx], T]) -> T:
        """Run `work(tx)` in a committed write transaction (agentd/store/writer.py says what
        `work` may do); returns its result."""
        writer = self._writer
        if writer is None:
            with _WRITER_LOCK:
                if self._writer is None:
                    sqlite = self.backend == "sqlite" and self.db.provider.dialect == "SQLite"
                    self._writer = SqliteWriter(self.path, self.db) if sqlite else PonyWriter(self.db)
                writer = self._writer
        result = writer.run(work)
        OUTAGE.cleared(wrote=True)
        return result

    def _writes_held(self) -> ContextManager[Any]:
        """Hold the run writer's commits off while the block runs (nothing to hold before
        its first write)."""
        writer = self._writer
        return writer.held() if isinstance(writer, SqliteWriter) else contextlib.nullcontext()

    def start_checkpoints(self) -> None:
        """SQLite: checkpoint the WAL on a thread of its own from now on (store/checkpoint.py)."""
        if self.backend == "sqlite" and self.checkpointer is None:
            self.checkpointer = WalCheckpointer(self.path, quiet=self._writes_held)
            self.checkpointer.start()

    def close(self) -> None:
        """Stop the checkpoints and close this thread's connection (the process is about to exit)."""
        if self.checkpointer is not None:
            self.checkpointer.stop()
            self.checkpointer = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.db.disconnect()


# The settings row a health check writes while the disk is full, to see when it no longer is.
WRITE_PROBE = "store.write_probe"
_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


@functools.lru_cache(maxsize=512)
def _bound(sql: str, dialect: str) -> str:
    """`sql` with its `$name` parameters in the style of the bound driver (it decides, not
    `backend`: tests run a SQLite store as if shared). Statements repeat: each is rewritten once."""
    return _PARAM.sub(r"%(\1)s" if dialect == "PostgreSQL" else r":\1", sql)


_WRITER_LOCK = threading.Lock()
_PING_LOCK = threading.Lock()


def _check_not_locked(path: Path) -> None:
    # A daemon that cannot write must say so at start, not on the first request.
    try:
        conn = sqlite3.connect(str(path), timeout=1.0)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        finally:
            conn.close()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise StoreError(f"database {path} is locked by another process") from None
        raise StoreError(f"cannot open database {path}: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"database {path} is not a valid SQLite file: {exc}") from None


def open_store(path: Path, database_url: DatabaseUrl | None = None) -> Store:
    """Open (creating or migrating if needed) the database and its schema: PostgreSQL when
    `database_url` is given, else the SQLite file at `path`."""
    if database_url is not None:
        return _open_postgres(path, database_url)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size > 0:
        with open(path, "rb") as fh:
            if fh.read(16) != SQLITE_MAGIC:
                raise StoreError(f"database {path} is not a SQLite file")
    _check_not_locked(path)
    db = Database()

    @db.on_connect(provider="sqlite")
    def _pragmas(_db: Database, connection: Any) -> None:
        cursor = connection.cursor()
        for pragma in CONNECTION_PRAGMAS:
            cursor.execute(f"PRAGMA {pragma}")

    entities = define_entities(db)
    side = sqlite3.connect(str(path), timeout=5.0, isolation_level=None)
    try:
        cur = side.cursor()
        found = migrate.run_steps(cur, "sqlite")
        db.bind(provider="sqlite", filename=str(path), create_db=True)
        utc.install(db)
        exact_json.install(db)
        db.generate_mapping(create_tables=True)
        migrate.run_late_steps(cur, "sqlite", found)
        migrate.record(cur, "sqlite", found)
    except migrate.SchemaError as exc:
        raise StoreError(f"database {path}: {exc}") from None
    except Exception as exc:  # Pony wraps sqlite errors in its own types
        text = str(exc)
        if "locked" in text:
            raise StoreError(f"database {path} is locked by another process") from None
        raise StoreError(f"cannot open database {path}: {text}") from None
    finally:
        side.close()
    store = Store(db=db, e=entities, path=path, backend="sqlite", where=str(path))
    try:
        message_journal.apply_message_journal(path)
    except (OSError, ValueError, sqlite3.Error) as exc:
        store.close()
        raise StoreError(f"cannot apply the message writes left in {message_journal.journal_path(path)}: {exc}") from None
    return store


def _open_postgres(path: Path, target: DatabaseUrl) -> Store:
    """Bind to PostgreSQL; create or migrate the schema under the migration advisory lock,
    so daemons starting at the same instant on one empty database take turns."""
    where = target.masked
    try:
        import psycopg2  # noqa: F401 - the optional extra; say so rather than fail obscurely
    except ImportError:
        raise StoreError("database_url needs psycopg2: pip install 'agentd[postgres]'") from None
    db = Database()
    entities = define_entities(db)
    try:
        side = connect_postgres(target)
    except Exception as exc:  # psycopg2.OperationalError: the message names host and cause
        raise StoreError(f"cannot connect to database {where}: {_first_line(exc)}") from None
    try:
        cur = side.cursor()
        migrate.lock(cur, "postgres")
        try:
            found = migrate.run_steps(cur, "postgres")
            bind_postgres(db, target)
            utc.install(db)
            db.generate_mapping(create_tables=True)
            migrate.run_late_steps(cur, "postgres", found)
            migrate.record(cur, "postgres", found)
        finally:
            migrate.unlock(cur, "postgres")
    except migrate.SchemaError as exc:
        raise StoreError(f"database {where}: {exc}") from None
    except AgentdError:
        raise
    except Exception as exc:
        raise StoreError(f"cannot open database {where}: {_first_line(exc)}") from None
    finally:
        side.close()
    return Store(db=db, e=entities, path=path, backend="postgres", where=where)


def _first_line(exc: BaseException) -> str:
    # psycopg2 messages run over several lines (DETAIL, HINT); the first says what failed.
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
