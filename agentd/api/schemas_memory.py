"""JSON Schemas of the semantic-memory and knowledge-graph routes, for the OpenAPI document.

They state what agentd/memory/fields.py checks (the routes validate through it): optional
fields may be null (null means the default), strings must hold a non-blank character.
"""

from __future__ import annotations

from typing import Any

from marshmallow import EXCLUDE, Schema, fields, validate

from agentd.memory.fields import MAX_CONTENT, MAX_DEPTH, MAX_NAME, SOURCES

_BLANKLESS = r"\S"


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _text(limit: int, description: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": limit, "pattern": _BLANKLESS}
    if description:
        out["description"] = description
    return out


_OBJECT = {"type": "object", "propertyNames": {"minLength": 1, "maxLength": MAX_NAME}}
_UNIT = {"type": "number", "minimum": 0, "maximum": 1}
_SOURCE = {"type": "string", "enum": list(SOURCES)}
_KIND = {"anyOf": [_text(64), {"type": "object", "properties": {"custom": _text(64)}, "required": ["custom"],
                                "additionalProperties": False}]}
_TIME = {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "number"}],
         "description": "RFC 3339 time or epoch seconds"}

REMEMBER = {"type": "object", "required": ["content"], "properties": {
    "content": _text(MAX_CONTENT, "the fact"),
    "source": _nullable({**_SOURCE, "description": "default user_provided"}),
    "scope": _nullable(_text(MAX_NAME, "default semantic")),
    "metadata": _nullable(_OBJECT), "confidence": _nullable(_UNIT)}}

FILTER = {"type": "object", "additionalProperties": False, "properties": {
    "source": _nullable(_SOURCE), "scope": _nullable(_text(MAX_NAME)), "min_confidence": _nullable(_UNIT),
    "after": _nullable(_TIME), "before": _nullable(_TIME), "metadata": _nullable(_OBJECT)}}

RECALL = {"type": "object", "required": ["query"], "properties": {
    "query": _text(MAX_CONTENT), "limit": _nullable({"type": "integer", "minimum": 1, "maximum": 100}),
    "min_score": _nullable({"type": "number", "minimum": -1, "maximum": 1}), "filter": _nullable(FILTER)}}

ENTITY = {"type": "object", "required": ["entity_type", "name"], "properties": {
    "entity_type": _KIND, "name": _text(MAX_NAME), "properties": _nullable(_OBJECT)}}

RELATION = {"type": "object", "required": ["source", "relation", "target"], "properties": {
    "source": _text(MAX_NAME, "entity id or name"), "relation": _KIND,
    "target": _text(MAX_NAME, "entity id or name"), "properties": _nullable(_OBJECT),
    "confidence": _nullable(_UNIT)}}

GRAPH_QUERY = {"type": "object", "properties": {
    "source": _nullable(_text(MAX_NAME)), "relation": _nullable(_KIND), "target": _nullable(_text(MAX_NAME)),
    "max_depth": _nullable({"type": "integer", "minimum": 1, "maximum": MAX_DEPTH})}}

_ITEMS = "objects as GET .../export writes them; every field is checked before anything is written"
# Items are described, not schematised field by field: the fuzzer could not generate examples of
# the full nested schema in time, and the route checks every item itself (400 naming the field).
IMPORT = {"type": "object", "required": ["format", "version"], "properties": {
    "format": {"const": "agentd.memory"}, "version": {"const": 1}, "embedding_model": {"type": "string"},
    "memories": {"type": "array", "items": {"type": "object"}, "description": f"fragments: {_ITEMS}"},
    "entities": {"type": "array", "items": {"type": "object"}, "description": f"entities: {_ITEMS}"},
    "relations": {"type": "array", "items": {"type": "object"},
                  "description": f"relations ({_ITEMS}); ends must be entities of the document or the graph"}}}

# -- answers --------------------------------------------------------------------------------
FRAGMENT = {"type": "object", "required": ["id", "agent_id", "content", "metadata", "source", "scope", "confidence",
                                           "created_at", "accessed_at", "access_count"],
            "properties": {"id": {"type": "string"}, "agent_id": {"type": "string"}, "content": {"type": "string"},
                           "metadata": {"type": "object"}, "source": _SOURCE, "scope": {"type": "string"},
                           "confidence": {"type": "number"}, "created_at": {"type": "string"},
                           "accessed_at": {"type": "string"}, "access_count": {"type": "integer"},
                           "score": {"type": "number"}}}
REMEMBERED = {"type": "object", "required": ["id", "merged"],
              "properties": {"id": {"type": "string"}, "merged": {"type": "boolean"}}}
PAGE = {"type": "object", "required": ["memories", "total"],
        "properties": {"memories": {"type": "array", "items": FRAGMENT}, "total": {"type": "integer"}}}
RECALLED = {"type": "object", "required": ["memories"],
            "properties": {"memories": {"type": "array", "items": FRAGMENT}}}
DELETED = {"type": "object", "required": ["status"],
           "properties": {"status": {"const": "deleted"}, "id": {"type": "string"}}}
CREATED = {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}
_ENTITY_OUT = {"type": "object", "required": ["id", "entity_type", "name", "properties"],
               "properties": {"id": {"type": "string"}, "entity_type": {"type": "string"},
                              "name": {"type": "string"}, "properties": {"type": "object"},
                              "created_at": {"type": "string"}, "updated_at": {"type": "string"}}}
_RELATION_OUT = {"type": "object", "required": ["id", "source", "relation", "target"],
                 "properties": {"id": {"type": "string"}, "source": {"type": "string"},
                                "relation": {"type": "string"}, "target": {"type": "string"},
                                "properties": {"type": "object"}, "confidence": {"type": "number"},
                                "created_at": {"type": "string"}}}
MATCHES = {"type": "object", "required": ["matches"], "properties": {"matches": {"type": "array", "items": {
    "type": "object", "required": ["source", "relation", "target"],
    "properties": {"source": _ENTITY_OUT, "relation": _RELATION_OUT, "target": _ENTITY_OUT,
                   "depth": {"type": "integer"}}}}}}
CONSOLIDATION = {"type": "object", "required": ["memories_merged", "memories_decayed", "duration_ms"],
                 "properties": {k: {"type": "integer"} for k in
                                ("memories_merged", "memories_decayed", "memories_dropped", "duration_ms")}}
EXPORT = {"type": "object", "required": ["format", "version", "embedding_model", "memories", "entities", "relations"],
          "properties": {"format": {"const": "agentd.memory"}, "version": {"const": 1},
                         "embedding_model": {"type": "string"}, "memories": {"type": "array"},
                         "entities": {"type": "array"}, "relations": {"type": "array"}}}
IMPORTED = {"type": "object",
            "required": ["memories_imported", "entities_imported", "relations_imported", "errors"],
            "properties": {"memories_imported": {"type": "integer"}, "entities_imported": {"type": "integer"},
                           "relations_imported": {"type": "integer"}, "memories_reembedded": {"type": "integer"},
                           "errors": {"type": "array", "items": {"type": "string"}}}}


class MemoryPageQuery(Schema):
    """`?limit=&offset=` of the fragment list."""

    class Meta:
        unknown = EXCLUDE

    limit = fields.Integer(validate=validate.Range(min=1, max=1000), metadata={"description": "default 50"})
    offset = fields.Integer(validate=validate.Range(min=0, max=2**31), metadata={"description": "default 0"})
