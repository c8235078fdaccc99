"""The OpenAPI document: every route documented, served publicly at
/api/openapi.json with the package version, built from the schemas that validate requests,
linked from the /api page; plus regression tests for what schemathesis found."""

from __future__ import annotations

import re
from pathlib import Path
import jsonschema_rs
import pytest
import requests
from flask import Flask, jsonify
import agentd
from agentd.api import create_app
from agentd.api.apidoc import doc, is_api_path
from agentd.api.openapi import build_document, openapi_path
from agentd.config import parse_config
from agentd.kernel import Kernel
from support import with_test_db
from tests.agents.test_agents import spawn
from flask import Flask
from marshmallow import Schema, fields
from agentd.api import openapi as oa
from agentd.api.apidoc import Operation, doc
from agentd.api import schemas_out as out


API_KEY = "doc-key"


@pytest.fixture
def app(tmp_path: Path):
    kernel = Kernel.open(parse_config(with_test_db({}, tmp_path), tmp_path))
    yield create_app(kernel)
    kernel.close()


def undocumented(app: Flask, document: dict) -> list[str]:
    """API routes (method + path) the document lacks, and documented ones nobody routes."""
    routed = {(m.lower(), openapi_path(r.rule)) for r in app.url_map.iter_rules() if is_api_path(r.rule)
              for m in (r.methods or set()) - {"HEAD", "OPTIONS"}}
    documented = {(m, p) for p, ops in document["paths"].items() for m in ops}
    return sorted(f"{m.upper()} {p}" for m, p in routed ^ documented)


def test_every_route_is_documented(app) -> None:
    assert undocumented(app, build_document(app)) == []


def test_a_route_added_without_documentation_fails(app) -> None:
    @app.get("/api/_test/new-thing")
    def new_thing():
        return jsonify({})

    assert undocumented(app, build_document(app)) == ["GET /api/_test/new-thing"]

    @app.get("/api/_test/documented")
    @doc("A documented test route", response={"type": "object"})
    def documented():
        return jsonify({})

    assert undocumented(app, build_document(app)) == ["GET /api/_test/new-thing"]


def test_pages_are_not_part_of_the_api(app) -> None:
    paths = build_document(app)["paths"]
    assert "/api" not in paths and "/" not in paths and not any(p.startswith("/static") for p in paths)


def test_mcp_and_a2a_are_documented_with_what_they_answer(app) -> None:
    paths = build_document(app)["paths"]
    mcp = paths["/mcp"]
    assert set(mcp) == {"post"}, "GET and DELETE answer 405: the transport is stateless"
    post = mcp["post"]
    assert {"200", "202", "400", "401", "404", "406", "413", "415"} <= set(post["responses"])
    assert post["responses"]["200"]["content"] == {
        "application/json": {"schema": {"$ref": "#/components/schemas/JsonRpcResponse"}},
        "text/event-stream": {"schema": {"$ref": "#/components/schemas/JsonRpcEvent"}}}
    assert "content" not in post["responses"]["202"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/JsonRpcRequest"}
    for path in ("/.well-known/agent-card.json", "/.well-known/agent.json",
                 "/a2a/agents/{name}/.well-known/agent-card.json", "/a2a/agents/{name}/.well-known/agent.json"):
        card = paths[path]["get"]
        assert card["security"] == [] and "401" not in card["responses"], path
        assert card["responses"]["200"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/AgentCard"}, path
    assert "security" not in paths["/a2a/agents"]["get"] and "401" in paths["/a2a/agents"]["get"]["responses"]
    for path in ("/a2a", "/a2a/agents/{name}"):
        rpc = paths[path]["post"]
        assert rpc["responses"]["200"]["content"] == post["responses"]["200"]["content"], path
        assert "415" not in rpc["responses"], "the body is read as JSON whatever its Content-Type"
    assert "404" in paths["/a2a/agents/{name}"]["post"]["responses"] and "404" not in paths["/a2a"]["post"]["responses"]


def test_document_shape(app) -> None:
    d = build_document(app)
    assert d["openapi"] == "3.1.0" and d["info"]["version"] == agentd.__version__
    for path, ops in d["paths"].items():
        names = re.findall(r"{([^}]+)}", path)
        for method, op in ops.items():
            where = f"{method.upper()} {path}"
            params = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert params == set(names), where
            assert op["summary"] and op["operationId"], where
            statuses = set(op["responses"])
            assert {"400", "429"} <= statuses, where
            # A 500 is listed only where a route answers one on purpose (an agent run that failed).
            assert ("500" in statuses) == (where in ("POST /api/agents/{agent_id}/message",
                                                     "POST /v1/chat/completions", "POST /v1/responses")), where
            assert ("401" in statuses) == (op.get("security") != []), where
            error = "OpenAIError" if path.startswith("/v1/") else "Error"
            for status, response in op["responses"].items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    # MCP's transport refuses some messages with a JSON-RPC error of its own.
                    if "oneOf" in schema:
                        assert path == "/mcp" and schema["oneOf"][1] == {"$ref": "#/components/schemas/JsonRpcError"}
                        schema = schema["oneOf"][0]
                    elif path == "/mcp" and status in ("404", "406"):
                        assert schema == {"$ref": "#/components/schemas/JsonRpcError"}, where
                        continue
                    assert schema["$ref"] == f"#/components/schemas/{error}", where
    assert d["components"]["schemas"]["Error"]["required"] == ["error"]
    assert d["components"]["schemas"]["JsonRpcError"]["required"] == ["jsonrpc", "id", "error"]
    assert set(d["components"]["schemas"]["OpenAIErrorBody"]["properties"]) == {"message", "type", "code"}
    assert "code" not in d["components"]["schemas"]["OpenAIErrorBody"].get("required", []), "code may be absent"
    # SSE routes answer text/event-stream; the WebSocket is described in text.
    sse = d["paths"]["/api/agents/{agent_id}/message/stream"]["post"]["responses"]["200"]["content"]
    assert list(sse) == ["text/event-stream"]
    assert set(d["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]) == {
        "application/json", "text/event-stream"}
    ws = d["paths"]["/api/agents/{agent_id}/ws"]["get"]
    assert "text_delta" in ws["description"] and "Upgrade" in ws["description"]
    # Public routes carry an empty security requirement.
    for path in ("/api/health", "/api/version", "/api/openapi.json"):
        assert d["paths"][path]["get"]["security"] == []


def test_request_schemas_are_the_validating_classes(app) -> None:
    """The document's body schemas come from the marshmallow classes the routes load with."""
    schemas = build_document(app)["components"]["schemas"]
    assert schemas["Mode"]["properties"]["mode"]["enum"] == ["Auto", "Manual", "Observe"]
    assert schemas["Mode"]["additionalProperties"] is False
    assert set(schemas["Spawn"]["properties"]) == {"manifest_toml", "signed_manifest"}
    assert schemas["CustomModel"]["properties"]["tier"]["enum"][0] == "frontier"
    chat = schemas["ChatRequest"]["properties"]
    assert chat["top_p"]["maximum"] == 1.0 and (chat["n"]["minimum"], chat["n"]["maximum"]) == (1, 128) and chat["tools"]["maxItems"] == 0


def test_served_publicly_with_the_package_version(daemon_factory) -> None:
    d = daemon_factory(f'api_key = "{API_KEY}"\n[api]\nrate_limit_per_second = 1000\n', api_key=API_KEY)
    anonymous = requests.get(f"{d.url}/api/openapi.json", timeout=10)
    assert anonymous.status_code == 200 and anonymous.headers["Content-Type"] == "application/json"
    document = anonymous.json()
    assert document["info"]["version"] == agentd.__version__ == d.get("/api/version").json()["version"]
    assert requests.get(f"{d.url}/api/status", timeout=10).status_code == 401
    # The page listing it is a dashboard page: behind the login like the others.
    page = requests.get(f"{d.url}/api", timeout=10, allow_redirects=False)
    assert (page.status_code, page.headers["Location"]) == (303, "/login?next=/api")
    page = requests.get(f"{d.url}/api", timeout=10, headers={"Authorization": f"Bearer {API_KEY}"})
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert 'href="/api/openapi.json"' in page.text
    assert 'href="/static/app.css"' in page.text and 'href="/agents"' in page.text, "the dashboard's layout and nav"
    for path, ops in document["paths"].items():
        assert f"<code>{path}</code>" in page.text.replace("&lt;", "<").replace("&gt;", ">")
        for method in ops:
            assert f"<code>{method.upper()}</code>" in page.text


def test_schema_validation_matches_the_document(agent_daemon) -> None:
    agent_id = spawn(agent_daemon)
    r = agent_daemon.put(f"/api/agents/{agent_id}/mode", json={"mode": "Sideways"})
    assert r.status_code == 400 and "mode" in r.json()["error"]
    r = agent_daemon.put(f"/api/agents/{agent_id}/mode", json={"mode": "Observe", "extra": 1})
    assert r.status_code == 400 and "extra" in r.json()["error"]
    assert agent_daemon.put(f"/api/agents/{agent_id}/mode", json={"mode": "Observe"}).status_code == 200


# -- regressions: what the fuzzer found ---------------------------------------------------------

def test_blank_message_is_refused_by_the_schema(agent_daemon) -> None:
    agent_id = spawn(agent_daemon)
    # Blank to JSON Schema's `\s` (U+FEFF) and to Python's (U+001F, U+0085) alike.
    for text in ("", "   \n\t", "\ufeff", "\u3000\ufeff\x85 ", "\x1f"):
        for route in ("message", "message/stream"):
            r = agent_daemon.post(f"/api/agents/{agent_id}/{route}", json={"message": text})
            assert (r.status_code, r.json()) == (400, {"error": "invalid request: message: must not be empty"}), \
                (route, text)


def test_the_document_and_the_server_agree_on_blank_text(agent_daemon) -> None:
    """The document's `pattern` (ECMA-262, as JSON Schema validators read it) refuses exactly
    the texts the server calls blank."""
    from agentd.schema_fields import BLANK

    schemas = agent_daemon.get("/api/openapi.json").json()["components"]["schemas"]
    message = schemas["Message"]["properties"]["message"]
    validator = jsonschema_rs.validator_for({"type": "string", "pattern": message["pattern"]})
    for code in [*range(0x3100), 0x180E, 0x200B, 0x2060, 0xFEFF, 0xFFFD]:
        c = chr(code)
        assert validator.is_valid(c) is (c not in BLANK), hex(code)
        assert validator.is_valid(f"{c}x{c}") and not validator.is_valid(BLANK + c * (c in BLANK)), hex(code)
    agent_id = spawn(agent_daemon)
    r = agent_daemon.post(f"/api/agents/{agent_id}/message", json={"message": "\u200b"})  # not blank to either
    assert r.status_code == 200, r.text


def test_booleans_are_json_booleans(agent_daemon) -> None:
    """`stream: 0` was taken as false and `supports_tools: 1` as true (1 == True in Python)."""
    name = f"b-{spawn(agent_daemon)[:6]}"
    spawn(agent_daemon, name)
    r = agent_daemon.post("/v1/chat/completions", json={"model": name, "stream": 0,
                                                         "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "stream" in r.json()["error"]["message"]
    model = {"id": "bool-model", "display_name": "B", "provider": "openai", "context_window": 10,
             "max_output_tokens": 10, "input_cost_per_m": 0, "output_cost_per_m": 0,
             "supports_tools": 1, "supports_vision": False, "supports_streaming": True}
    r = agent_daemon.post("/api/models/custom", json=model)
    assert r.status_code == 400 and "supports_tools" in r.json()["error"]


def test_refused_openai_parameters_are_refused_whatever_their_shape(agent_daemon) -> None:
    name = f"r-{spawn(agent_daemon)[:6]}"
    spawn(agent_daemon, name)
    for extra in ({"logit_bias": {"x": {}}}, {"tools": [{}]}, {"top_logprobs": 0}):
        r = agent_daemon.post("/v1/chat/completions", json={"model": name, **extra,
                                                             "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400, extra
        assert f"'{next(iter(extra))}'" in r.json()["error"]["message"]


def test_sse_refuses_a_bad_attachment_before_the_stream(agent_daemon) -> None:
    """It used to answer 200, open the stream and only then send an `error` event."""
    agent_id = spawn(agent_daemon)
    r = agent_daemon.post(f"/api/agents/{agent_id}/message/stream",
                          json={"message": "hi", "attachments": [{"file_id": ""}]})
    assert r.status_code == 400 and r.headers["Content-Type"] == "application/json"
    assert "file" in r.json()["error"]


def test_provider_url_that_requests_cannot_use_is_refused(agent_daemon) -> None:
    """An unusable URL used to be stored, and every later call to that provider failed."""
    for url in ("http://[", "http://host:99999", "http://exa mple.com", "http://a\x00b", "ftp://x"):
        r = agent_daemon.put("/api/providers/groq/url", json={"base_url": url})
        assert r.status_code == 400, url
    ok = agent_daemon.put("/api/providers/groq/url", json={"base_url": "https://api.groq.com/openai/v1/"})
    assert ok.status_code == 200 and ok.json()["base_url"] == "https://api.groq.com/openai/v1"


def test_sse_ticks_query_is_validated(agent_daemon) -> None:
    """A negative or NaN interval reached time.sleep() (a 500)."""
    for query in ("n=2&interval=-1", "n=2&interval=nan", "n=x"):
        r = agent_daemon.get(f"/api/_sse/ticks?{query}")
        assert r.status_code == 400, query
    r = agent_daemon.get("/api/_sse/ticks?n=2&interval=0")
    assert r.status_code == 200 and r.text.count("event: tick") == 2


def test_usage_period_accepts_rfc3339_spellings(agent_daemon) -> None:
    for since in ("2026-01-01t00:00:00z", "2026-01-01T00:00:00.123456789Z", "2026-01-01"):
        r = agent_daemon.get("/api/usage", params={"since": since})
        assert r.status_code == 200, since
        assert r.json()["period_start"].startswith("2026-01-01T00:00:00")


@pytest.mark.parametrize("directive", ["[[fail:503]]", "[[fail:429]]", "[[fail:401]]", "[[fail:400]]",
                                       "[[fail:404]]", "[[garbage]]"])
def test_upstream_failure_statuses_are_documented(agent_daemon, directive) -> None:
    """What the run routes answer when the provider fails is listed in the document."""
    paths = agent_daemon.get("/api/openapi.json").json()["paths"]
    name = f"f-{spawn(agent_daemon)[:6]}"
    agent_id = spawn(agent_daemon, name)
    native = agent_daemon.post(f"/api/agents/{agent_id}/message", json={"message": f"{directive} x"})
    openai_style = agent_daemon.post("/v1/chat/completions", json={
        "model": name, "messages": [{"role": "user", "content": f"{directive} y"}]})
    for response, path in ((native, "/api/agents/{agent_id}/message"), (openai_style, "/v1/chat/completions")):
        assert response.status_code >= 400, (directive, path)
        assert str(response.status_code) in paths[path]["post"]["responses"], (directive, path,
                                                                               response.status_code)
    assert isinstance(native.json()["error"], str)
    assert {"message", "type"} <= set(openai_style.json()["error"]) <= {"message", "type", "code"}
    assert openai_style.json()["error"].get("code", "absent") is not None, "code is a string or left out"


def test_channel_test_body_types_are_checked(agent_daemon) -> None:
    """`target: {}` after an empty chat_id was silently ignored (and the adapter called)."""
    r = agent_daemon.post("/api/channels/discord/test", json={"chat_id": "", "target": {}})
    assert r.status_code == 400 and "target" in r.json()["error"]
    r = agent_daemon.post("/api/channels/discord/test", json={"message": "  "})
    assert r.status_code == 400 and "message" in r.json()["error"]


def test_json_null_is_not_an_empty_body(agent_daemon) -> None:
    """Routes whose body is optional took a JSON `null` for "no body"."""
    headers = {"Content-Type": "application/json"}
    r = agent_daemon.post("/api/channels/discord/test", data="null", headers=headers)
    assert r.status_code == 400 and "JSON object" in r.json()["error"]
    r = agent_daemon.post(f"/api/workflows/{'0' * 8}-0000-4000-8000-{'0' * 12}/run", data="null", headers=headers)
    assert r.status_code == 400


def test_graph_query_null_body_and_qr_status_without_session(agent_daemon) -> None:
    agent_id = spawn(agent_daemon)
    headers = {"Content-Type": "application/json"}
    r = agent_daemon.post(f"/api/memory/agents/{agent_id}/graph/query", data="null", headers=headers)
    assert r.status_code == 400
    assert agent_daemon.post(f"/api/memory/agents/{agent_id}/graph/query").status_code == 200
    # Checked before the (unconfigured) QR gateway is asked: 400, not 503.
    r = agent_daemon.get("/api/channels/whatsapp/qr/status")
    assert r.status_code == 400 and "session_id" in r.json()["error"]


def test_metadata_keys_differing_in_spaces_are_distinct(agent_daemon) -> None:
    """Metadata keys that differ only in surrounding spaces are distinct keys, stored and
    filtered on as sent (the store must not strip them into one)."""
    agent_id = spawn(agent_daemon)
    base = f"/api/memory/agents/{agent_id}"
    metadata = {"topic": 1, "topic ": 2, " topic": 3, "  ": 4}
    r = agent_daemon.post(f"{base}/memories", json={"content": "spaces in metadata keys", "metadata": metadata})
    assert r.status_code == 201, r.text
    fid = r.json()["id"]
    assert agent_daemon.get(f"{base}/memories/{fid}").json()["metadata"] == metadata
    for key, value in metadata.items():
        found = agent_daemon.post(f"{base}/recall", json={"query": "metadata keys",
                                                          "filter": {"metadata": {key: value}}}).json()
        assert [m["id"] for m in found["memories"]] == [fid], key
        found = agent_daemon.post(f"{base}/recall", json={"query": "metadata keys",
                                                          "filter": {"metadata": {key: value + 1}}}).json()
        assert found["memories"] == [], key


def test_custom_model_routes_serve_only_what_the_document_lists(agent_daemon) -> None:
    """GET /api/models/{id} does not answer on the custom-model routes (no model id is `custom`
    or starts with `custom/`), so their Allow header lists what the document lists."""
    paths = agent_daemon.get("/api/openapi.json").json()["paths"]
    assert set(paths["/api/models/custom"]) == {"post"}
    assert set(paths["/api/models/custom/{model_id}"]) == {"delete"}
    for path, allowed in (("/api/models/custom", {"POST", "OPTIONS"}),
                          ("/api/models/custom/some-model", {"DELETE", "OPTIONS"}),
                          ("/api/models/custom/org/some-model", {"DELETE", "OPTIONS"})):
        r = agent_daemon.request("OPTIONS", path)
        assert {m.strip() for m in r.headers["Allow"].split(",")} == allowed, path
        assert agent_daemon.get(path).status_code == 405, path
    model = {"id": "org/slashed-model", "display_name": "S", "provider": "openai", "context_window": 10,
             "max_output_tokens": 10, "input_cost_per_m": 0, "output_cost_per_m": 0,
             "supports_tools": False, "supports_vision": False, "supports_streaming": True}
    assert agent_daemon.post("/api/models/custom", json=model).status_code == 201
    r = agent_daemon.get("/api/models/org/slashed-model")
    assert r.status_code == 200 and r.json()["id"] == "org/slashed-model"
    assert agent_daemon.get("/api/models/customary").status_code == 404
    for reserved in ("custom", "custom/x"):
        r = agent_daemon.post("/api/models/custom", json={**model, "id": reserved})
        assert r.status_code == 400 and "custom-model routes" in r.json()["error"], reserved
    assert agent_daemon.delete("/api/models/custom/org/slashed-model").json() == {
        "status": "removed", "model_id": "org/slashed-model"}


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
    assert statuses(get) == ["200", "400", "401", "429", "503"]
    assert get["responses"]["400"]["description"] == oa.COMMON_ERRORS[400]
    assert get["responses"]["429"]["headers"]["Retry-After"] == {"$ref": "#/components/headers/RetryAfter"}
    assert "Retry-After" not in get["responses"]["400"]["headers"]
    public = oa._operation(rule_of(app, "things.list"), "GET", Operation("Pub", public=True, tags=("x", "y"),
                                                                        description="Long"))
    assert (public["security"], public["tags"], public["description"]) == ([], ["x", "y"], "Long")
    assert statuses(public) == ["200", "400", "429", "503"]
    body = Operation("Put", body={"type": "object"}, ok=201, errors={409: "Exists", 400: "Bad name", 502: "Up"})
    put = oa._operation(rule_of(app, "things.put"), "PUT", body)
    assert statuses(put) == ["201", "400", "401", "403", "404", "409", "413", "415", "429", "502", "503", "507"]
    assert put["requestBody"] == {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
    assert put["responses"]["400"]["description"] == f"Bad name. Also: {oa.COMMON_ERRORS[400]}"
    assert put["responses"]["409"]["description"] == "Exists"
    assert put["responses"]["502"]["description"] == "Up"
    assert put["responses"]["404"]["description"] == oa.COMMON_ERRORS[404]
    for status in (401, 403, 413, 415, 429, 503, 507):
        assert put["responses"][str(status)]["description"] == oa.COMMON_ERRORS[status], status
    for status in ("503", "507"):  # the database is out, or its disk full: retry later
        assert put["responses"][status]["headers"]["Retry-After"] == {"$ref": "#/components/headers/RetryAfter"}
    assert [p["name"] for p in put["parameters"]] == ["agent_id"]
    raw = Operation("Upload", body={"type": "string"}, body_media="application/octet-stream", body_required=False,
                    body_example="abc", errors={418: ""})
    up = oa._operation(rule_of(app, "models"), "POST", raw)
    assert up["tags"] == ["openai"]
    assert statuses(up) == ["200", "400", "401", "403", "413", "418", "429", "503", "507"]
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
