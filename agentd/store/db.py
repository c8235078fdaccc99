"""The Pony ORM database: all entities in one place, bound to SQLite (WAL, FKs on).

Entities are defined by a function rather than at import time so that every
`Store` gets its own `Database` (Pony binds entity classes to one database).
"""

from __future__ import annotations

import re
import sqlite3
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, TypeVar

from pony import orm
from pony.orm import Database, Optional, PrimaryKey, Required, Set

from agentd.errors import AgentdError
from agentd.store import migrate
from agentd.store.backend import DatabaseUrl, bind_postgres, connect_postgres
from agentd.store.checkpoint import AUTOCHECKPOINT_PAGES, WalCheckpointer
from agentd.store.writer import PonyWriter, SqliteWriter, Tx, Writer

T = TypeVar("T")

SQLITE_MAGIC = b"SQLite format 3\x00"


class StoreError(AgentdError):
    """The database cannot be opened (locked, corrupt, unwritable)."""


def _define_entities(db: Database) -> SimpleNamespace:
    class Setting(db.Entity):
        """Small persisted daemon settings (budget limit, provider URLs...)."""
        _table_ = "settings"
        key = PrimaryKey(str)
        value = Optional(orm.Json)

    class AgentRow(db.Entity):
        _table_ = "agents"
        id = PrimaryKey(str)
        name = Required(str, unique=True)
        manifest_toml = Required(orm.LongStr)
        manifest = Required(orm.Json)
        mode = Required(str, default="Auto")
        state = Required(str, default="Running")
        created_at = Required(datetime)
        last_active = Required(datetime)
        session_id = Required(str)
        sessions = Set("SessionRow")
        kv = Set("KvRow")
        uploads = Set("UploadRow")

    class SessionRow(db.Entity):
        _table_ = "sessions"
        id = PrimaryKey(str)
        agent = Required(AgentRow)
        label = Optional(str, nullable=True)
        created_at = Required(datetime)
        items = Set("SessionMessageRow")

    class SessionMessageRow(db.Entity):
        """One message of a session, in order of `id` (schema 4; before, a session was one
        JSON array that every message rewrote whole). `body` is the message's JSON text,
        written by agentd/agents/session_store.py with plain SQL, never loaded as entities."""
        _table_ = "session_messages"
        id = PrimaryKey(int, auto=True, size=64)
        session = Required(SessionRow)
        body = Required(orm.LongStr)
        orm.composite_index(session, id)

    class KvRow(db.Entity):
        _table_ = "memory_kv"
        agent = Required(AgentRow)
        key = Required(str, autostrip=False)  # "a " and "a" are two keys; "  " is a key
        # Any JSON value, `null` included (stored as SQL NULL, read back as None).
        value = Optional(orm.Json, nullable=True)
        updated_at = Required(datetime)
        PrimaryKey(agent, key)

    class UploadRow(db.Entity):
        _table_ = "uploads"
        id = PrimaryKey(str)
        agent = Required(AgentRow)
        filename = Required(str)
        content_type = Required(str)
        size = Required(int)
        # Schema 1 kept the bytes in a file under the home (this path); schema 2 keeps them
        # in `content` so every daemon on a shared database sees the upload. "" = in content.
        path = Optional(str)
        content = Optional(bytes, nullable=True, lazy=True)
        created_at = Required(datetime)

    class UsageRow(db.Entity):
        """One model call: who, which model, tokens and what it cost."""
        _table_ = "usage"
        id = PrimaryKey(int, auto=True)
        agent_id = Required(str, index=True)
        agent_name = Required(str)
        provider = Required(str)
        model = Required(str, index=True)
        input_tokens = Required(int)
        output_tokens = Required(int)
        cost_usd = Required(float)
        priced = Required(bool, default=True)
        at = Required(datetime, index=True)

    class WorkflowRow(db.Entity):
        """A workflow definition; `steps` holds the validated, normalised steps."""
        _table_ = "workflows"
        id = PrimaryKey(str)
        name = Required(str)
        description = Optional(str, default="")
        steps = Required(orm.Json)
        created_at = Required(datetime)
        updated_at = Required(datetime)

    class WorkflowRunRow(db.Entity):
        """One run of a workflow. Not a foreign key to WorkflowRow: a run record outlives
        nothing it needs (it carries the workflow's name) and retention prunes it."""
        _table_ = "workflow_runs"
        id = PrimaryKey(str)
        workflow_id = Required(str, index=True)
        workflow_name = Required(str)
        status = Required(str, index=True)
        input = Optional(orm.LongStr, default="")
        output = Optional(orm.LongStr, nullable=True)
        error = Optional(orm.LongStr, nullable=True)
        # Raw JSON text, not orm.Json (Pony wraps Json values in change-tracking objects):
        # rewritten after every step.
        step_results = Optional(orm.LongStr, default="[]")
        steps_completed = Required(int, default=0)
        created_at = Required(datetime, index=True)
        started_at = Optional(datetime, nullable=True)
        completed_at = Optional(datetime, nullable=True)
        # The daemon driving the run (its [cluster] daemon_id; schema 3). NULL in runs
        # recorded before runs had owners.
        daemon_id = Optional(str, nullable=True)

    class AuditRow(db.Entity):
        """One audit-trail entry (agentd/audit.py): event name, subject, small detail map."""
        _table_ = "audit"
        id = PrimaryKey(int, auto=True)
        at = Required(datetime)
        event = Required(str, index=True)
        subject = Optional(str, default="")
        detail = Optional(orm.Json)

    memory = _define_memory_entities(db)
    return SimpleNamespace(Setting=Setting, AgentRow=AgentRow, SessionRow=SessionRow,
                           SessionMessageRow=SessionMessageRow,
                           KvRow=KvRow, UploadRow=UploadRow, UsageRow=UsageRow,
                           WorkflowRow=WorkflowRow, WorkflowRunRow=WorkflowRunRow,
                           AuditRow=AuditRow, **memory)


def _define_memory_entities(db: Database) -> dict[str, Any]:
    """Semantic memory and the knowledge graph (agentd/memory/). Rows carry a plain
    `agent_id` column, not a foreign key: AgentManager.kill asks the memory service to
    delete them, and fragments are addressed as (agent_id, id) so an export imports
    into another agent with its ids kept."""

    class MemoryRow(db.Entity):
        _table_ = "memory_fragments"
        key = PrimaryKey(int, auto=True)
        agent_id = Required(str)
        id = Required(str)
        content = Required(orm.LongStr)
        embedding = Optional(bytes, nullable=True)  # little-endian float32, L2-normalised
        model = Optional(str, default="")
        metadata = Optional(orm.LongStr, default="{}")  # JSON text
        source = Required(str)
        scope = Required(str)
        # optimistic=False: Pony's optimistic check compares floats read back from SQLite
        # exactly and reports false conflicts; every write to a fragment holds the agent's lock.
        confidence = Required(float, optimistic=False)
        created_at = Required(datetime)
        accessed_at = Required(datetime, optimistic=False)
        access_count = Required(int, default=0, optimistic=False)
        superseded_by = Optional(str, nullable=True)
        orm.composite_key(agent_id, id)
        orm.composite_index(agent_id, created_at)

    class MemoryMetaRow(db.Entity):
        """One metadata key/value of a fragment; value is canonical JSON text."""
        _table_ = "memory_metadata"
        agent_id = Required(str)
        memory_id = Required(str)
        key = Required(str)
        value = Required(str)
        PrimaryKey(agent_id, memory_id, key)
        orm.composite_index(agent_id, key, value)

    class EntityRow(db.Entity):
        _table_ = "kg_entities"
        key = PrimaryKey(int, auto=True)
        agent_id = Required(str)
        id = Required(str)
        entity_type = Required(str)
        name = Required(str)
        properties = Optional(orm.LongStr, default="{}")
        created_at = Required(datetime)
        updated_at = Required(datetime)
        orm.composite_key(agent_id, id)
        orm.composite_index(agent_id, name)

    class RelationRow(db.Entity):
        _table_ = "kg_relations"
        key = PrimaryKey(int, auto=True)
        agent_id = Required(str)
        id = Required(str)
        source = Required(str)
        relation = Required(str)
        target = Required(str)
        properties = Optional(orm.LongStr, default="{}")
        confidence = Required(float, default=1.0, optimistic=False)
        created_at = Required(datetime)
        orm.composite_key(agent_id, id)
        orm.composite_index(agent_id, source)
        orm.composite_index(agent_id, target)

    return {"MemoryRow": MemoryRow, "MemoryMetaRow": MemoryMetaRow, "EntityRow": EntityRow,
            "RelationRow": RelationRow}


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

    @property
    def shared(self) -> bool:
        """True when other daemons may write this database too (PostgreSQL): services
        then re-read what they would otherwise keep in memory."""
        return self.backend == "postgres"

    def ping(self) -> bool:
        """True when a trivial query succeeds."""
        try:
            with orm.db_session:
                self.db.select("SELECT 1")
            return True
        except Exception:  # noqa: BLE001 - any failure means "not healthy"
            return False

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
        # (The bound driver decides, not `backend`: tests run a SQLite store as if shared.)
        style = r"%(\1)s" if self.db.provider.dialect == "PostgreSQL" else r":\1"
        cursor = self.db.get_connection().cursor()
        cursor.execute(_PARAM.sub(style, sql), params)
        return cursor.fetchall()

    def write(self, work: Callable[[Tx], T]) -> T:
        """Run `work(tx)` in a committed write transaction, maybe shared with other threads'
        writes (agentd/store/writer.py says what `work` may do); returns its result."""
        writer = self._writer
        if writer is None:
            with _WRITER_LOCK:
                if self._writer is None:
                    sqlite = self.backend == "sqlite" and self.db.provider.dialect == "SQLite"
                    self._writer = SqliteWriter(self.path, self.db) if sqlite else PonyWriter(self.db)
                writer = self._writer
        return writer.run(work)

    def start_checkpoints(self) -> None:
        """SQLite: checkpoint the WAL on a thread of its own from now on (store/checkpoint.py)."""
        if self.backend == "sqlite" and self.checkpointer is None:
            self.checkpointer = WalCheckpointer(self.path)
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


_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_WRITER_LOCK = threading.Lock()


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
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA busy_timeout = 5000")
        # Checkpoints run on the store's own thread (store/checkpoint.py); this is the backstop.
        cursor.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES}")

    entities = _define_entities(db)
    side = sqlite3.connect(str(path), timeout=5.0, isolation_level=None)
    try:
        cur = side.cursor()
        found = migrate.run_steps(cur, "sqlite")
        db.bind(provider="sqlite", filename=str(path), create_db=True)
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
    return Store(db=db, e=entities, path=path, backend="sqlite", where=str(path))


def _open_postgres(path: Path, target: DatabaseUrl) -> Store:
    """Bind to PostgreSQL; create or migrate the schema under the migration advisory lock,
    so daemons starting at the same instant on one empty database take turns."""
    where = target.masked
    try:
        import psycopg2  # noqa: F401 - the optional extra; say so rather than fail obscurely
    except ImportError:
        raise StoreError("database_url needs psycopg2: pip install 'agentd[postgres]'") from None
    db = Database()
    entities = _define_entities(db)
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
