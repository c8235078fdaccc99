"""Responses of the system, agent and memory routes."""

from __future__ import annotations

from marshmallow import fields

from agentd.api.schemas_out.base import Bool, Int, NullStr, Out, Str, reply, req, status


# -- system ------------------------------------------------------------------------

class HealthSchema(Out):
    status = status("ok", "degraded")


class HealthDetailSchema(Out):
    status = status("ok", "degraded")
    version = Str()
    uptime_seconds = Int()
    database = Str()
    agent_count = Int()
    thread_pool = req(fields.Dict(keys=fields.String(), values=fields.Raw()))
    started_at = Str()
    malloc_arenas = Int(allow_none=True)
    malloc_mmap_threshold = Int(allow_none=True)
    sqlite_page_cache_kib = Int(allow_none=True)
    sqlite_heap_kib = Int(allow_none=True)
    caches = req(fields.Dict(keys=fields.String(), values=fields.Dict(keys=fields.String(),
                                                                       values=fields.Integer())))


class VersionSchema(Out):
    name = Str()
    version = Str()
    build_date = Str()
    git_sha = Str()
    rust_version = Str()
    platform = Str()
    arch = Str()


class AgentSummarySchema(Out):
    id = Str()
    name = Str()
    state = Str()
    mode = Str()
    created_at = Str()
    model_provider = Str()
    model_name = Str()
    profile = Str()


class StatusSchema(Out):
    status = Str()
    agent_count = Int()
    default_provider = Str()
    default_model = Str()
    uptime_seconds = Int()
    api_listen = Str()
    home_dir = Str()
    log_level = Str()
    network_enabled = Bool()
    agents = req(fields.List(fields.Nested(AgentSummarySchema)))


class StatusOnlySchema(Out):
    status = Str()


# -- agents ------------------------------------------------------------------------

class SpawnedSchema(Out):
    agent_id = Str()
    name = Str()
    warnings = req(fields.List(fields.String()))


class IdentitySchema(Out):
    emoji = Str()
    avatar_url = NullStr()
    color = Str()


class AgentItemSchema(Out):
    id = Str()
    name = Str()
    state = Str()
    mode = status("Auto", "Manual", "Observe")
    created_at = Str()
    last_active = Str()
    model_provider = Str()
    model_name = Str()
    model_tier = Str()
    auth_status = Str()
    ready = Bool()
    profile = Str()
    identity = req(fields.Nested(IdentitySchema))


class ModelRefSchema(Out):
    provider = Str()
    model = Str()


class CapabilitiesSchema(Out):
    tools = req(fields.List(fields.String()))
    network = Bool()


class AgentDetailSchema(Out):
    id = Str()
    name = Str()
    state = Str()
    mode = status("Auto", "Manual", "Observe")
    profile = Str()
    created_at = Str()
    session_id = Str()
    model = req(fields.Nested(ModelRefSchema))
    capabilities = req(fields.Nested(CapabilitiesSchema))
    description = Str()
    tags = req(fields.List(fields.String()))
    identity = req(fields.Nested(IdentitySchema))
    skills = req(fields.List(fields.Raw()))
    skills_mode = Str()
    mcp_servers = req(fields.List(fields.Raw()))
    mcp_servers_mode = Str()
    fallback_models = req(fields.List(fields.Raw()))


class MessageResultSchema(Out):
    response = Str()
    input_tokens = Int()
    output_tokens = Int()
    iterations = Int()
    cost_usd = req(fields.Float(allow_none=True))


class SessionMessageSchema(Out):
    role = Str()
    content = Str()
    source = fields.String(metadata={"description": "`cron`: a user message a cron job sent (absent otherwise)"})


class SessionSchema(Out):
    session_id = Str()
    agent_id = Str()
    message_count = Int()
    context_window_tokens = Int()
    label = NullStr()
    messages = req(fields.List(fields.Nested(SessionMessageSchema)))


ModeSetSchema = reply("ModeSetSchema", "updated", agent_id=Str(), mode=Str())
AgentUpdatedSchema = reply("AgentUpdatedSchema", "updated", agent_id=Str(), model_provider=Str(), model_name=Str(),
                           warnings=req(fields.List(fields.String())))
KilledSchema = reply("KilledSchema", "killed", agent_id=Str())


class StoppedSchema(Out):
    status = status("stopped", "idle")
    agent_id = Str()
    was_running = Bool()
    message = Str()


class CompactSchema(Out):
    status = Str()
    compacted = Bool()
    summarized_messages = Int()
    kept_messages = Int()
    message = Str()


ResetSchema = reply("ResetSchema", "reset", agent_id=Str(), session_id=Str())
SessionDeletedSchema = reply("SessionDeletedSchema", "deleted", session_id=Str())


class UploadSchema(Out):
    file_id = Str()
    filename = Str()
    content_type = Str()
    size = Int()


class ProfileSchema(Out):
    name = Str()
    tools = req(fields.List(fields.String()))


class ApprovalSchema(Out):
    id = Str()
    agent_id = Str()
    agent_name = Str()
    tool = Str()
    input = req(fields.Raw())
    requested_at = Str()


class ApprovalDecisionSchema(Out):
    status = status("approved", "rejected")
    id = Str()
    tool = Str()


# -- memory ------------------------------------------------------------------------

KvOkSchema = reply("KvOkSchema", "ok")
KvDeletedSchema = reply("KvDeletedSchema", "deleted")
