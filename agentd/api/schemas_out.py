"""marshmallow schemas of response bodies, for the OpenAPI document.

They describe what the routes answer (required = always present); extra fields
are allowed (`unknown = INCLUDE`) so a field added later does not make old
clients' validators fail. The fuzz test (tests/test_fuzz_api.py) checks every
response against them.
"""

from __future__ import annotations

from marshmallow import INCLUDE, Schema, fields, validate


class Out(Schema):
    """Base of response schemas: documented fields required, extra fields allowed."""

    class Meta:
        unknown = INCLUDE


def req(field: fields.Field) -> fields.Field:
    """Mark a field as always present."""
    field.required = True
    return field


def Str(**kw) -> fields.Field:  # noqa: N802 - reads like a type in the tables below
    return req(fields.String(**kw))


def Int(**kw) -> fields.Field:  # noqa: N802
    return req(fields.Integer(**kw))


def Num(**kw) -> fields.Field:  # noqa: N802
    return req(fields.Float(**kw))


def Bool(**kw) -> fields.Field:  # noqa: N802
    return req(fields.Boolean(**kw))


def NullStr() -> fields.Field:  # noqa: N802
    return req(fields.String(allow_none=True))


def status(*values: str) -> fields.Field:
    """A `status` field with its possible values."""
    return req(fields.String(validate=validate.OneOf(values)))


# -- errors ------------------------------------------------------------------------

class ErrorSchema(Out):
    error = Str(metadata={"description": "What went wrong"})


class OpenAIErrorBody(Out):
    message = Str()
    type = Str(metadata={"example": "invalid_request_error"})
    code = req(fields.String(allow_none=True))


class OpenAIErrorSchema(Out):
    error = req(fields.Nested(OpenAIErrorBody))


# -- system ------------------------------------------------------------------------

class HealthSchema(Out):
    status = Str(metadata={"example": "ok"})


class HealthDetailSchema(Out):
    status = status("ok", "degraded")
    version = Str()
    uptime_seconds = Int()
    database = Str()
    agent_count = Int()
    thread_pool = req(fields.Dict(keys=fields.String(), values=fields.Raw()))
    started_at = Str()


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


class SessionSchema(Out):
    session_id = Str()
    agent_id = Str()
    message_count = Int()
    context_window_tokens = Int()
    label = NullStr()
    messages = req(fields.List(fields.Nested(SessionMessageSchema)))


class ModeSetSchema(Out):
    status = status("updated")
    agent_id = Str()
    mode = Str()


class KilledSchema(Out):
    status = status("killed")
    agent_id = Str()


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


class ResetSchema(Out):
    status = status("reset")
    agent_id = Str()
    session_id = Str()


class SessionDeletedSchema(Out):
    status = status("deleted")
    session_id = Str()


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


# -- catalog, providers, usage, budget ---------------------------------------------------

class ModelSchema(Out):
    id = Str()
    display_name = Str()
    provider = Str()
    tier = Str()
    context_window = Int()
    max_output_tokens = Int()
    input_cost_per_m = Num()
    output_cost_per_m = Num()
    supports_tools = Bool()
    supports_vision = Bool()
    supports_streaming = Bool()
    aliases = req(fields.List(fields.String()))


class ModelAddedSchema(Out):
    status = status("added")
    model_id = Str()


class ModelRemovedSchema(Out):
    status = status("removed")
    model_id = Str()


class ProviderSchema(Out):
    id = Str()
    display_name = Str()
    api_key_env = Str()
    base_url = Str()
    key_required = Bool()
    auth_status = status("configured", "missing", "not_required")
    model_count = Int()


class KeySetSchema(Out):
    status = status("configured")
    provider = Str()
    env_var = Str()


class KeyRemovedSchema(Out):
    status = status("removed")
    provider = Str()


class UrlSetSchema(Out):
    status = status("updated")
    provider = Str()
    base_url = Str()


class ProviderTestSchema(Out):
    status = Str()
    provider = Str()


class UsageSchema(Out):
    total_input_tokens = Int()
    total_output_tokens = Int()
    total_cost_usd = Num()
    period_start = Str()
    period_end = Str()


class UsageByModelSchema(Out):
    model = Str()
    input_tokens = Int()
    output_tokens = Int()
    cost_usd = Num()
    requests = Int()


class BudgetStatusSchema(Out):
    limit_usd = Num()
    spent_usd = Num()
    remaining_usd = Num()
    limited = Bool()
    period_start = Str()
    period_end = Str()
    alerts = req(fields.List(fields.Raw()))


class BudgetSetSchema(Out):
    status = status("updated")
    limit_usd = Num()


class BudgetAgentSchema(Out):
    agent_id = Str()
    agent_name = Str()
    spent_usd = Num()
    input_tokens = Int()
    output_tokens = Int()


# -- memory ------------------------------------------------------------------------

class KvOkSchema(Out):
    status = status("ok")


class KvDeletedSchema(Out):
    status = status("deleted")


# -- workflows ---------------------------------------------------------------------

class WorkflowCreatedSchema(Out):
    workflow_id = Str()


class WorkflowItemSchema(Out):
    id = Str()
    name = Str()
    description = Str()
    steps = Int(metadata={"description": "number of steps"})
    created_at = Str()


class WorkflowDetailSchema(Out):
    id = Str()
    name = Str()
    description = Str()
    steps = req(fields.List(fields.Dict()))
    created_at = Str()


class WorkflowChangedSchema(Out):
    status = status("updated", "removed")
    workflow_id = Str()


class WorkflowRunResultSchema(Out):
    run_id = Str()
    output = Str()
    status = status("completed", "failed")


class RunStateSchema(Out):
    status = status("pending", "running", "completed", "failed")


class WorkflowRunItemSchema(Out):
    id = Str()
    workflow_id = Str()
    workflow_name = Str()
    state = req(fields.Nested(RunStateSchema))
    steps_completed = Int()
    started_at = NullStr()
    completed_at = NullStr()
    error = NullStr()


class WorkflowRunDetailSchema(WorkflowRunItemSchema):
    input = Str()
    output = NullStr()
    step_results = req(fields.List(fields.Dict()))


# -- OpenAI-compatible -------------------------------------------------------------------

class ChatMessageOut(Out):
    role = status("assistant")
    content = NullStr()
    tool_calls = fields.List(fields.Dict())


class ChatChoiceSchema(Out):
    index = Int()
    message = req(fields.Nested(ChatMessageOut))
    finish_reason = status("stop", "length", "tool_calls")


class ChatUsageSchema(Out):
    prompt_tokens = Int()
    completion_tokens = Int()
    total_tokens = Int()


class ChatCompletionSchema(Out):
    id = Str()
    object = status("chat.completion")
    created = Int()
    model = Str()
    choices = req(fields.List(fields.Nested(ChatChoiceSchema)))
    usage = req(fields.Nested(ChatUsageSchema))


class ModelCardSchema(Out):
    id = Str()
    object = status("model")
    created = Int()
    owned_by = Str()


class ModelListSchema(Out):
    object = status("list")
    data = req(fields.List(fields.Nested(ModelCardSchema)))


# SSE bodies are text; the event grammar is in each operation's description.
SSE = {"type": "object", "description": "One Server-Sent Event (`event` name and JSON `data`)",
       "properties": {"event": {"type": "string"}, "data": {"type": "string"}, "id": {"type": "string"},
                      "retry": {"type": "integer"}},
       "required": ["data"]}
ANY_JSON: dict = {"description": "Any JSON value"}
