"""Helpers and shared shapes of the response schemas (errors, SSE)."""

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


def reply(name: str, state: str, **keys: fields.Field) -> type[Out]:
    """The schema class `name` of a write operation's answer: `{"status": state, **keys}`
    (e.g. `{"status": "removed", "model_id": ...}`), one line instead of a class each."""
    return Out.from_dict({"status": status(state), **keys}, name=name)


# -- errors ------------------------------------------------------------------------

class ErrorSchema(Out):
    error = Str(metadata={"description": "What went wrong"})


class OpenAIErrorBody(Out):
    message = Str()
    type = Str(metadata={"example": "invalid_request_error"})
    # Left out when there is no code (the spec: "`code` may be absent").
    code = fields.String(metadata={"example": "model_not_found"})


class OpenAIErrorSchema(Out):
    error = req(fields.Nested(OpenAIErrorBody))


# SSE bodies are text; the event grammar is in each operation's description.
SSE = {"type": "object", "description": "One Server-Sent Event (`event` name and JSON `data`)",
       "properties": {"event": {"type": "string"}, "data": {"type": "string"}, "id": {"type": "string"},
                      "retry": {"type": "integer"}},
       "required": ["data"]}
ANY_JSON: dict = {"description": "Any JSON value"}
