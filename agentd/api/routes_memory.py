"""Per-agent key-value memory."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify, request

from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api.schemas_memory import (EntitySchema, FragmentUpdateSchema, GraphQuerySchema, MemoryPageQuery,
                                       RecallSchema, RelationSchema, RememberSchema)
from agentd.api import body
from agentd.api.principal import principal
from agentd.api.routes_agents import agent
from agentd.api.routes_system import kernel
from agentd.errors import BadRequest, NotFound
from agentd.jsonsafe import NUL_MESSAGE, holds_nul
from agentd.memory.kv import MAX_KEY_LENGTH

bp = Blueprint("memory", __name__)
KEY_PARAM = {"key": {"maxLength": MAX_KEY_LENGTH}}


def _key(key: str) -> str:
    if not key or len(key) > MAX_KEY_LENGTH:
        raise BadRequest(f"key must be 1-{MAX_KEY_LENGTH} characters")
    if holds_nul(key):
        raise BadRequest(f"key {NUL_MESSAGE}")
    return key


@bp.get("/api/memory/agents/<agent_id>/kv")
@doc("Every key and value of the agent's memory", tags="memory",
     response={"type": "object", "additionalProperties": True})
def all_keys(agent_id: str):
    return jsonify(kernel().kv.all(agent(agent_id).id))


@bp.get("/api/memory/agents/<agent_id>/kv/<path:key>")
@doc("One stored value, exactly as stored (any JSON, including null)", tags="memory",
     response=out.ANY_JSON, path_params=KEY_PARAM, errors={404: "No such agent or key"})
def get_key(agent_id: str, key: str):
    found, value = kernel().kv.get(agent(agent_id).id, _key(key))
    if not found:
        raise NotFound(f"key not found: {key}")
    # Any JSON value, including a bare string or null, is returned as stored.
    return Response(current_app.json.dumps(value), mimetype="application/json")


@bp.put("/api/memory/agents/<agent_id>/kv/<path:key>")
@doc("Store any JSON value under a key", tags="memory", body=out.ANY_JSON, response=out.KvOkSchema,
     path_params=KEY_PARAM, body_example={"likes": ["tea"]},
     links={"GetKey": ("memory.get_key", {"agent_id": "$request.path.agent_id", "key": "$request.path.key"}),
            "DeleteKey": ("memory.delete_key", {"agent_id": "$request.path.agent_id",
                                                "key": "$request.path.key"})})
def put_key(agent_id: str, key: str):
    handle = agent(agent_id)
    value = body.json_body()
    kernel().kv.set(handle.id, _key(key), value)
    return jsonify({"status": "ok"})


@bp.delete("/api/memory/agents/<agent_id>/kv/<path:key>")
@doc("Delete a key", tags="memory", response=out.KvDeletedSchema, path_params=KEY_PARAM,
     errors={404: "No such agent or key"})
def delete_key(agent_id: str, key: str):
    if not kernel().kv.delete(agent(agent_id).id, _key(key)):
        raise NotFound(f"key not found: {key}")
    return jsonify({"status": "deleted"})


# -- semantic memory, knowledge graph, consolidation, export/import ---------------------------
_BASE = "/api/memory/agents/<agent_id>"
IMPORT_LIMIT = 64 * 1024 * 1024  # an export carries every vector


def _obj(max_bytes: int = body.JSON_BODY_LIMIT) -> dict:
    data = body.json_body(max_bytes)
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    return data


def _int_arg(name: str, default: int) -> int:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer") from None


@bp.post(f"{_BASE}/memories")
@doc("Remember a fragment (embedded for recall; near-duplicates merge)", tags="memory", body=RememberSchema,
     ok=201, response=out.RememberedSchema, body_example={"content": "The user prefers tea", "scope": "preferences"},
     links={"GetMemory": ("memory.get_memory", {"agent_id": "$request.path.agent_id",
                                                "memory_id": "$response.body#/id"}),
            "DeleteMemory": ("memory.delete_memory", {"agent_id": "$request.path.agent_id",
                                                      "memory_id": "$response.body#/id"}),
            "UpdateMemory": ("memory.update_memory", {"agent_id": "$request.path.agent_id",
                                                      "memory_id": "$response.body#/id"})})
def remember(agent_id: str):
    data = _obj()
    result = kernel().memory.remember(agent(agent_id).id, data.get("content"), data.get("source"),
                                      data.get("scope"), data.get("metadata"), data.get("confidence"))
    return jsonify(result), 201


@bp.get(f"{_BASE}/memories")
@doc("The agent's fragments, newest first", tags="memory", query=MemoryPageQuery,
     response=out.FragmentPageSchema)
def list_memories(agent_id: str):
    handle = agent(agent_id)
    return jsonify(kernel().memory.page(handle.id, _int_arg("limit", 50), _int_arg("offset", 0), principal().label))


@bp.get(f"{_BASE}/memories/<memory_id>")
@doc("One fragment", tags="memory", response=out.FragmentSchema, errors={404: "No such agent or memory"})
def get_memory(agent_id: str, memory_id: str):
    return jsonify(kernel().memory.get(agent(agent_id).id, memory_id, principal().label))


@bp.put(f"{_BASE}/memories/<memory_id>")
@doc("Rewrite one fragment (same id; embedded again; nothing merges)", tags="memory", body=FragmentUpdateSchema,
     response=out.FragmentSchema, body_example={"content": "The user prefers green tea"},
     errors={404: "No such agent or memory"})
def update_memory(agent_id: str, memory_id: str):
    handle = agent(agent_id)
    data = _obj()
    return jsonify(kernel().memory.update(handle.id, memory_id, data.get("content"), data.get("scope"),
                                          data.get("confidence"), principal().label))


@bp.delete(f"{_BASE}/memories/<memory_id>")
@doc("Forget one fragment", tags="memory", response=out.FragmentDeletedSchema,
     errors={404: "No such agent or memory"})
def delete_memory(agent_id: str, memory_id: str):
    kernel().memory.delete(agent(agent_id).id, memory_id, principal().label)
    return jsonify({"status": "deleted", "id": memory_id})


@bp.post(f"{_BASE}/recall")
@doc("Fragments nearest in meaning to a query", tags="memory", body=RecallSchema,
     response=out.RecallResultSchema, body_example={"query": "drinks", "limit": 3})
def recall(agent_id: str):
    handle = agent(agent_id)
    data = _obj()
    found = kernel().memory.recall(handle.id, data.get("query"), data.get("limit"), data.get("min_score"),
                                   data.get("filter"), principal().label)
    return jsonify({"memories": found})


@bp.post(f"{_BASE}/entities")
@doc("Add (or find) a knowledge-graph entity", tags="memory", body=EntitySchema, ok=201,
     response=out.GraphAddedSchema, body_example={"entity_type": "person", "name": "Ada"})
def add_entity(agent_id: str):
    handle = agent(agent_id)
    data = _obj()
    result = kernel().memory.add_entity(handle.id, data.get("entity_type"), data.get("name"), data.get("properties"))
    return jsonify({"id": result["id"]}), 201


@bp.post(f"{_BASE}/relations")
@doc("Add a relation between two entities", tags="memory", body=RelationSchema, ok=201,
     response=out.GraphAddedSchema, body_example={"source": "Ada", "relation": "knows_about", "target": "engines"})
def add_relation(agent_id: str):
    handle = agent(agent_id)
    data = _obj()
    result = kernel().memory.add_relation(handle.id, data.get("source"), data.get("relation"), data.get("target"),
                                          data.get("properties"), data.get("confidence"))
    return jsonify({"id": result["id"]}), 201


@bp.post(f"{_BASE}/graph/query")
@doc("Match a (source, relation, target) pattern up to max_depth hops", tags="memory",
     body=GraphQuerySchema, body_required=False, response=out.GraphMatchesSchema)
def query_graph(agent_id: str):
    handle = agent(agent_id)
    # No body means no pattern; a JSON `null` is not "no body" and fails the object check.
    data = _obj() if body.raw_body(body.JSON_BODY_LIMIT).strip() else {}
    matches = kernel().memory.query_graph(handle.id, data.get("source"), data.get("relation"), data.get("target"),
                                          data.get("max_depth"))
    return jsonify({"matches": matches})


@bp.post(f"{_BASE}/consolidate")
@doc("Merge near-duplicates and decay old, unused fragments now", tags="memory",
     response=out.ConsolidationSchema)
def consolidate(agent_id: str):
    return jsonify(kernel().memory.consolidate(agent(agent_id).id))


@bp.get(f"{_BASE}/export")
@doc("Everything the agent remembers, as one portable JSON document", tags="memory",
     response=out.MemoryExportSchema)
def export(agent_id: str):
    return jsonify(kernel().memory.export(agent(agent_id).id, principal().label))


@bp.post(f"{_BASE}/import")
@doc("Import an export document (fragments from another embedding model are re-embedded)", tags="memory",
     body={"type": "object", "description": "A document from GET .../export"}, response=out.MemoryImportSchema,
     errors={413: "Document over 64 MB"})
def import_memory(agent_id: str):
    handle = agent(agent_id)
    return jsonify(kernel().memory.import_doc(handle.id, body.json_body(IMPORT_LIMIT)))
