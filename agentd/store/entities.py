"""Every Pony entity of the store, defined per `Database` (Pony binds entity classes to one
database, so each `Store` gets classes of its own)."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace
from typing import Any

from pony import orm
from pony.orm import Database, Optional, PrimaryKey, Required, Set


def define_entities(db: Database) -> SimpleNamespace:
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
        # (Indexed on `at` only: every report reads a window of time; see migrate._step_5.)
        agent_id = Required(str)
        agent_name = Required(str)
        provider = Required(str)
        model = Required(str)
        input_tokens = Required(int)
        output_tokens = Required(int)
        cost_usd = Required(float)
        priced = Required(bool, default=True)
        at = Required(datetime, index=True)
        # The scoped API key that started the run (agentd/apikeys.py); NULL: the admin key,
        # a channel, a schedule (schema 6).
        key_id = Optional(str, nullable=True)

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

    class ApiKeyRow(db.Entity):
        """A scoped API key (agentd/apikeys.py). Only a salted hash of its secret is stored.
        Settings are last-writer-wins (optimistic=False): two admins changing one key at once
        is no conflict worth a failed request."""
        _table_ = "api_keys"
        id = PrimaryKey(str)
        name = Required(str, unique=True)
        salt = Required(bytes, optimistic=False)
        secret_hash = Required(bytes, optimistic=False)
        scopes = Required(orm.Json, optimistic=False)
        agents = Optional(orm.Json, optimistic=False)
        budget_usd_per_day = Optional(float, nullable=True, optimistic=False)
        budget_usd_per_month = Optional(float, nullable=True, optimistic=False)
        rate_limit_per_minute = Optional(int, nullable=True, optimistic=False)
        expires_at = Optional(datetime, nullable=True, optimistic=False)
        enabled = Required(bool, default=True, optimistic=False)
        created_at = Required(datetime)
        updated_at = Required(datetime, optimistic=False)
        last_used_at = Optional(datetime, nullable=True, optimistic=False)

    class KeyRateRow(db.Entity):
        """Requests of a key in one UTC minute: the rate limit every daemon on the database counts."""
        _table_ = "api_key_rate"
        key_id = Required(str)
        minute = Required(int, size=64)
        count = Required(int, default=0)
        PrimaryKey(key_id, minute)

    memory = define_memory_entities(db)
    return SimpleNamespace(Setting=Setting, AgentRow=AgentRow, SessionRow=SessionRow,
                           SessionMessageRow=SessionMessageRow,
                           KvRow=KvRow, UploadRow=UploadRow, UsageRow=UsageRow,
                           WorkflowRow=WorkflowRow, WorkflowRunRow=WorkflowRunRow,
                           AuditRow=AuditRow, ApiKeyRow=ApiKeyRow, KeyRateRow=KeyRateRow, **memory)


def define_memory_entities(db: Database) -> dict[str, Any]:
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
        key = Required(str, autostrip=False)  # "a", "a " and " a" are three keys of one fragment
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
