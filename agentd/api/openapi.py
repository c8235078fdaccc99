"""The OpenAPI 3.1 document of the whole API, built from the running app.

Paths and methods come from `app.url_map` (so the document lists exactly what
is routed), each view's `Operation` (agentd/api/apidoc.py) supplies the rest,
and apispec's marshmallow plugin turns the schemas that validate requests into
JSON Schema. The document is built once per app and cached.
"""

from __future__ import annotations

import re
from typing import Any

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from flask import Flask
from werkzeug.routing import Rule

from agentd import __version__
from agentd.api.apidoc import Operation, is_api_path, operation_of
from agentd.api import schemas_out as out

OPENAPI_VERSION = "3.1.0"

DESCRIPTION = """\
agentd hosts autonomous LLM agents: a native JSON API under `/api/`, an OpenAI-compatible
API under `/v1/`, Server-Sent Events (`text/event-stream` responses) and a WebSocket
(`GET /api/agents/{agent_id}/ws`, described in its operation).

Errors are JSON: `{"error": "<message>"}` under `/api/`, `{"error": {"message", "type", "code"}}`
under `/v1/`. With an API key configured every route except the public ones needs
`Authorization: Bearer <key>` (or `X-API-Key`); without one only loopback clients are served.
Every response carries `X-Request-Id` and the `X-RateLimit-*` headers."""

# What every route may answer besides its own statuses, and when.
COMMON_ERRORS = {
    400: "Invalid request: malformed JSON, wrong types or values, JSON nested deeper than 64 "
         "levels, or a `Host` header that is not allowed",
    401: "API key required or invalid",
    403: "Cross-site request refused (state-changing requests from foreign origins)",
    404: "The resource in the path does not exist",
    413: "Request body too large",
    415: "Content-Type is not application/json",
    429: "Rate limit exceeded (per client IP); honour `Retry-After`",
    503: "The database cannot be reached just now (restarting, unreachable); retry after `Retry-After`",
    507: "Insufficient storage: the disk holding the database is full; retry after `Retry-After` "
         "once space is freed",
}
# (No route plans an unexpected failure: a 500 is listed only where a route answers one on
# purpose, e.g. an agent run that failed.)

# Path parameters the server parses as UUIDs (anything else is a 400).
UUID_PARAMS = {"agent_id", "session_id", "workflow_id", "run_id", "trigger_id", "task_id"}
PARAM_TEXT = {
    "agent_id": "Agent id (UUID)",
    "session_id": "Session id (UUID)",
    "workflow_id": "Workflow id (UUID)",
    "run_id": "Workflow run id (UUID)",
    "trigger_id": "Trigger id (UUID)",
    "task_id": "Task id (UUID)",
    "approval_id": "Approval id",
    "model_id": "Model id or alias",
    "name": "Provider id",
    "key": "Memory key",
}

_RULE_PARAM = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


def openapi_path(rule: str) -> str:
    """`/api/agents/<agent_id>/kv/<path:key>` -> `/api/agents/{agent_id}/kv/{key}`."""
    return _RULE_PARAM.sub(r"{\1}", rule)


def _headers() -> dict[str, dict[str, Any]]:
    integer = {"type": "integer", "minimum": 0}
    return {
        "RequestId": {"description": "Id of this request (also in the daemon's log)",
                      "schema": {"type": "string"}, "required": True},
        "RateLimitLimit": {"description": "Requests allowed at once (burst)", "schema": integer},
        "RateLimitRemaining": {"description": "Requests left in the bucket", "schema": integer},
        "RateLimitReset": {"description": "Seconds until the bucket is full", "schema": integer},
        "RetryAfter": {"description": "Seconds to wait before retrying", "schema": integer},
        "ShouldRetry": {"description": "`false`: retrying cannot succeed (the official OpenAI SDKs "
                                       "honour it)", "schema": {"type": "string", "enum": ["true", "false"]}},
        "DroppedParams": {"description": "Comma-separated request parameters the agent's provider has no "
                                         "equivalent for; they were dropped, not refused",
                          "schema": {"type": "string"}},
    }


def _error_response(path: str, text: str, status: int) -> dict[str, Any]:
    name = "OpenAIError" if path.startswith("/v1/") else "Error"
    headers: dict[str, Any] = {"X-Request-Id": {"$ref": "#/components/headers/RequestId"}}
    if status in (429, 503, 507):
        headers["Retry-After"] = {"$ref": "#/components/headers/RetryAfter"}
    if path.startswith("/v1/"):
        headers["x-should-retry"] = {"$ref": "#/components/headers/ShouldRetry"}
    return {"description": text, "headers": headers,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}


def _ok_response(op: Operation) -> dict[str, Any]:
    headers: dict[str, Any] = {"X-Request-Id": {"$ref": "#/components/headers/RequestId"},
                               "X-RateLimit-Limit": {"$ref": "#/components/headers/RateLimitLimit"},
                               "X-RateLimit-Remaining": {"$ref": "#/components/headers/RateLimitRemaining"},
                               "X-RateLimit-Reset": {"$ref": "#/components/headers/RateLimitReset"}}
    for name in op.ok_headers:
        headers[name] = {"$ref": f"#/components/headers/{_HEADER_REFS[name]}"}
    response: dict[str, Any] = {"description": op.ok_description or op.summary, "headers": headers}
    if op.websocket:
        return {"description": op.ok_description or "Switching Protocols: the WebSocket is open"}
    if op.response is not None:
        response["content"] = {op.response_media: {"schema": op.response}}
        if op.sse_alt:
            event = op.sse_alt if isinstance(op.sse_alt, dict) else out.SSE
            response["content"]["text/event-stream"] = {"schema": event}
    return response


_HEADER_REFS = {"x-agentd-dropped-params": "DroppedParams", "Retry-After": "RetryAfter",
                "x-should-retry": "ShouldRetry"}


def _parameters(rule: Rule, op: Operation) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = []
    for name in _RULE_PARAM.findall(rule.rule):
        schema: dict[str, Any] = {"type": "string", "minLength": 1}
        if name in UUID_PARAMS:
            schema = {"type": "string", "format": "uuid"}
        schema.update(op.path_params.get(name, {}))
        params.append({"name": name, "in": "path", "required": True,
                       "description": PARAM_TEXT.get(name, name), "schema": schema})
    if op.query is not None:
        params.append({"in": "query", "schema": op.query})
    return params


def _operation(rule: Rule, method: str, op: Operation) -> dict[str, Any]:
    path = openapi_path(rule.rule)
    result: dict[str, Any] = {"operationId": rule.endpoint, "summary": op.summary,
                              "tags": list(op.tags) or [path.split("/")[2] if path.startswith("/api/") else "openai"]}
    if op.description:
        result["description"] = op.description
    params = _parameters(rule, op)
    if params:
        result["parameters"] = params
    if op.public:
        result["security"] = []
    if op.body is not None:
        media: dict[str, Any] = {"schema": op.body}
        if op.body_example is not None:
            media["example"] = op.body_example
        result["requestBody"] = {"required": op.body_required, "content": {op.body_media: media}}
    responses: dict[str, Any] = {str(op.ok): _ok_response(op)}
    if op.links:
        links: dict[str, Any] = {}
        for name, (target, mapping, *body) in op.links.items():
            links[name] = {"operationId": target, "parameters": mapping}
            if body:
                links[name]["requestBody"] = body[0]
        responses[str(op.ok)]["links"] = links
    common = {400, 429, 503}
    if not op.public:
        common.add(401)
    if method != "GET":
        common |= {403, 507}
    if "<" in rule.rule:
        common.add(404)
    if op.body is not None:
        common.add(413)
        if op.body_media == "application/json" and op.checks_media:
            common.add(415)
    for status in sorted(common | set(op.errors)):
        own, shared = op.errors.get(status), COMMON_ERRORS.get(status)
        text = f"{own}. Also: {shared}" if own and shared else own or shared or "error"
        responses[str(status)] = _error_response(path, text, status)
    for status, (text, schema) in sorted(op.replies.items()):
        responses[str(status)] = _reply(responses.get(str(status)), text, schema)
    result["responses"] = responses
    return result


def _reply(common: dict[str, Any] | None, text: str, schema: Any) -> dict[str, Any]:
    """One of an operation's own answers; where the daemon answers the same status with its
    own error (a refused Host is a 400 everywhere), the body is either shape."""
    response: dict[str, Any] = {"description": text,
                                "headers": {"X-Request-Id": {"$ref": "#/components/headers/RequestId"}}}
    if common is not None:
        response = {**common, "description": f"{text}. Also: {common['description']}"}
    if schema is not None:
        if common is not None and "content" in common:
            schema = {"oneOf": [common["content"]["application/json"]["schema"], schema]}
        response["content"] = {"application/json": {"schema": schema}}
    return response


def _extra_json_schema(converter: Any, field: Any, ret: dict[str, Any], **_: Any) -> dict[str, Any]:
    """JSON Schema keywords apispec does not pass through (e.g. `propertyNames`), given as
    `metadata={"json_schema": {...}}` on a marshmallow field."""
    return dict(field.metadata.get("json_schema", {}))


def build_document(app: Flask) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every documented API route of `app`."""
    plugin = MarshmallowPlugin()
    spec = APISpec(title="agentd", version=__version__, openapi_version=OPENAPI_VERSION,
                   plugins=[plugin],
                   info={"description": DESCRIPTION,
                         "license": {"name": "MIT", "identifier": "MIT"}})
    plugin.converter.add_attribute_function(_extra_json_schema)  # type: ignore[union-attr]
    spec.components.schema("Error", schema=out.ErrorSchema)
    spec.components.schema("OpenAIError", schema=out.OpenAIErrorSchema)
    for name, schema in out.JSONRPC_COMPONENTS.items():
        spec.components.schema(name, schema)
    spec.components.security_scheme("bearer", {"type": "http", "scheme": "bearer",
                                               "description": "The daemon's `api_key`"})
    for name, header in _headers().items():
        spec.components.header(name, header)
    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        if not is_api_path(rule.rule):
            continue
        op = operation_of(app.view_functions[rule.endpoint])
        if op is None:
            continue  # tests/api/test_openapi.py fails on undocumented routes
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            paths.setdefault(openapi_path(rule.rule), {})[method.lower()] = _operation(rule, method, op)
    for path, operations in paths.items():
        spec.path(path=path, operations=operations)
    document = spec.to_dict()
    document["security"] = [{"bearer": []}]
    return document


def cached_document(app: Flask) -> dict[str, Any]:
    """`build_document(app)`, built on first use."""
    document = app.extensions.get("agentd.openapi")
    if document is None:
        document = app.extensions["agentd.openapi"] = build_document(app)
    return document
