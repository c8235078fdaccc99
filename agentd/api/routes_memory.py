"""Per-agent key-value memory."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api import body
from agentd.api.routes_agents import agent
from agentd.api.routes_system import kernel
from agentd.errors import BadRequest, NotFound
from agentd.memory.kv import MAX_KEY_LENGTH

bp = Blueprint("memory", __name__)
KEY_PARAM = {"key": {"maxLength": MAX_KEY_LENGTH}}


def _key(key: str) -> str:
    if not key or len(key) > MAX_KEY_LENGTH:
        raise BadRequest(f"key must be 1-{MAX_KEY_LENGTH} characters")
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
