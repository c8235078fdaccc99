"""agentd/api/openapi.py exactly: path templates, the shared response headers and their texts,
error and success responses per prefix and status, path and query parameters, the statuses
each kind of route gets (public, GET, with a path parameter, with a body), links, and the
whole document of a small app and of the daemon's own app (cached once). In process.
test_openapi.py checks the daemon's document for completeness against its routes."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask
from marshmallow import Schema, fields

import agentd
from agentd.api import create_app
from agentd.api import openapi as oa
from agentd.api.apidoc import Operation, doc
from agentd.api import schemas_out as out
from agentd.config import parse_config
from agentd.kernel import Kernel
from support import with_test_db

REQ = {"$ref": "#/components/headers/RequestId"}
RATE = {"X-RateLimit-Limit": {"$ref": "#/components/headers/RateLimitLimit"},
        "X-RateLimit-Remaining": {"$ref": "#/components/headers/RateLimitRemaining"},
        "X-RateLimit-Reset": {"$ref": "#/components/headers/RateLimitReset"}}


@pytest.mark.parametrize("rule, path", [
    ("/api/agents", "/api/agents"), ("/api/agents/<agent_id>", "/api/agents/{agent_id}"),
    ("/api/agents/<agent_id>/kv/<path:key>", "/api/agents/{agent_id}/kv/{key}"),
    ("/api/x/<int:n>/<uuid:u>", "/api/x/{n}/{u}"), ("/a/<b>c<d>", "/a/{b}c{d}")])
def test_openapi_path(rule: str, path: str) -> None:
    assert oa.openapi_path(rule) == path


def test_shared_headers() -> None:
    integer = {"type": "integer", "minimum": 0}
    assert oa._headers() == {
        "RequestId": {"description": "Id of this request (also in the daemon's log)",
                      "schema": {"type": "string"}, "required": True},
        "RateLimitLimit": {"description": "Requests allowed at once (burst)", "schema": integer},
        "RateLimitRemaining": {"description": "Requests left in the bucket", "schema": integer},
        "RateLimitReset": {"description": "Seconds until the bucket is full", "schema": integer},
        "RetryAfter": {"description": "Seconds to wait before retrying", "schema": integer},
        "ShouldRetry": {"description": "`false`: retrying cannot succeed (the official OpenAI SDKs honour it)",
                        "schema": {"type": "string", "enum": ["true", "false"]}},
        "DroppedParams": {"description": "Comma-separated request parameters the agent's provider has no "
                                         "equivalent for; they were dropped, not refused",
                          "schema": {"type": "string"}},
    }


def error_body(name: str) -> dict:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}


def test_error_responses() -> None:
    assert oa._error_response("/api/agents", "gone", 404) == {
        "description": "gone", "headers": {"X-Request-Id": REQ}, "content": error_body("Error")}
    retry = {"$ref": "#/components/headers/RetryAfter"}
    should = {"$ref": "#/components/headers/ShouldRetry"}
    assert oa._error_response("/api/x", "slow", 429)["headers"] == {"X-Request-Id": REQ, "Retry-After": retry}
    assert oa._error_response("/api/x", "busy", 503)["headers"] == {"X-Request-Id": REQ, "Retry-After": retry}
    assert oa._error_response("/api/x", "bad", 502)["headers"] == {"X-Request-Id": REQ}
    assert oa._error_response("/v1/chat/completions", "t", 400) == {
        "description": "t", "headers": {"X-Request-Id": REQ, "x-should-retry": should},
        "content": error_body("OpenAIError")}
    assert list(oa._error_response("/v1/x", "t", 429)["headers"]) == ["X-Request-Id", "Retry-After",
                                                                       "x-should-retry"]
    # Only a /v1/ prefix makes an OpenAI error.
    assert oa._error_response("/api/v1/x", "t", 400)["content"] == error_body("Error")
    assert oa._error_response("/v1x", "t", 400)["content"] == error_body("Error")


def test_ok_responses() -> None:
    assert oa._ok_response(Operation("Sum")) == {"description": "Sum", "headers": {"X-Request-Id": REQ, **RATE}}
    op = Operation("Sum", ok_description="Done", response={"type": "object"},
                   ok_headers=("x-agentd-dropped-params", "Retry-After", "x-should-retry"))
    assert oa._ok_response(op) == {
        "description": "Done",
        "headers": {"X-Request-Id": REQ, **RATE,
                    "x-agentd-dropped-params": {"$ref": "#/components/headers/DroppedParams"},
                    "Retry-After": {"$ref": "#/components/headers/RetryAfter"},
                    "x-should-retry": {"$ref": "#/components/headers/ShouldRetry"}},
        "content": {"application/json": {"schema": {"type": "object"}}}}
    op = Operation("Stream", response={"type": "object"}, response_media="text/plain", sse_alt=True)
    assert oa._ok_response(op)["content"] == {"text/plain": {"schema": {"type": "object"}},
                                              "text/event-stream": {"schema": out.SSE}}
    assert oa._ok_response(Operation("WS", websocket=True, response={"type": "object"})) == \
        {"description": "Switching Protocols: the WebSocket is open"}
    assert oa._ok_response(Operation("WS", websocket=True, ok_description="Open")) == {"description": "Open"}


class Query(Schema):
    q = fields.String()


def rule_of(app: Flask, endpoint: str):
    return next(r for r in app.url_map.iter_rules() if r.endpoint == endpoint)


def test_parameters() -> None:
    app = Flask("p")
    app.add_url_rule("/api/a/<agent_id>/m/<model_id>/x/<other>/<path:key>", "p", lambda **_: "")
    app.add_url_rule("/api/plain", "plain", lambda: "")
    op = Operation("S", path_params={"other": {"maxLength": 9}, "agent_id": {"description": "x"}}, query=Query)
    assert oa._parameters(rule_of(app, "p"), op) == [
        {"name": "agent_id", "in": "path", "required": True, "description": "Agent id (UUID)",
         "schema": {"type": "string", "format": "uuid", "description": "x"}},
        {"name": "model_id", "in": "path", "required": True, "description": "Model id or alias",
         "schema": {"type": "string", "minLength": 1}},
        {"name": "other", "in": "path", "required": True, "description": "other",
         "schema": {"type": "string", "minLength": 1, "maxLength": 9}},
        {"name": "key", "in": "path", "required": True, "description": "Memory key",
         "schema": {"type": "string", "minLength": 1}},
        {"in": "query", "schema": Query}]
    assert oa._parameters(rule_of(app, "plain"), Operation("S")) == []
    for name in ("session_id", "workflow_id", "run_id"):
        a = Flask(name)
        a.add_url_rule(f"/api/<{name}>", "r", lambda **_: "")
        assert oa._parameters(rule_of(a, "r"), Operation("S"))[0]["schema"] == {"type": "string", "format": "uuid"}


def statuses(op: dict) -> list[str]:
    return list(op["responses"])


def test_operation_statuses_and_fields() -> None:
    app = Flask("ops")
    app.add_url_rule("/api/things", "things.list", lambda: "", methods=["GET"])
    app.add_url_rule("/api/things/<agent_id>", "things.put", lambda **_: "", methods=["PUT"])
    app.add_url_rule("/v1/models", "models", lambda: "", methods=["POST"])
    get = oa._operation(rule_of(app, "things.list"), "GET", Operation("List things"))
    assert get == {"operationId": "things.list", "summary": "List things", "tags": ["things"],
                   "responses": get["responses"]}
    assert statuses(get) == ["200", "400", "401", "429"]
    assert get["responses"]["400"]["description"] == oa.COMMON_ERRORS[400]
    assert get["responses"]["429"]["headers"]["Retry-After"] == {"$ref": "#/components/headers/RetryAfter"}
    assert "Retry-After" not in get["responses"]["400"]["headers"]
    public = oa._operation(rule_of(app, "things.list"), "GET", Operation("Pub", public=True, tags=("x", "y"),
                                                                        description="Long"))
    assert (public["security"], public["tags"], public["description"]) == ([], ["x", "y"], "Long")
    assert statuses(public) == ["200", "400", "429"]
    body = Operation("Put", body={"type": "object"}, ok=201, errors={409: "Exists", 400: "Bad name", 502: "Up"})
    put = oa._operation(rule_of(app, "things.put"), "PUT", body)
    assert statuses(put) == ["201", "400", "401", "403", "404", "409", "413", "415", "429", "502"]
    assert put["requestBody"] == {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
    assert put["responses"]["400"]["description"] == f"Bad name. Also: {oa.COMMON_ERRORS[400]}"
    assert put["responses"]["409"]["description"] == "Exists"
    assert put["responses"]["502"]["description"] == "Up"
    assert put["responses"]["404"]["description"] == oa.COMMON_ERRORS[404]
    for status in (401, 403, 413, 415, 429):
        assert put["responses"][str(status)]["description"] == oa.COMMON_ERRORS[status], status
    assert [p["name"] for p in put["parameters"]] == ["agent_id"]
    raw = Operation("Upload", body={"type": "string"}, body_media="application/octet-stream", body_required=False,
                    body_example="abc", errors={418: ""})
    up = oa._operation(rule_of(app, "models"), "POST", raw)
    assert up["tags"] == ["openai"]
    assert statuses(up) == ["200", "400", "401", "403", "413", "418", "429"]
    assert up["responses"]["418"]["description"] == "error"
    assert up["requestBody"] == {"required": False, "content": {"application/octet-stream": {
        "schema": {"type": "string"}, "example": "abc"}}}
    assert "parameters" not in up and "security" not in up and "description" not in up


def test_operation_links() -> None:
    app = Flask("links")
    app.add_url_rule("/api/things", "things.make", lambda: "", methods=["POST"])
    op = Operation("Make", ok=201, links={"Get": ("things.get", {"id": "$response.body#/id"}),
                                          "Send": ("things.send", {"id": "$response.body#/id"}, {"m": "x"})})
    links = oa._operation(rule_of(app, "things.make"), "POST", op)["responses"]["201"]["links"]
    assert links == {"Get": {"operationId": "things.get", "parameters": {"id": "$response.body#/id"}},
                     "Send": {"operationId": "things.send", "parameters": {"id": "$response.body#/id"},
                              "requestBody": {"m": "x"}}}
    assert "links" not in oa._operation(rule_of(app, "things.make"), "POST", Operation("M"))["responses"]["200"]


def test_extra_json_schema_keywords() -> None:
    field = fields.Dict(metadata={"json_schema": {"propertyNames": {"minLength": 1}}})
    got = oa._extra_json_schema(None, field, {})
    assert got == {"propertyNames": {"minLength": 1}}
    got["x"] = 1
    assert field.metadata["json_schema"] == {"propertyNames": {"minLength": 1}}, "the field's metadata was shared"
    assert oa._extra_json_schema(None, fields.String(), {"type": "string"}) == {}


class Body(Schema):
    name = fields.Dict(required=True, metadata={"json_schema": {"propertyNames": {"maxLength": 3}}})


def small_app() -> Flask:
    app = Flask("small")

    @app.route("/api/items/<agent_id>", methods=["GET", "DELETE"])
    @doc("Item", tags="items")
    def item(agent_id):
        return ""

    @app.post("/api/items")
    @doc("Make", body=Body)
    def make():
        return ""

    @app.get("/api/undocumented")
    def undocumented():
        return ""

    @app.get("/page")
    @doc("A page")
    def page():
        return ""

    return app


def test_build_document_of_a_small_app() -> None:
    document = oa.build_document(small_app())
    assert document["openapi"] == "3.1.0"
    assert document["info"] == {"title": "agentd", "version": agentd.__version__, "description": oa.DESCRIPTION,
                                "license": {"name": "MIT", "identifier": "MIT"}}
    assert document["security"] == [{"bearer": []}]
    assert list(document["paths"]) == ["/api/items", "/api/items/{agent_id}"]
    assert list(document["paths"]["/api/items/{agent_id}"]) == ["delete", "get"]
    assert document["paths"]["/api/items/{agent_id}"]["get"]["tags"] == ["items"]
    assert "403" not in document["paths"]["/api/items/{agent_id}"]["get"]["responses"], "BUG: a GET may be refused as cross-site"
    assert "403" in document["paths"]["/api/items/{agent_id}"]["delete"]["responses"]
    components = document["components"]
    assert components["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer",
                                                        "description": "The daemon's `api_key`"}}
    assert components["headers"] == oa._headers()
    assert {"Error", "OpenAIError", "Body"} <= set(components["schemas"])
    assert components["schemas"]["Body"]["properties"]["name"]["propertyNames"] == {"maxLength": 3}, \
        "BUG: json_schema metadata not passed through"


def test_cached_document_of_the_daemon_app(tmp_path: Path) -> None:
    kernel = Kernel.open(parse_config(with_test_db({}, tmp_path), tmp_path))
    try:
        app = create_app(kernel)
        assert "agentd.openapi" not in app.extensions
        first = oa.cached_document(app)
        assert app.extensions["agentd.openapi"] is first
        assert oa.cached_document(app) is first
        assert first == oa.build_document(app)
        ws = first["paths"]["/api/agents/{agent_id}/ws"]["get"]
        assert ws["responses"]["101"] == {"description": "Switching Protocols: the WebSocket is open"}
        chat = first["paths"]["/v1/chat/completions"]["post"]
        assert chat["tags"] == ["openai"] and "x-should-retry" in chat["responses"]["400"]["headers"]
    finally:
        kernel.close()
