"""marshmallow schemas of the OpenAI Responses and embeddings request bodies.

Unknown fields are accepted and ignored, as on /v1/chat/completions: OpenAI clients send
many. What would change the answer and cannot be honoured is refused (the schema states the
values allowed, the route says why).
"""

from __future__ import annotations

from typing import Any

from marshmallow import INCLUDE, Schema, ValidationError, fields, validate, validates_schema

from agentd.schema_fields import StrictBoolean, StrictFloat

MAX_EMBEDDING_INPUTS = 2048


class TextFormatSchema(Schema):
    """`text.format`: `{type: text}`, `{type: json_object}` or `{type: json_schema, name, schema, strict}`."""

    class Meta:
        unknown = INCLUDE

    type = fields.String(required=True, validate=validate.OneOf(("text", "json_object", "json_schema")))
    name = fields.String(metadata={"description": "The schema's name (json_schema)"})
    schema = fields.Dict(metadata={"description": "The JSON Schema the answer follows (json_schema)"})
    strict = StrictBoolean(allow_none=True)
    description = fields.String(allow_none=True)

    @validates_schema
    def _json_schema_complete(self, data: dict[str, Any], **_: Any) -> None:
        # What a provider needs of a json_schema format, refused here with a 400 rather than
        # coming back as the provider's failure.
        if data.get("type") == "json_schema":
            for name in ("name", "schema"):
                if not data.get(name):
                    raise ValidationError("required with type json_schema", field_name=name)


class TextConfigSchema(Schema):
    class Meta:
        unknown = INCLUDE

    format = fields.Nested(TextFormatSchema, allow_none=True)


class ResponseInputField(fields.Field):
    """`input`: a string or a non-empty array of objects (the route reads the items)."""

    def _deserialize(self, value, attr, data, **kwargs):  # type: ignore[override]
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            return value
        raise ValidationError("must be a string or a non-empty array of input items")


class ResponsesRequestSchema(Schema):
    """POST /v1/responses."""

    class Meta:
        unknown = INCLUDE

    # An empty `model` names no agent: the route answers it 404 `model_not_found`, as the spec does.
    model = fields.String(required=True, metadata={
        "description": "The agent: `agentd:<name>`, its id, or its name"})
    input = ResponseInputField(required=True, metadata={
        "description": "A string, or an array of message items `{role, content}` (`type: message` "
                       "optional) whose content is a string or `input_text` / `input_image` parts",
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}, "minItems": 1}]})
    instructions = fields.String(allow_none=True, metadata={
        "description": "Extra instructions for this run (added to the agent's system prompt)"})
    previous_response_id = fields.String(allow_none=True, metadata={
        "description": "A stored response of the same agent: this turn continues its session"})
    store = StrictBoolean(allow_none=True, metadata={
        "description": "Keep the response for GET /v1/responses/{id} (default true)"})
    stream = StrictBoolean(allow_none=True)
    max_output_tokens = fields.Integer(strict=True, allow_none=True, validate=validate.Range(1, 1_000_000))
    temperature = StrictFloat(allow_none=True, validate=validate.Range(0.0, 2.0))
    top_p = StrictFloat(allow_none=True, validate=validate.Range(0.0, 1.0))
    text = fields.Nested(TextConfigSchema, allow_none=True)
    user = fields.String(allow_none=True, metadata={"description": "End-user id, passed on where supported"})
    metadata = fields.Dict(keys=fields.String(), values=fields.String(), allow_none=True, metadata={
        "description": "Echoed in the response"})
    # Accepted only with the values that change nothing (the route refuses others by name).
    tools = fields.List(fields.Dict(), allow_none=True, validate=validate.Length(max=0), metadata={
        "description": "Refused when non-empty: agents own their tools"})
    tool_choice = fields.String(allow_none=True, validate=validate.OneOf(("none", "auto")))
    background = StrictBoolean(allow_none=True, validate=validate.OneOf([False]), metadata={
        "description": "Only false: a response is answered on its request"})


class EmbeddingInputField(fields.Field):
    """`input`: a string or an array of strings (1-2048, none empty); loads as a list."""

    def _deserialize(self, value, attr, data, **kwargs):  # type: ignore[override]
        texts = [value] if isinstance(value, str) else value
        if isinstance(texts, list) and texts and any(isinstance(t, (int, list)) for t in texts):
            raise ValidationError("token arrays are not supported; send the text as a string "
                                  "or an array of strings")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValidationError("must be a string or an array of strings")
        if not 1 <= len(texts) <= MAX_EMBEDDING_INPUTS:
            raise ValidationError(f"must hold 1 to {MAX_EMBEDDING_INPUTS} strings")
        if not all(texts):
            raise ValidationError("must not contain empty strings")
        return texts


class EmbeddingsRequestSchema(Schema):
    """POST /v1/embeddings."""

    class Meta:
        unknown = INCLUDE

    model = fields.String(required=True, validate=validate.Length(min=1), metadata={
        "description": "The local model's id (`all-MiniLM-L6-v2-onnx-int8`), or the configured "
                       "`[memory] embedding_model` when an embedding provider is set"})
    input = EmbeddingInputField(required=True, metadata={"anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1,
         "maxItems": MAX_EMBEDDING_INPUTS}]})
    encoding_format = fields.String(allow_none=True, validate=validate.OneOf(("float", "base64")))
    dimensions = fields.Integer(strict=True, allow_none=True, validate=validate.Range(min=1), metadata={
        "description": "Must equal the model's own dimensions (no shortening)"})
    user = fields.String(allow_none=True)


RESPONSES_REQUEST_SCHEMA = ResponsesRequestSchema()
EMBEDDINGS_REQUEST_SCHEMA = EmbeddingsRequestSchema()


def as_chat_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` in /v1/chat/completions' `response_format` terms (None for plain text)."""
    if not fmt or fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
    return {"type": "json_schema", "json_schema": spec}
