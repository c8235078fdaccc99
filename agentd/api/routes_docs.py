"""The API described: GET /api/openapi.json (the page at /api is the dashboard's: pages/apidoc.py)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Flask, current_app, jsonify

from agentd.api.apidoc import doc

bp = Blueprint("docs", __name__)

def cached_document(app: Flask) -> dict[str, Any]:
    """The app's OpenAPI document; apispec is imported on the first request for it, not at start."""
    from agentd.api.openapi import cached_document as build

    return build(app)


@bp.get("/api/openapi.json")
@doc("This OpenAPI 3.1 document", tags="system", public=True,
     response={"type": "object", "required": ["openapi", "info", "paths"],
               "properties": {"openapi": {"type": "string"}, "info": {"type": "object"},
                              "paths": {"type": "object"}}})
def openapi_json():
    return jsonify(cached_document(current_app))
