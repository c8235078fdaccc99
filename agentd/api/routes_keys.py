"""Scoped API keys: create (the secret shown once), list, read, change, rotate, delete.

Only the admin key manages keys, and only a daemon with an admin key has any (409 otherwise).
"""

from __future__ import annotations

from flask import Blueprint, jsonify

from agentd.api import body
from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api.principal import principal
from agentd.api.routes_system import kernel
from agentd.api.schemas_keys import KeyCreateSchema, KeyUpdateSchema

bp = Blueprint("keys", __name__)

_CREATE, _UPDATE = KeyCreateSchema(), KeyUpdateSchema()
_NO_ADMIN = "The daemon has no admin `api_key`: scoped keys need one"


@bp.get("/api/keys")
@doc("List scoped API keys (never their secrets)", tags="keys",
     response={"type": "array", "items": out.ApiKeySchema})
def list_keys():
    return jsonify(kernel().keys.list())


@bp.post("/api/keys")
@doc("Create a scoped API key", tags="keys", body=KeyCreateSchema, ok=201, response=out.ApiKeyCreatedSchema,
     body_example={"name": "support-bot", "scopes": ["message"], "agents": ["support-*"],
                   "budget_usd_per_day": 5.0, "rate_limit_per_minute": 60},
     description="The answer's `key` is the secret: it is shown this once and only its salted hash is kept.",
     errors={409: f"{_NO_ADMIN}, or a key with this name exists"},
     links={"GetKey": ("keys.get_key", {"key_id": "$response.body#/id"}),
            "RotateKey": ("keys.rotate_key", {"key_id": "$response.body#/id"}),
            "UpdateKey": ("keys.update_key", {"key_id": "$response.body#/id"}),
            "DeleteKey": ("keys.delete_key", {"key_id": "$response.body#/id"})})
def create_key():
    data = body.load(_CREATE)
    return jsonify(kernel().keys.create(data, principal())), 201


@bp.get("/api/keys/<key_id>")
@doc("A scoped API key (by id or name) with its spend", tags="keys", response=out.ApiKeySchema)
def get_key(key_id: str):
    return jsonify(kernel().keys.get(key_id))


@bp.patch("/api/keys/<key_id>")
@doc("Change a scoped API key's settings", tags="keys", body=KeyUpdateSchema, response=out.ApiKeySchema,
     body_example={"enabled": False}, errors={409: "Another key has this name"})
def update_key(key_id: str):
    data = body.load(_UPDATE)
    return jsonify(kernel().keys.update(key_id, data, principal()))


@bp.delete("/api/keys/<key_id>")
@doc("Delete a scoped API key (its usage rows stay)", tags="keys", response=out.KeyDeletedSchema)
def delete_key(key_id: str):
    return jsonify(kernel().keys.delete(key_id, principal()))


@bp.post("/api/keys/<key_id>/rotate")
@doc("Give a key a new secret, keeping its settings", tags="keys", response=out.ApiKeyCreatedSchema,
     description="The old secret stops working at once; the answer's `key` is the new one, shown once.")
def rotate_key(key_id: str):
    return jsonify(kernel().keys.rotate(key_id, principal()))
