"""The API described: GET /api/openapi.json and the server-rendered page at /api."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Flask, current_app, jsonify, render_template

from agentd import __version__
from agentd.api.apidoc import doc

bp = Blueprint("docs", __name__)

def cached_document(app: Flask) -> dict[str, Any]:
    """The app's OpenAPI document; apispec is imported on the first request for it, not at start."""
    from agentd.api.openapi import cached_document as build

    return build(app)


_METHOD_ORDER = {"get": 0, "post": 1, "put": 2, "patch": 3, "delete": 4}


@bp.get("/api/openapi.json")
@doc("This OpenAPI 3.1 document", tags="system", public=True,
     response={"type": "object", "required": ["openapi", "info", "paths"],
               "properties": {"openapi": {"type": "string"}, "info": {"type": "object"},
                              "paths": {"type": "object"}}})
def openapi_json():
    return jsonify(cached_document(current_app))


@bp.get("/api")
def api_page():
    """Every route of the document, grouped by tag, with a link to the JSON."""
    document = cached_document(current_app)
    groups: dict[str, list[dict[str, str]]] = {}
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            groups.setdefault(op["tags"][0], []).append({
                "method": method.upper(), "path": path, "summary": op.get("summary", ""),
                "statuses": ", ".join(op["responses"]), "order": f"{path} {_METHOD_ORDER.get(method, 9)}"})
    for routes in groups.values():
        routes.sort(key=lambda r: r["order"])
    response = current_app.make_response(render_template(
        "api.html", groups=sorted(groups.items()), version=__version__, title=document["info"]["title"]))
    response.headers["Content-Security-Policy"] = "default-src 'self'; frame-ancestors 'none'"
    return response

