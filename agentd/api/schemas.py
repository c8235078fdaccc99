"""marshmallow schemas for request bodies and query strings (strict types, clear messages).

The routes validate with these classes and the OpenAPI document is built from the
same classes (agentd/api/openapi.py), so what is documented is what is checked.
"""

from __future__ import annotations

from typing import Any

from marshmallow import (EXCLUDE, INCLUDE, RAISE, Schema, ValidationError, fields, pre_load, validate,
                         validates_schema)

from agentd.principals import PERSON_MAX
from agentd.schema_fields import NOT_BLANK, StrictBoolean, StrictFloat, is_blank

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
MODES = ("Auto", "Manual", "Observe")


class _Body(Schema):
    class Meta:
        unknown = RAISE


class SpawnSchema(_Body):
    manifest_toml = fields.String(load_default=None, allow_none=True, metadata={
        "description": "Agent manifest (TOML, max 1 MB). Required unless `signed_manifest` is given"})
    signed_manifest = fields.String(load_default=None, allow_none=True, metadata={
        "description": "Ed25519-signed manifest envelope (JSON text)"})


class AttachmentSchema(Schema):
    file_id = fields.String(required=True, metadata={"description": "id from POST /api/agents/{id}/upload",
                                                     "format": "uuid"})
    filename = fields.String(load_default="")
    content_type = fields.String(load_default="")


class MessageSchema(Schema):
    # Unknown keys (sender_id, ...) are ignored: clients of other runtimes send them.
    class Meta:
        unknown = EXCLUDE

    message = fields.String(required=True, validate=validate.Regexp(NOT_BLANK, error="must not be empty"),
                            metadata={"description": "The message (max 64 KB)", "maxLength": 65536})
    # null is the option left out (dropped before loading; allow_none documents it).
    attachments = fields.List(fields.Nested(AttachmentSchema), load_default=list, allow_none=True)
    user = fields.String(allow_none=True, validate=validate.Length(min=1, max=PERSON_MAX), metadata={
        "description": "The person talking: the agent answers in a session of this person's own"})
    session = fields.String(allow_none=True, validate=validate.Length(min=1, max=PERSON_MAX), metadata={
        "description": "A named session of the agent to talk in (beats `user`)"})

    @pre_load
    def _null_is_absent(self, data: Any, **_: Any) -> Any:
        """JSON clients send `null` for an option they leave out (a WebSocket frame's are read so too)."""
        if isinstance(data, dict) and any(data.get(key, "") is None for key in _MESSAGE_OPTIONS):
            return {k: v for k, v in data.items() if not (v is None and k in _MESSAGE_OPTIONS)}
        return data

    def fast_load(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """What load() returns for the common body (a non-blank `message` string and no
        `attachments`; other keys dropped as EXCLUDE drops them), without marshmallow's
        per-field machinery, a measurable part of a message's cost; None: use load()."""
        message = data.get("message")
        if type(message) is not str or "attachments" in data or "user" in data or "session" in data \
                or is_blank(message):
            return None
        return {"message": message, "attachments": []}


_MESSAGE_OPTIONS = ("attachments", "user", "session")


# Shared instances: a schema may load many bodies concurrently, and building one per
# request (fields are deep-copied) is a measurable part of a message's cost.
MESSAGE_SCHEMA = MessageSchema()


class ModeSchema(_Body):
    mode = fields.String(required=True, validate=validate.OneOf(MODES))


class ManifestSchema(_Body):
    manifest_toml = fields.String(required=True, validate=validate.Regexp(NOT_BLANK, error="must not be empty"),
                                  metadata={"description": "The agent's new manifest (TOML, max 1 MB); "
                                                           "its `name` must stay the agent's"})


class AgentModelSchema(_Body):
    model = fields.String(required=True, validate=validate.Regexp(r"^(default|[^/\s]+/\S+)$",
                                                                  error="must be provider/model or default"),
                          metadata={"description": "`provider/model`, or `default` for the config's default model",
                                    "example": "openai/gpt-4o"})


class ProviderKeySchema(_Body):
    api_key = fields.String(required=True, validate=validate.Regexp(NOT_BLANK, error="must not be empty"),
                            metadata={"description": "The key; kept in the daemon's environment and "
                                                     "secrets file, never in config.toml"})


class ProviderUrlSchema(_Body):
    base_url = fields.String(required=True, validate=validate.Regexp(r"^\s*https?://", error="must be an http:// or https:// URL"),
                             metadata={"description": "http(s) URL of the provider's API, with a host"})


class WorkflowRunSchema(_Body):
    input = fields.String(load_default="", metadata={"description": "The first step's {{input}} (max 64 KB)"})


# -- workflows (documented here; agentd/workflows/definition.py checks the semantics) --------

class WorkflowAgentRefSchema(_Body):
    id = fields.String(metadata={"description": "Agent id"})
    name = fields.String(metadata={"description": "Agent name"})


class WorkflowStepSchema(_Body):
    name = fields.String(allow_none=True, validate=validate.Length(min=1, max=200))
    agent_name = fields.String(allow_none=True, metadata={"description": "Agent by name"})
    agent_id = fields.String(allow_none=True, metadata={"description": "Agent by id"})
    agent = fields.Nested(WorkflowAgentRefSchema, allow_none=True)
    prompt = fields.String(allow_none=True, metadata={"description": "Template: {{input}}, {{var}}"})
    mode = fields.String(allow_none=True, validate=validate.OneOf(
        ("sequential", "fan_out", "collect", "conditional", "loop")))
    timeout_secs = fields.Integer(allow_none=True, strict=True, validate=validate.Range(1, 3600))
    error_mode = fields.String(allow_none=True, validate=validate.OneOf(("fail", "skip", "retry")))
    max_retries = fields.Integer(allow_none=True, strict=True, validate=validate.Range(1, 10))
    output_var = fields.String(allow_none=True, validate=validate.Regexp(r"^[A-Za-z_][A-Za-z0-9_]*$"))
    condition = fields.String(allow_none=True)
    max_iterations = fields.Integer(allow_none=True, strict=True, validate=validate.Range(1, 100))
    until = fields.String(allow_none=True)


class WorkflowSchema(_Body):
    name = fields.String(required=True, validate=[validate.Length(max=200), validate.Regexp(NOT_BLANK)])
    description = fields.String(allow_none=True)
    steps = fields.List(fields.Nested(WorkflowStepSchema), required=True,
                        validate=validate.Length(min=1, max=100))


# -- query strings ------------------------------------------------------------------

class _Query(Schema):
    class Meta:
        unknown = EXCLUDE


class ShutdownQuery(_Query):
    home = fields.String(validate=validate.Length(min=1, max=4096), metadata={
        "description": "Stop only if this daemon serves this home folder (409 otherwise): how `agentd stop` "
                       "makes sure a stale daemon.json never stops another home's daemon"})


class SessionQuery(_Query):
    user = fields.String(validate=validate.Length(min=1, max=256), metadata={
        "description": "The session of this person (as a message's `user` names it)"})
    session = fields.String(validate=validate.Length(min=1, max=256), metadata={
        "description": "The named session (as a message's `session` names it; beats `user`)"})


class ModelsQuery(_Query):
    provider = fields.String(metadata={"description": "Only this provider's models"})
    tier = fields.String(metadata={"description": "Only this tier"})


class PeriodQuery(_Query):
    since = fields.String(metadata={"description": "Start, ISO 8601 date or date-time "
                                                   "(default: start of this month)"})
    until = fields.String(metadata={"description": "End, ISO 8601 (default: now); must be after `since`"})


class UsageQuery(PeriodQuery):
    key = fields.String(metadata={"description": "Only what this scoped API key (id or name) paid for"})


class TicksQuery(_Query):
    n = fields.Integer(load_default=3, metadata={"description": "Number of ticks (more than 100 count as 100)"})
    interval = fields.Float(load_default=0.5, validate=validate.Range(min=0), metadata={
        "description": "Seconds between ticks (more than 10 count as 10)"})


class ChannelTestBodySchema(_Body):
    message = fields.String(load_default="Test message from agentd",
                            validate=validate.Regexp(NOT_BLANK, error="must be a non-empty string"))
    chat_id = fields.String(metadata={"description": "Where to send (platform chat/room id)"})
    channel_id = fields.String(metadata={"description": "Same as chat_id"})
    target = fields.String(metadata={"description": "Same as chat_id"})


class QrStatusQuery(_Query):
    session_id = fields.String(required=True, validate=validate.Regexp(NOT_BLANK),
                               metadata={"description": "From POST .../qr/start"})


class AuditQuery(_Query):
    limit = fields.Integer(validate=validate.Range(min=1), metadata={"description": "At most this many (default 50)"})
    event = fields.String(metadata={"description": "Only events whose name starts with this"})
    subject = fields.String(metadata={"description": "Only events about this subject (an agent's name, a key's)"})
    since = fields.DateTime(metadata={"description": "Only events at or after this time (RFC 3339, e.g. 2026-01-31T09:00:00Z)"})
    until = fields.DateTime(metadata={"description": "Only events at or before this time (RFC 3339, e.g. 2026-01-31T09:00:00Z)"})


# -- OpenAI-compatible chat completions ------------------------------------------------------

class StopField(fields.Field):
    """`stop`: a string or an array of up to 4 strings; loads as a tuple."""

    def _deserialize(self, value, attr, data, **kwargs):  # type: ignore[override]
        # None never gets here: marshmallow answers it itself (allow_none, or "may not be null").
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and len(value) <= 4 and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ValidationError("must be a string or an array of at most 4 strings")


class ResponseFormatSchema(Schema):
    class Meta:
        unknown = INCLUDE

    type = fields.String(required=True, validate=validate.OneOf(("text", "json_object", "json_schema")))
    json_schema = fields.Dict(metadata={"description": "`{name, schema, strict}` with type json_schema "
                                                       "(`name` required)"})

    @validates_schema
    def _json_schema_named(self, data: dict[str, Any], **_: Any) -> None:
        # A provider refuses a json_schema format without its schema's name: refused here
        # with a 400 instead of coming back as the provider's failure.
        if data.get("type") == "json_schema":
            spec = data.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
                raise ValidationError("required with type json_schema: an object with a `name`",
                                      field_name="json_schema")


class ChatMessageSchema(Schema):
    class Meta:
        unknown = INCLUDE

    role = fields.String(required=True, validate=validate.OneOf(CHAT_ROLES))
    content = fields.Raw(allow_none=True, metadata={
        "description": "A string, or an array of parts: `{type: text, text}` and "
                       "`{type: image_url, image_url: {url: data:image/...;base64,...}}`",
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}, {"type": "null"}]})


class ChatRequestSchema(Schema):
    """POST /v1/chat/completions. Unknown fields are accepted and ignored, as OpenAI
    clients send many; the ones that would change the answer and cannot be honoured
    are refused by the route (agentd/api/routes_openai.py `REFUSED`)."""

    class Meta:
        unknown = INCLUDE

    # An empty `model` names no agent: the route answers it 404 `model_not_found`, as the spec does.
    model = fields.String(required=True, metadata={
        "description": "The agent: `agentd:<name>`, its id, or its name"})
    # An empty list holds no user message: the route answers it 400 `missing_message`.
    messages = fields.List(fields.Nested(ChatMessageSchema), required=True)
    # null is the default (false), as OpenAI takes it.
    stream = StrictBoolean(allow_none=True)
    stream_options = fields.Dict(allow_none=True, metadata={"description": "`{include_usage: true}`"})
    max_tokens = fields.Integer(strict=True, allow_none=True, validate=validate.Range(1, 1_000_000))
    max_completion_tokens = fields.Integer(strict=True, allow_none=True, validate=validate.Range(1, 1_000_000))
    temperature = StrictFloat(allow_none=True, validate=validate.Range(0.0, 2.0))
    top_p = StrictFloat(allow_none=True, validate=validate.Range(0.0, 1.0))
    stop = StopField(allow_none=True, metadata={"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}, {"type": "null"}]})
    seed = fields.Integer(strict=True, allow_none=True)
    presence_penalty = StrictFloat(allow_none=True, validate=validate.Range(-2.0, 2.0))
    frequency_penalty = StrictFloat(allow_none=True, validate=validate.Range(-2.0, 2.0))
    response_format = fields.Nested(ResponseFormatSchema, allow_none=True)
    user = fields.String(allow_none=True, metadata={"description": "End-user id, passed on where supported"})
    n = fields.Integer(strict=True, allow_none=True, validate=validate.Range(1, 128),
                       metadata={"description": "The answer always has one choice: more is dropped and "
                                                "named in `x-agentd-dropped-params`"})
    # Accepted only with the values that change nothing (the route refuses others by name).
    tools = fields.List(fields.Dict(), allow_none=True, validate=validate.Length(max=0), metadata={
        "description": "Refused when non-empty: agents own their tools"})
    functions = fields.List(fields.Dict(), allow_none=True, validate=validate.Length(max=0))
    tool_choice = fields.String(allow_none=True, validate=validate.OneOf(("none", "auto")))
    function_call = fields.String(allow_none=True, validate=validate.OneOf(("none", "auto")))
    logprobs = StrictBoolean(allow_none=True, validate=validate.OneOf([False]))
    top_logprobs = fields.Raw(allow_none=True, validate=validate.OneOf([None]), metadata={"type": "null"})
    logit_bias = fields.Dict(allow_none=True, validate=validate.Length(max=0), metadata={"maxProperties": 0})

    def fast_load(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """What load() returns for the common request (only `model`, `messages` with a valid
        `role` each, and maybe `stream`), without marshmallow's machinery (see MessageSchema);
        None for anything else, which load() checks."""
        model, messages, stream = data.get("model"), data.get("messages"), data.get("stream", False)
        if (not data.keys() <= _CHAT_FAST_KEYS or type(model) is not str or not model
                or type(stream) is not bool or type(messages) is not list or not messages):
            return None
        loaded = []
        for message in messages:
            if type(message) is not dict:
                return None
            role = message.get("role")
            if type(role) is not str or role not in CHAT_ROLES:
                return None
            loaded.append(dict(message))  # INCLUDE: a message's other keys are kept as they are
        return {**data, "messages": loaded}


_CHAT_FAST_KEYS = frozenset({"model", "messages", "stream"})


CHAT_REQUEST_SCHEMA = ChatRequestSchema()
