"""The dashboard's API page (`GET /api`): every route of the OpenAPI document, grouped by tag.

A dashboard page like the others (layout, navigation, login gate, proxy prefix); the
document itself, `GET /api/openapi.json`, stays public.
"""

from __future__ import annotations

from flask import current_app, render_template

from agentd import __version__
from agentd.api.pages import CSP, bp
from agentd.api.routes_docs import cached_document

_METHOD_ORDER = {"get": 0, "post": 1, "put": 2, "patch": 3, "delete": 4}


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
    # /api is an API path to the after-request hooks, so the page sets the dashboard's CSP itself.
    response.headers["Content-Security-Policy"] = CSP
    return response
