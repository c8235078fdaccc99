"""Responses of the catalog, provider, usage, workflow and OpenAI-compatible routes."""

from __future__ import annotations

from marshmallow import fields

from agentd.api.schemas_out.base import Bool, Int, NullStr, Num, Out, Str, reply, req, status


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


ModelAddedSchema = reply("ModelAddedSchema", "added", model_id=Str())
ModelRemovedSchema = reply("ModelRemovedSchema", "removed", model_id=Str())


class ProviderSchema(Out):
    id = Str()
    display_name = Str()
    api_key_env = Str()
    base_url = Str()
    key_required = Bool()
    auth_status = status("configured", "missing", "not_required")
    model_count = Int()


KeySetSchema = reply("KeySetSchema", "configured", provider=Str(), env_var=Str())
KeyRemovedSchema = reply("KeyRemovedSchema", "removed", provider=Str())
UrlSetSchema = reply("UrlSetSchema", "updated", provider=Str(), base_url=Str())


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
    alert_levels = req(fields.List(Num()))
    period_start = Str()
    period_end = Str()
    alerts = req(fields.List(fields.Raw()))


BudgetSetSchema = reply("BudgetSetSchema", "updated", limit_usd=Num(), alert_levels=fields.List(Num()))


class BudgetAgentSchema(Out):
    agent_id = Str()
    agent_name = Str()
    spent_usd = Num()
    input_tokens = Int()
    output_tokens = Int()


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


class WorkflowRunStartedSchema(Out):
    run_id = Str()
    status = status("running", "failed")


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
    daemon_id = NullStr()  # the daemon driving the run (null: recorded before runs had owners)


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
