"""Response bodies of the OpenAI Responses and embeddings routes."""

from __future__ import annotations

from marshmallow import fields

from agentd.api.schemas_out.base import Int, NullStr, Out, Str, req
from agentd.api.schemas_out.base import status as one_of


class OutputTextSchema(Out):
    type = one_of("output_text")
    text = Str()
    annotations = req(fields.List(fields.Dict()))


class OutputMessageSchema(Out):
    type = one_of("message")
    id = Str()
    status = one_of("in_progress", "completed", "incomplete")
    role = one_of("assistant")
    content = req(fields.List(fields.Nested(OutputTextSchema)))


class ResponseUsageSchema(Out):
    input_tokens = Int()
    output_tokens = Int()
    total_tokens = Int()
    input_tokens_details = req(fields.Dict())
    output_tokens_details = req(fields.Dict())


class ResponseErrorSchema(Out):
    code = Str()
    message = Str()


class ResponseObjectSchema(Out):
    id = Str(metadata={"example": "resp_0d4c..."})
    object = one_of("response")
    created_at = Int()
    status = one_of("completed", "incomplete", "failed", "in_progress")
    error = req(fields.Nested(ResponseErrorSchema, allow_none=True))
    incomplete_details = req(fields.Dict(allow_none=True))
    model = Str()
    output = req(fields.List(fields.Nested(OutputMessageSchema)))
    previous_response_id = NullStr()
    store = req(fields.Boolean())
    usage = req(fields.Nested(ResponseUsageSchema, allow_none=True))
    parallel_tool_calls = req(fields.Boolean())
    tool_choice = Str()
    tools = req(fields.List(fields.Dict()))


class ResponseDeletedSchema(Out):
    id = Str(metadata={"example": "resp_0d4c..."})
    object = one_of("response.deleted")
    deleted = req(fields.Boolean())


class EmbeddingItemSchema(Out):
    object = one_of("embedding")
    index = Int()
    embedding = req(fields.Raw(metadata={
        "description": "Floats, or base64 of little-endian float32 (`encoding_format: base64`)",
        "anyOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]}))


class EmbeddingUsageSchema(Out):
    prompt_tokens = Int()
    total_tokens = Int()


class EmbeddingListSchema(Out):
    object = one_of("list")
    data = req(fields.List(fields.Nested(EmbeddingItemSchema)))
    model = Str()
    usage = req(fields.Nested(EmbeddingUsageSchema))
