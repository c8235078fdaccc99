"""Per-agent key-value memory."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify, request

from agentd.api import body
from agentd.api.routes_agents import agent
from agentd.api.routes_system import kernel
from agentd.errors import BadRequest, NotFound
from agentd.memory.kv import MAX_KEY_LENGTH

bp = Blueprint("memory", __name__)


def _key(key: str) -> str:
    if not key or len(key) > MAX_KEY_LENGTH:
        raise BadRequest(f"key must be 1-{MAX_KEY_LENGTH} characters")
    return key


@bp.get("/api/memory/agents/<agent_id>/kv")
def all_keys(agent_id: str):
    return jsonify(kernel().kv.all(agent(agent_id).id))


@bp.get("/api/memory/agents/<agent_id>/kv/<path:key>")
def get_key(agent_id: str, key: str):
    found, value = kernel().kv.get(agent(agent_id).id, _key(key))
    if not found:
        raise NotFound(f"key not found: {key}")
    # Any JSON value, including a bare string or null, is returned as stored.
    return Response(current_app.json.dumps(value), mimetype="application/json")


@bp.put("/api/memory/agents/<agent_id>/kv/<path:key>")
def put_key(agent_id: str, key: str):
    handle = agent(agent_id)
    value = body.json_body()
    kernel().kv.set(handle.id, _key(key), value)
    return jsonify({"status": "ok"})


@bp.delete("/api/memory/agents/<agent_id>/kv/<path:key>")
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
def remember(agent_id: str):
    data = _obj()
    result = kernel().memory.remember(agent(agent_id).id, data.get("content"), data.get("source"),
                                      data.get("scope"), data.get("metadata"), data.get("confidence"))
    return jsonify(result), 201


@bp.get(f"{_BASE}/memories")
def list_memories(agent_id: str):
    handle = agent(agent_id)
    return jsonify(kernel().memory.page(handle.id, _int_arg("limit", 50), _int_arg("offset", 0)))


@bp.get(f"{_BASE}/memories/<memory_id>")
def get_memory(agent_id: str, memory_id: str):
    return jsonify(kernel().memory.get(agent(agent_id).id, memory_id))


@bp.delete(f"{_BASE}/memories/<memory_id>")
def delete_memory(agent_id: str, memory_id: str):
    kernel().memory.delete(agent(agent_id).id, memory_id)
    return jsonify({"status": "deleted", "id": memory_id})


@bp.post(f"{_BASE}/recall")
def recall(agent_id: str):
    handle = agent(agent_id)
    data = _obj()
    found = kernel().memory.recall(handle.id, data.get("query"), data.get("limit"), data.get("min_score"),
                                   data.get("filter"))
    return jsonify({"memories": found})


@bp.post(f"{_BASE}/entities")
def add_entity(agent_id: str):
    handle = agent(agent_id)
    data = _obj()
    result = kernel().memory.add_entity(handle.id, data.get("entity_type"), data.get("name"), data.get("properties"))
    return jsonify({"id": result["id"]}), 201


@bp.post(f"{_BASE}/relations")
def add_relation(agent_id: str):
    handle = agent(agent_id)
    data = _obj()
    result = kernel().memory.add_relation(handle.id, data.get("source"), data.get("relation"), data.get("target"),
                                          data.get("properties"), data.get("confidence"))
    return jsonify({"id": result["id"]}), 201


@bp.post(f"{_BASE}/graph/query")
def query_graph(agent_id: str):
    handle = agent(agent_id)
    data = body.json_body(allow_empty=True) or {}
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    matches = kernel().memory.query_graph(handle.id, data.get("source"), data.get("relation"), data.get("target"),
                                          data.get("max_depth"))
    return jsonify({"matches": matches})


@bp.post(f"{_BASE}/consolidate")
def consolidate(agent_id: str):
    return jsonify(kernel().memory.consolidate(agent(agent_id).id))


@bp.get(f"{_BASE}/export")
def export(agent_id: str):
    return jsonify(kernel().memory.export(agent(agent_id).id))


@bp.post(f"{_BASE}/import")
def import_memory(agent_id: str):
    handle = agent(agent_id)
    return jsonify(kernel().memory.import_doc(handle.id, body.json_body(IMPORT_LIMIT)))
