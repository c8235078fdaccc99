"""marshmallow schemas of the semantic-memory and knowledge-graph request bodies.

They document what agentd/memory/fields.py accepts (the memory service validates, so the
agent tools and the routes share one set of checks); tests/api/test_fuzz_api.py holds the two
to each other (negative and positive data checks).
"""

from __future__ import annotations

from marshmallow import EXCLUDE, Schema, fields, validate

from agentd.api.schemas import NOT_BLANK
from agentd.schema_fields import StrictFloat

SOURCES = ("conversation", "document", "observation", "inference", "user_provided", "system")
# Keys of metadata/properties objects: 1-256 characters.
KEYS = {"json_schema": {"propertyNames": {"minLength": 1, "maxLength": 256}}}


def _text(limit: int, **kw) -> fields.String:  # type: ignore[no-untyped-def]
    return fields.String(validate=[validate.Length(max=limit), validate.Regexp(NOT_BLANK)], **kw)


def _kind(**kw) -> fields.Raw:  # type: ignore[no-untyped-def]
    """An entity or relation type: a name, or `{"custom": name}` (null: not given, when optional)."""
    shapes: list[dict] = [
        {"type": "string", "maxLength": 64, "pattern": NOT_BLANK},
        {"type": "object", "required": ["custom"], "additionalProperties": False,
         "properties": {"custom": {"type": "string", "maxLength": 64, "pattern": NOT_BLANK}}}]
    if kw.get("allow_none"):
        shapes.append({"type": "null"})
    return fields.Raw(metadata={"anyOf": shapes, **kw.pop("metadata", {})}, **kw)


class _Loose(Schema):
    class Meta:
        unknown = EXCLUDE  # the routes ignore fields they do not know


class RememberSchema(_Loose):
    content = _text(32_000, required=True)
    source = fields.String(allow_none=True, validate=validate.OneOf(SOURCES))
    scope = _text(256, allow_none=True, metadata={"description": "episodic, semantic, procedural, ..."})
    metadata = fields.Dict(allow_none=True, metadata=KEYS)
    confidence = StrictFloat(allow_none=True, validate=validate.Range(0, 1))


class FragmentUpdateSchema(_Loose):
    content = _text(32_000, required=True)
    scope = _text(256, allow_none=True, metadata={"description": "kept when not given"})
    confidence = StrictFloat(allow_none=True, validate=validate.Range(0, 1))


class MemoryFilterSchema(Schema):
    source = fields.String(allow_none=True, validate=validate.OneOf(SOURCES))
    scope = _text(256, allow_none=True)
    min_confidence = StrictFloat(allow_none=True, validate=validate.Range(0, 1))
    after = fields.Raw(allow_none=True, metadata={"description": "ISO 8601 time or epoch seconds",
                                                  "type": ["string", "number"]})
    before = fields.Raw(allow_none=True, metadata={"description": "ISO 8601 time or epoch seconds",
                                                   "type": ["string", "number"]})
    metadata = fields.Dict(allow_none=True, metadata=KEYS)


class RecallSchema(_Loose):
    query = _text(32_000, required=True)
    limit = fields.Integer(strict=True, allow_none=True, validate=validate.Range(1, 100))
    min_score = StrictFloat(allow_none=True, validate=validate.Range(-1, 1))
    filter = fields.Nested(MemoryFilterSchema, allow_none=True)


class EntitySchema(_Loose):
    entity_type = _kind(required=True, metadata={"description": "person, organization, ... or custom"})
    name = _text(256, required=True)
    properties = fields.Dict(allow_none=True, metadata=KEYS)


class RelationSchema(_Loose):
    source = _text(256, required=True, metadata={"description": "Entity id or name"})
    relation = _kind(required=True, metadata={"description": "works_at, depends_on, ... or custom"})
    target = _text(256, required=True)
    properties = fields.Dict(allow_none=True, metadata=KEYS)
    confidence = StrictFloat(allow_none=True, validate=validate.Range(0, 1))


class GraphQuerySchema(_Loose):
    source = _text(256, allow_none=True)
    relation = _kind(allow_none=True)
    target = _text(256, allow_none=True)
    max_depth = fields.Integer(strict=True, allow_none=True, validate=validate.Range(min=1), metadata={
        "description": "Hops to follow (default 1); a larger value than 16 walks 16 hops"})


class MemoryPageQuery(Schema):
    class Meta:
        unknown = EXCLUDE

    limit = fields.Integer(validate=validate.Range(1, 1000), metadata={"description": "default 50"})
    offset = fields.Integer(validate=validate.Range(0, 2**31), metadata={"description": "default 0"})
