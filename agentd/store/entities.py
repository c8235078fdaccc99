"""Every Pony entity of the store, defined per `Database` (Pony binds entity classes to one
database, so each `Store` gets classes of its own)."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace
from typing import Any

from pony import orm
from pony.orm import Database, Optional, PrimaryKey, Required, Set

from agentd.store.exact_json import ExactJson


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
        # The scoped API key that spawned the agent or last changed its manifest (agentd/key_runs.py):
        # its manifest's jobs and triggers act as it, also when made again at a start. NULL: the admin
        # (schema 10).
        key_id = Optional(str, nullable=True)
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
        # Any JSON value, `null` included (stored as SQL NULL, read back as None); numbers
        # read back exactly, big integers included.
        value = Optional(ExactJson, nullable=True)
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
        # (Indexed on `at` only: every report reads a window of time; see schema_steps._step_5.)
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
    autonomy = define_autonomy_entities(db)
    schedules = define_schedule_entities(db)
    return SimpleNamespace(Setting=Setting, AgentRow=AgentRow, SessionRow=SessionRow,
                           SessionMessageRow=SessionMessageRow,
                           KvRow=KvRow, UploadRow=UploadRow, UsageRow=UsageRow,
                           WorkflowRow=WorkflowRow, WorkflowRunRow=WorkflowRunRow,
                           AuditRow=AuditRow, ApiKeyRow=ApiKeyRow, KeyRateRow=KeyRateRow, **memory, **autonomy, **schedules, **define_openai_entities(db))


def define_schedule_entities(db: Database) -> dict[str, Any]:
    """Cron jobs and their runs (agentd/schedules/). `agent_id` is a plain column: killing
    an agent deletes its jobs through the scheduler, and a run record outlives its job's
    agent in no way that needs a key. Times the scheduler compares in SQL are Unix seconds."""

    class CronJobRow(db.Entity):
        _table_ = "cron_jobs"
        id = PrimaryKey(str)
        name = Required(str)
        agent_id = Optional(str, default="", index=True)  # "" for a workflow job
        schedule = Required(orm.Json)
        action = Required(orm.Json)
        delivery = Required(orm.Json)
        enabled = Required(bool, default=True)
        one_shot = Required(bool, default=False)
        catch_up = Required(str, default="skip")
        max_runs_per_day = Optional(int, nullable=True)
        max_cost_usd_per_day = Optional(float, nullable=True, optimistic=False)
        # The next due time; NULL while the job is paused or has nothing left to run. The
        # ticker's one query reads this index; a daemon claims a due time by moving it on.
        next_due = Optional(float, nullable=True, index=True, optimistic=False)
        # Where the job comes from: api, tool, manifest (the agent's manifest schedule).
        origin = Required(str, default="api")
        paused_reason = Optional(str, nullable=True)
        failures = Required(int, default=0)  # provider failures in a row
        backoff_until = Optional(float, nullable=True, optimistic=False)
        last_run = Optional(orm.Json, nullable=True)
        created_at = Required(datetime)
        # The scoped API key that created the job: its runs act as that key (NULL: the admin's).
        key_id = Optional(str, nullable=True)

    class CronRunRow(db.Entity):
        _table_ = "cron_runs"
        id = PrimaryKey(str)
        job_id = Required(str, index=True)
        daemon_id = Required(str)
        due_at = Optional(float, nullable=True)
        started_at = Required(float, optimistic=False)
        finished_at = Optional(float, nullable=True, optimistic=False)
        status = Required(str, index=True)  # ok, failed, skipped, running
        reason = Optional(str, default="")
        cost_usd = Optional(float, nullable=True, optimistic=False)
        output = Optional(orm.LongStr, nullable=True)
        error = Optional(orm.LongStr, nullable=True)
        delivery = Optional(orm.Json, nullable=True)

    return {"CronJobRow": CronJobRow, "CronRunRow": CronRunRow}


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


def define_openai_entities(db: Database) -> dict[str, Any]:
    """What the OpenAI-compatible API keeps: stored Responses (`store: true`), read back by
    `GET /v1/responses/{id}` and continued with `previous_response_id`. `agent_id` is a
    plain column: a response outlives nothing but its own row."""

    class ResponseRow(db.Entity):
        _table_ = "openai_responses"
        id = PrimaryKey(str)
        agent_id = Required(str, index=True)
        created_at = Required(datetime)
        body = Required(orm.LongStr)  # the response object's JSON, as the client got it

    return {"ResponseRow": ResponseRow}


def define_autonomy_entities(db: Database) -> dict[str, Any]:
    """Event triggers (agentd/triggers/) and the shared task board (agentd/tasks/). Plain
    `agent_id` columns: killing an agent deletes its triggers through the trigger store,
    and a task outlives the agents that posted or claimed it."""

    class TriggerRow(db.Entity):
        """A trigger: run `agent_id` with `prompt_template` when an event matches `pattern`.
        Its counters are the state every daemon admits a firing against (one row lock)."""
        _table_ = "triggers"
        id = PrimaryKey(str)
        agent_id = Required(str, index=True)
        kind = Required(str)  # the pattern's one key (memory_key_pattern, content_match, ...)
        pattern = Required(orm.LongStr)  # the pattern object as JSON text
        prompt_template = Required(orm.LongStr)
        enabled = Required(bool, default=True)
        source = Required(str, default="api")  # api | manifest
        max_runs_per_day = Optional(int, nullable=True)
        max_cost_usd_per_day = Optional(float, nullable=True)
        rate_limit_per_minute = Optional(int, nullable=True)  # None: the config's default
        paused_reason = Optional(str, nullable=True)
        day = Optional(str, default="")  # the UTC day the counters below count
        runs_today = Required(int, default=0)
        cost_today = Required(float, default=0.0)
        window_start = Optional(datetime, nullable=True)  # the current rate-limit minute
        window_count = Required(int, default=0)
        fire_count = Required(int, default=0)
        last_fired_at = Optional(datetime, nullable=True)
        created_at = Required(datetime)
        # The scoped API key that created the trigger: its runs act as that key (NULL: the admin's).
        key_id = Optional(str, nullable=True)

    class TaskRow(db.Entity):
        """One task of the shared board; claims are conditional updates of `status`."""
        _table_ = "tasks"
        id = PrimaryKey(str)
        title = Required(str)
        description = Optional(orm.LongStr, default="")
        status = Required(str, index=True)  # pending | in_progress | completed
        assigned_to = Optional(str, nullable=True)  # an agent id (or a name no agent has yet)
        created_by = Optional(str, nullable=True)
        claimed_by = Optional(str, nullable=True)
        result = Optional(orm.LongStr, nullable=True)
        created_at = Required(datetime, index=True)
        claimed_at = Optional(datetime, nullable=True)
        completed_at = Optional(datetime, nullable=True)

    return {"TriggerRow": TriggerRow, "TaskRow": TaskRow}
