"""Responses of the semantic-memory and knowledge-graph routes."""

from __future__ import annotations

from marshmallow import fields

from agentd.api.schemas_out.base import Bool, Int, Num, Out, Str, reply, req


class FragmentSchema(Out):
    id = Str()
    agent_id = Str()
    content = Str()
    metadata = req(fields.Dict())
    source = Str()
    scope = Str()
    confidence = Num()
    created_at = Str()
    accessed_at = Str()
    access_count = Int()


class RememberedSchema(Out):
    id = Str()
    merged = Bool(metadata={"description": "true when it merged into a near-duplicate"})


class FragmentPageSchema(Out):
    memories = req(fields.List(fields.Nested(FragmentSchema)))
    total = Int()


FragmentDeletedSchema = reply("FragmentDeletedSchema", "deleted", id=Str())


class RecallResultSchema(Out):
    memories = req(fields.List(fields.Dict()))


class GraphAddedSchema(Out):
    id = Str()


class GraphMatchesSchema(Out):
    matches = req(fields.List(fields.Dict()))


class ConsolidationSchema(Out):
    memories_merged = Int()
    memories_decayed = Int()
    duration_ms = Int()


class MemoryExportSchema(Out):
    format = Str()
    version = req(fields.Raw())
    agent_id = Str()
    exported_at = Str()
    memories = req(fields.List(fields.Dict()))
    entities = req(fields.List(fields.Dict()))
    relations = req(fields.List(fields.Dict()))


class MemoryImportSchema(Out):
    entities_imported = Int()
    relations_imported = Int()
    memories_imported = Int()
    errors = req(fields.List(fields.Raw()))
