"""agentd/api/routes_openai.py exactly: content parts and their error messages, generation
parameters, refused parameters at and around their allowed values, how run failures map
onto OpenAI's statuses and codes, agent lookup, and the exact bodies of answers and streams.
In process over the real app and kernel, runs going to the fake LLM over real HTTP (fast
enough for mutation testing); the OpenAI SDK path through the daemon is test_openai_params.py.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Iterator

import pytest
from flask import Flask

from agentd.agents.loop import RunCancelled
from agentd.agents.manager import AgentRunError
from agentd.api import routes_openai as ro
from agentd.api import create_app
from agentd.config import parse_config
from agentd.errors import BadRequest, TooManyRequests
from agentd.kernel import Kernel
from agentd.llm.types import GenerationParams, ImagePart
from support import with_test_db

LOCAL = {"REMOTE_ADDR": "127.0.0.1"}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


# -- pure helpers ---------------------------------------------------------------------------------------

def test_parts_of_strings_and_nothing() -> None:
    assert ro._parts(None, 0) == ("", [])
    assert ro._parts("hi", 0) == ("hi", [])
    assert ro._parts("", 0) == ("", [])
    assert ro._parts([], 0) == ("", [])


def test_parts_text_and_images() -> None:
    content = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
               {"type": "text", "text": "b"}]
    assert ro._parts(content, 3) == ("a\nb", [ImagePart("image/png", PNG)])
    jpeg = [{"type": "image_url", "image_url": {"url": f"data:image/svg+xml;base64,{PNG}"}}]
    assert ro._parts(jpeg, 0) == ("", [ImagePart("image/svg+xml", PNG)])


@pytest.mark.parametrize("content, index, message", [
    (5, 2, "messages[2].content must be a string or an array of parts"),
    ({"type": "text"}, 0, "messages[0].content must be a string or an array of parts"),
    (["x"], 1, "messages[1].content[0] must be an object"),
    ([{"type": "text", "text": "a"}, None], 0, "messages[0].content[1] must be an object"),
    ([{"type": "text", "text": 5}], 0, "messages[0].content[0]: unsupported part type 'text'"),
    ([{"type": "audio"}], 0, "messages[0].content[0]: unsupported part type 'audio'"),
    ([{"text": "a"}], 0, "messages[0].content[0]: unsupported part type None"),
    ([{"type": "image_url"}], 4, "messages[4].content[0].image_url.url must be a string"),
    ([{"type": "image_url", "image_url": "data:image/png;base64,AAAA"}], 0,
     "messages[0].content[0].image_url.url must be a string"),
    ([{"type": "image_url", "image_url": {"url": 5}}], 0, "messages[0].content[0].image_url.url must be a string"),
    ([{"type": "image_url", "image_url": {}}], 0, "messages[0].content[0].image_url.url must be a string"),
    ([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}], 0,
     "messages[0].content[0]: only base64 data URIs (data:image/<type>;base64,...) are supported; "
     "image URLs are not fetched"),
    ([{"type": "image_url", "image_url": {"url": "data:text/plain;base64,AAAA"}}], 0,
     "messages[0].content[0]: only base64 data URIs (data:image/<type>;base64,...) are supported; "
     "image URLs are not fetched"),
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,***"}}], 0,
     "messages[0].content[0]: image data is not valid base64"),
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}], 0,
     "messages[0].content[0]: image data is not valid base64"),
])
def test_parts_errors(content, index: int, message: str) -> None:
    with pytest.raises(BadRequest) as info:
        ro._parts(content, index)
    assert str(info.value) == message


def test_generation_params() -> None:
    assert ro.generation_params({}) == GenerationParams()
    assert ro.generation_params({"presence_penalty": 0, "frequency_penalty": 0.0, "stop": None, "user": "",
                                 "response_format": {"type": "text"}}) == GenerationParams(), \
        "BUG: default values counted as given"
    fmt = {"type": "json_object"}
    assert ro.generation_params({"top_p": 0.5, "stop": ["END"], "seed": 7, "presence_penalty": 0.4,
                                 "frequency_penalty": -0.3, "response_format": fmt, "user": "u1"}) == \
        GenerationParams(top_p=0.5, stop=["END"], seed=7, presence_penalty=0.4, frequency_penalty=-0.3,
                         response_format=fmt, user="u1")
    assert ro.generation_params({"response_format": None}).response_format is None


@pytest.mark.parametrize("data, refused", [
    ({"tools": [{"type": "function"}]}, "tools"), ({"tools": []}, None), ({"tools": None}, None),
    ({"functions": [{"name": "f"}]}, "functions"), ({"functions": []}, None),
    ({"tool_choice": "required"}, "tool_choice"), ({"tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tool_choice": "auto"}, None), ({"tool_choice": "none"}, None), ({"tool_choice": None}, None),
    ({"function_call": "f"}, "function_call"), ({"function_call": "auto"}, None), ({"function_call": "none"}, None),
    ({"logprobs": True}, "logprobs"), ({"logprobs": False}, None),
    ({"top_logprobs": 0}, "top_logprobs"), ({"top_logprobs": None}, None),
    ({"n": 2}, "n"), ({"n": 0}, "n"), ({"n": 1}, None), ({"n": None}, None),
    ({"logit_bias": {"50256": -100}}, "logit_bias"), ({"logit_bias": {}}, None),
    ({"n": 2, "tools": [{}]}, "tools"),
])
def test_refused_parameters(data: dict, refused) -> None:
    if refused is None:
        assert ro.refuse_unsupported(data) is None
        return
    with pytest.raises(BadRequest) as info:
        ro.refuse_unsupported(data)
    assert str(info.value) == (f"unsupported parameter '{refused}': agentd agents choose their own tools and "
                               "answer with one choice; remove it from the request")


def test_refuse_ignores_non_objects() -> None:
    for data in (None, [], "tools", 5):
        assert ro.refuse_unsupported(data) is None


def test_usage_shape() -> None:
    assert ro._usage(3, 4) == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert list(ro._usage(0, 0)) == ["prompt_tokens", "completion_tokens", "total_tokens"]


# -- run failures ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bare_app() -> Flask:
    from agentd.api.errors import register_error_handlers

    app = Flask("v1-errors")
    register_error_handlers(app)
    return app


def failure(app: Flask, exc) -> tuple[int, dict, dict]:
    with app.test_request_context("/v1/chat/completions", method="POST"):
        response = ro.run_failure(exc)
        return response.status_code, response.get_json(), dict(response.headers)


@pytest.mark.parametrize("kind, status, code", [
    ("missing_key", 401, "missing_provider_key"), ("auth", 401, "provider_auth_failed"),
    ("rate_limit", 429, "upstream_rate_limited"), ("server", 503, "upstream_unavailable"),
    ("unreachable", 503, "upstream_unavailable"), ("timeout", 504, "upstream_timeout"),
    ("bad_request", 502, "upstream_rejected_request"), ("not_found", 502, "upstream_model_not_found"),
    ("bad_response", 502, "upstream_bad_response"), ("loop_guard", 500, "loop_guard_stopped"),
    ("reset", 502, "upstream_connection_reset"), ("truncated", 502, "upstream_stream_truncated"),
    ("something_new", 500, "agent_error"),
])
def test_run_failure_mapping(bare_app: Flask, kind: str, status: int, code: str) -> None:
    got_status, body, headers = failure(bare_app, AgentRunError("it broke", kind=kind))
    assert got_status == status, f"BUG: run failure {kind} answered {got_status}"
    assert body["error"]["message"] == "it broke" and body["error"]["code"] == code
    assert headers["x-should-retry"] == "false"
    assert "Retry-After" not in headers


def test_run_failure_cancelled_and_quota(bare_app: Flask) -> None:
    status, body, headers = failure(bare_app, RunCancelled("stopped"))
    assert (status, body["error"]["message"], body["error"]["code"], headers["x-should-retry"]) == \
        (409, "the run was stopped before the agent answered", "run_cancelled", "false")
    status, body, headers = failure(bare_app, AgentRunError("slow down", kind="rate_limit", retry_after=2.5))
    assert (status, headers["Retry-After"]) == (429, "3")
    status, body, headers = failure(bare_app, TooManyRequests("monthly budget reached", retry_after=10))
    assert (status, body["error"]["code"], headers["Retry-After"], headers["x-should-retry"]) == \
        (429, "budget_exceeded", "10", "false")
    assert body["error"]["type"] == "rate_limit_error"
    assert body["error"]["message"] == "monthly budget reached", "BUG: the refusal lost its message"
    status, body, headers = failure(bare_app, TooManyRequests("token quota used up"))
    assert (status, body["error"]["code"]) == (429, "quota_exceeded")
    assert "Retry-After" not in headers
    status, body, _ = failure(bare_app, TooManyRequests("agent queue full", code="agent_busy"))
    assert (status, body["error"]["code"]) == (429, "agent_busy")


# -- through the app ---------------------------------------------------------------------------------------------

@pytest.fixture
def app_client(tmp_path: Path, fake_llm, monkeypatch) -> Iterator:
    monkeypatch.setenv("OPENAI_API_KEY", "test-openai")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-anthropic")
    data = {"api": {"rate_limit_per_second": 10000, "rate_limit_burst": 10000},
            "llm": {"timeout_secs": 3, "retries": 1},
            "default_model": {"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
            "provider_urls": {"openai": fake_llm.openai_base, "anthropic": fake_llm.anthropic_base}}
    kernel = Kernel.open(parse_config(with_test_db(data, tmp_path), tmp_path))
    client = create_app(kernel).test_client()
    yield client
    kernel.close()


def spawn(client, name: str, model: str = "") -> str:
    manifest = f'name = "{name}"\n' + model
    r = client.post("/api/agents", json={"manifest_toml": manifest}, environ_base=LOCAL)
    assert r.status_code == 201, r.get_data(as_text=True)
    return r.get_json()["agent_id"]


def chat(client, **data):
    return client.post("/v1/chat/completions", json=data, environ_base=LOCAL)


def test_answer_is_exact(app_client) -> None:
    spawn(app_client, "exact")
    r = chat(app_client, model="agentd:exact", messages=[{"role": "user", "content": "[[reply:hello there]]"}])
    assert r.status_code == 200, r.get_data(as_text=True)
    body = r.get_json()
    assert body["id"].startswith("chatcmpl-") and len(body["id"]) == len("chatcmpl-") + 36
    assert isinstance(body["created"], int)
    assert {k: v for k, v in body.items() if k not in ("id", "created")} == {
        "object": "chat.completion", "model": "exact",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello there"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": body["usage"]["prompt_tokens"], "completion_tokens": 2,
                  "total_tokens": body["usage"]["prompt_tokens"] + 2}}
    assert ro.DROPPED_HEADER not in r.headers


def test_model_lookup(app_client) -> None:
    agent_id = spawn(app_client, "lookme")
    for model in ("agentd:lookme", agent_id, "lookme"):
        r = chat(app_client, model=model, messages=[{"role": "user", "content": "[[reply:ok]]"}])
        assert r.status_code == 200 and r.get_json()["model"] == "lookme", f"model {model!r} not resolved"
    for model in ("agentd:lookm", "agentd:lookme2", "lookm", "agentd:", "AGENTD:lookme", "agentd:agentd:lookme"):
        r = chat(app_client, model=model, messages=[{"role": "user", "content": "hi"}])
        assert r.status_code == 404, f"BUG: near-miss model {model!r} resolved"
        assert r.get_json() == {"error": {"message": f"no agent found for model '{model}'",
                                          "type": "invalid_request_error", "code": "model_not_found"}}
    assert app_client.delete(f"/api/agents/{agent_id}", environ_base=LOCAL).status_code in (200, 204)
    r = chat(app_client, model="agentd:lookme", messages=[{"role": "user", "content": "hi"}])
    assert r.status_code == 404, "BUG: a killed agent still answers as a model"


def test_system_messages_and_last_user_message(app_client) -> None:
    spawn(app_client, "sys")
    messages = [{"role": "system", "content": "rule one"}, {"role": "user", "content": "first [[reply:no]]"},
                {"role": "assistant", "content": "x"}, {"role": "developer", "content": "  "},
                {"role": "developer", "content": [{"type": "text", "text": "rule two"}]},
                {"role": "user", "content": "[[echo_params]]"}]
    r = chat(app_client, model="sys", messages=messages, max_completion_tokens=33)
    echoed = json.loads(r.get_json()["choices"][0]["message"]["content"])
    assert echoed["max_tokens"] == 33
    assert echoed["system"].endswith("rule one\n\nrule two"), echoed["system"]
    r = chat(app_client, model="sys", messages=[{"role": "user", "content": "[[echo_params]]"}], max_tokens=12,
             max_completion_tokens=40, temperature=0.25)
    echoed = json.loads(r.get_json()["choices"][0]["message"]["content"])
    assert (echoed["max_tokens"], echoed["temperature"]) == (12, 0.25)


@pytest.mark.parametrize("messages", [
    [{"role": "system", "content": "only rules"}],
    [{"role": "user", "content": "   "}],
    [{"role": "user", "content": None}],
    [{"role": "assistant", "content": "hi"}],
])
def test_no_user_message(app_client, messages) -> None:
    spawn(app_client, "nouser")
    r = chat(app_client, model="nouser", messages=messages)
    assert r.status_code == 400
    assert r.get_json()["error"]["message"] == "no user message found in request"
    assert r.get_json()["error"]["code"] == "missing_message"


def test_image_only_message_and_size_limit(app_client) -> None:
    spawn(app_client, "img")
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    r = chat(app_client, model="img", messages=[{"role": "user", "content": [image]}])
    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.get_json()["choices"][0]["message"]["content"] == "echo: (image)"
    r = chat(app_client, model="img", messages=[{"role": "user", "content": "é" * 32768 + "a"}])
    assert r.status_code == 413 and r.get_json()["error"]["message"] == "message too large (max 64 KB)"
    r = chat(app_client, model="img", messages=[{"role": "user", "content": "[[reply:k]]" + "a" * (65536 - 11)}])
    assert r.status_code == 200, "BUG: a message of exactly 64 KiB was refused"


def test_dropped_parameters_header(app_client) -> None:
    spawn(app_client, "claude", '[model]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-6"\n')
    r = chat(app_client, model="claude", messages=[{"role": "user", "content": "[[reply:ok]]"}], seed=1,
             presence_penalty=0.5, frequency_penalty=0.2, top_p=0.5)
    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.headers[ro.DROPPED_HEADER] == "seed, presence_penalty, frequency_penalty"
    r = chat(app_client, model="claude", messages=[{"role": "user", "content": "[[reply:ok]]"}], seed=3)
    assert r.headers[ro.DROPPED_HEADER] == "seed"
    r = chat(app_client, model="claude", messages=[{"role": "user", "content": "[[reply:ok]]"}], top_p=0.5)
    assert ro.DROPPED_HEADER not in r.headers


def sse(r) -> list:
    text = r.get_data(as_text=True)
    events = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_stream_chunks_are_exact(app_client) -> None:
    spawn(app_client, "streamer")
    r = chat(app_client, model="agentd:streamer", messages=[{"role": "user", "content": "[[reply:one two]]"}],
             stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200 and r.mimetype == "text/event-stream"
    events = sse(r)
    assert events[-1] == "[DONE]"
    first = events[0]
    completion_id, created = first["id"], first["created"]
    assert completion_id.startswith("chatcmpl-")
    for e in events[:-1]:
        assert (e["id"], e["object"], e["created"], e["model"]) == (completion_id, "chat.completion.chunk", created,
                                                                    "streamer")
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-3])
    assert text == "one two"
    assert events[-3]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 2
    # Without include_usage: no usage chunk.
    for options in (None, {}, {"include_usage": False}):
        r = chat(app_client, model="streamer", messages=[{"role": "user", "content": "[[reply:x]]"}], stream=True,
                 stream_options=options)
        events = sse(r)
        assert events[-2]["choices"][0]["finish_reason"] == "stop" and "usage" not in events[-2]
        assert all("usage" not in e for e in events[:-1])


def test_stream_error_event(app_client) -> None:
    spawn(app_client, "failing")
    r = chat(app_client, model="failing", messages=[{"role": "user", "content": "[[fail:400]]"}], stream=True)
    events = sse(r)
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert set(error) == {"message", "type", "code"} and error["type"] == "server_error" and error["code"] is None
    assert error["message"]


def test_stream_tool_calls_are_forwarded(app_client) -> None:
    spawn(app_client, "tooler")
    r = chat(app_client, model="tooler", messages=[{"role": "user", "content": '[[tool:agent_list {}]]'}], stream=True)
    events = sse(r)
    calls = [c for e in events[1:-1] if "choices" in e and e["choices"]
             for c in e["choices"][0]["delta"].get("tool_calls", [])]
    assert calls, "BUG: a streamed run's tool call was not forwarded"
    head = calls[0]
    assert head["index"] == 0 and head["type"] == "function" and head["function"] == {"name": "agent_list",
                                                                                        "arguments": ""}
    assert head["id"]
    args = "".join(c["function"]["arguments"] for c in calls[1:] if "id" not in c)
    assert json.loads(args or "{}") == {}
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
