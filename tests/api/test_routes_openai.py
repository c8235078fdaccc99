"""/v1/chat/completions takes what OpenAI clients send: each generation parameter
reaches the agent's model in that provider's wire format (checked in the fake LLM's recorded
request), what a provider cannot honour is dropped and named in `x-agentd-dropped-params`,
and client tools stay refused. Driven with the `openai` SDK and LangChain's ChatOpenAI."""

from __future__ import annotations

import asyncio
import json
import uuid
import openai
import pytest
from tests.agents.test_agents import spawn
import base64
import logging
import re
import threading
import time
from pathlib import Path
from typing import Iterator
from flask import Flask
from agentd.agents.loop import RunCancelled
from agentd.agents.manager import AgentRunError
from agentd.api import routes_openai as ro
from agentd.api import create_app
from agentd.config import parse_config
from agentd.errors import BadRequest, TooManyRequests
from agentd.store.outage import DatabaseUnavailable
from agentd.kernel import Kernel
from agentd.llm.types import GenerationParams, ImagePart
from support import with_test_db


ANTHROPIC = '[model]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-6"\n'
GEMINI = '[model]\nprovider = "gemini"\nmodel = "gemini-2.5-flash"\n'

ALL_PARAMS = dict(top_p=0.5, stop=["END", "STOP"], seed=42, presence_penalty=0.4, frequency_penalty=-0.3,
                  max_completion_tokens=64, user="user-7",
                  response_format={"type": "json_object"})


@pytest.fixture
def oa(agent_daemon):
    return openai.OpenAI(base_url=f"{agent_daemon.url}/v1", api_key="unused", max_retries=0)


def upstream_request(fake, marker: str) -> dict:
    """The last request the fake provider got whose body mentions `marker`."""
    for entry in reversed(fake.requests):
        if marker in json.dumps(entry.get("json") or {}):
            return entry
    raise AssertionError(f"no upstream request mentions {marker}")


def agent(d, model: str = "") -> tuple[str, str]:
    name = f"p-{uuid.uuid4().hex[:8]}"
    spawn(d, name, model=model)
    return name, uuid.uuid4().hex[:10]


def test_models_list_and_retrieve_with_the_sdk(agent_daemon, oa) -> None:
    name, _ = agent(agent_daemon)
    listed = {m.id: m for m in oa.models.list().data}
    card = listed[f"agentd:{name}"]
    assert card.object == "model" and card.owned_by == "agentd" and isinstance(card.created, int)
    agent_id = agent_daemon.get("/api/agents").json()
    agent_id = next(a["id"] for a in agent_id if a["name"] == name)
    for ref in (f"agentd:{name}", name, agent_id):
        assert oa.models.retrieve(ref).model_dump() == card.model_dump(), ref
    with pytest.raises(openai.NotFoundError) as err:
        oa.models.retrieve(f"agentd:{name}-nobody")
    assert err.value.body == {"message": f"no agent found for model 'agentd:{name}-nobody'",
                              "type": "invalid_request_error", "code": "model_not_found"}


def test_openai_driver_receives_every_parameter(agent_daemon, fake_llm, oa) -> None:
    name, marker = agent(agent_daemon)
    raw = oa.chat.completions.with_raw_response.create(
        model=f"agentd:{name}", messages=[{"role": "user", "content": f'[[reply:{{"ok": true}}]] {marker}'}],
        **ALL_PARAMS)
    assert raw.status_code == 200
    assert "x-agentd-dropped-params" not in raw.headers  # the OpenAI format takes them all
    assert json.loads(raw.parse().choices[0].message.content) == {"ok": True}
    sent = upstream_request(fake_llm, marker)["json"]
    assert sent["top_p"] == 0.5 and sent["stop"] == ["END", "STOP"] and sent["seed"] == 42
    assert sent["presence_penalty"] == 0.4 and sent["frequency_penalty"] == -0.3
    assert sent["max_tokens"] == 64 and sent["user"] == "user-7"
    assert sent["response_format"] == {"type": "json_object"}


def test_json_schema_format_and_single_stop_string(agent_daemon, fake_llm, oa) -> None:
    name, marker = agent(agent_daemon)
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "strict": True, "schema": {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}
    oa.chat.completions.create(model=name, messages=[{"role": "user", "content": marker}],
                               response_format=fmt, stop="###")
    sent = upstream_request(fake_llm, marker)["json"]
    assert sent["response_format"] == fmt and sent["stop"] == ["###"]


@pytest.mark.parametrize("fmt", [{"type": "json_schema"}, {"type": "json_schema", "json_schema": {}},
                                 {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}])
def test_a_json_schema_format_without_its_name_is_refused(agent_daemon, fake_llm, fmt) -> None:
    name, marker = agent(agent_daemon)
    sent = len(fake_llm.requests)
    r = agent_daemon.post("/v1/chat/completions", json={"model": name, "response_format": fmt,
                                                        "messages": [{"role": "user", "content": marker}]})
    assert (r.status_code, r.json()) == (400, {"error": {
        "message": "invalid request: response_format.json_schema: required with type json_schema: an object with "
                   "a `name`", "type": "invalid_request_error"}})
    assert not any(marker in json.dumps(q.get("json") or {}) for q in fake_llm.requests[sent:])


def test_defaults_are_not_sent(agent_daemon, fake_llm, oa) -> None:
    """Default values (penalty 0, format text) mean "not given": nothing extra goes upstream."""
    name, marker = agent(agent_daemon)
    oa.chat.completions.create(model=name, messages=[{"role": "user", "content": marker}],
                               presence_penalty=0, frequency_penalty=0, response_format={"type": "text"})
    sent = upstream_request(fake_llm, marker)["json"]
    for key in ("presence_penalty", "frequency_penalty", "response_format", "top_p", "stop", "seed", "user"):
        assert key not in sent


def test_anthropic_maps_stop_and_top_p_and_drops_the_rest(agent_daemon, fake_llm, oa) -> None:
    name, marker = agent(agent_daemon, ANTHROPIC)
    raw = oa.chat.completions.with_raw_response.create(
        model=name, messages=[{"role": "user", "content": marker}], **ALL_PARAMS)
    assert raw.status_code == 200
    assert raw.headers["x-agentd-dropped-params"] == "seed, presence_penalty, frequency_penalty"
    entry = upstream_request(fake_llm, marker)
    assert entry["provider"] == "anthropic"
    sent = entry["json"]
    assert sent["stop_sequences"] == ["END", "STOP"] and sent["top_p"] == 0.5
    assert sent["metadata"] == {"user_id": "user-7"} and sent["max_tokens"] == 64
    for key in ("seed", "presence_penalty", "frequency_penalty", "stop", "response_format", "user"):
        assert key not in sent
    # No JSON mode in the Messages API: the instruction goes into the system prompt.
    assert "one valid JSON object" in sent["system"]


def test_gemini_generation_config(agent_daemon, fake_llm, oa) -> None:
    name, marker = agent(agent_daemon, GEMINI)
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": False}}}
    raw = oa.chat.completions.with_raw_response.create(
        model=name, messages=[{"role": "user", "content": marker}],
        **{**ALL_PARAMS, "response_format": fmt})
    assert raw.headers["x-agentd-dropped-params"] == "user"
    entry = upstream_request(fake_llm, marker)
    assert entry["provider"] == "gemini"
    config = entry["json"]["generationConfig"]
    assert config == {"maxOutputTokens": 64, "temperature": 0.7, "topP": 0.5, "seed": 42, "presencePenalty": 0.4,
                      "frequencyPenalty": -0.3, "stopSequences": ["END", "STOP"],
                      "responseMimeType": "application/json",
                      # Gemini's schema subset: additionalProperties is left out
                      "responseSchema": {"type": "object", "properties": {"n": {"type": "integer"}}}}


def test_streaming_passes_parameters_and_names_dropped_ones(agent_daemon, fake_llm) -> None:
    name, marker = agent(agent_daemon, ANTHROPIC)
    r = agent_daemon.post("/v1/chat/completions", stream=True, json={
        "model": name, "stream": True, "stream_options": {"include_usage": True}, "seed": 1, "top_p": 0.2,
        "messages": [{"role": "user", "content": f"[[chunks:3]] {marker}"}]})
    assert r.status_code == 200 and r.headers["x-agentd-dropped-params"] == "seed"
    lines = [line for line in r.iter_lines(decode_unicode=True) if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][5:])["usage"]["total_tokens"] > 0
    assert upstream_request(fake_llm, marker)["json"]["top_p"] == 0.2


def test_the_sdk_stream_helper_keeps_the_tool_calls_of_each_turn_apart(agent_daemon, oa) -> None:
    """The SDK assembles streamed tool calls by `index`: calls of different turns of the run
    have indexes of their own, so they stay two calls, in the order they were made."""
    name, _ = agent(agent_daemon)
    call = '[[tool:memory_store {"key": "c", "value": "3"} x2]]'
    with oa.chat.completions.stream(model=name, messages=[{"role": "user", "content": call}]) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["memory_store", "memory_store"], calls
    assert calls[0].id.startswith("call_") and calls[1].id.startswith("call_") and calls[0].id != calls[1].id
    assert [json.loads(c.function.arguments) for c in calls] == [{"key": "c", "value": "3"}] * 2
    assert [c.index for c in calls] == [0, 1]


def test_client_tools_and_other_refusals_stay(agent_daemon, oa) -> None:
    name, _ = agent(agent_daemon)
    refused = [({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "'tools'"),
               ({"tool_choice": "required"}, "'tool_choice'"), ({"logprobs": True}, "'logprobs'"),
               ({"logit_bias": {"50256": -100}}, "'logit_bias'")]
    for params, word in refused:
        with pytest.raises(openai.BadRequestError) as err:
            oa.chat.completions.create(model=name, messages=[{"role": "user", "content": "x"}], **params)
        assert word in str(err.value) and err.value.status_code == 400
    bad = [({"top_p": 1.5}, "top_p"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
           ({"presence_penalty": 3}, "presence_penalty"), ({"seed": "x"}, "seed"),
           ({"response_format": {"type": "yaml"}}, "response_format")]
    for params, word in bad:
        r = openai.OpenAI(base_url=oa.base_url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            r.chat.completions.create(model=name, messages=[{"role": "user", "content": "x"}], **params)
        assert word in str(err.value)
        assert err.value.body["type"] == "invalid_request_error"


def test_n_above_one_answers_one_choice_and_names_n_dropped(agent_daemon, oa) -> None:
    """The spec: always one choice. `n` > 1 is not refused: the answer has one choice and
    the header names `n` as dropped."""
    name, marker = agent(agent_daemon)
    raw = oa.chat.completions.with_raw_response.create(
        model=name, messages=[{"role": "user", "content": f"[[reply:only one]] {marker}"}], n=3)
    completion = raw.parse()
    assert raw.status_code == 200 and raw.headers["x-agentd-dropped-params"] == "n"
    assert [(c.index, c.message.content, c.finish_reason) for c in completion.choices] == [(0, "only one", "stop")]
    raw = oa.chat.completions.with_raw_response.create(
        model=name, messages=[{"role": "user", "content": f"[[reply:one again]] {marker}"}], n=1)
    assert raw.status_code == 200 and "x-agentd-dropped-params" not in raw.headers
    streamed = oa.chat.completions.create(model=name, messages=[{"role": "user", "content": "[[chunks:2]]"}],
                                          n=2, stream=True)
    chunks = list(streamed)
    assert {c.choices[0].index for c in chunks if c.choices} == {0}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "w1 w2"
    with pytest.raises(openai.BadRequestError) as err:
        oa.chat.completions.create(model=name, messages=[{"role": "user", "content": "x"}], n=0)
    assert err.value.body == {"message": "invalid request: n: Must be greater than or equal to 1 and less "
                                         "than or equal to 128.", "type": "invalid_request_error"}


@pytest.mark.parametrize("failing", ["[[fail:400]]", "[[fail:500]]", "unreachable"])
def test_a_provider_that_fails_answers_the_spec_s_500_or_says_it_is_down(agent_daemon, oa, failing: str) -> None:
    """An agent whose processing failed (its provider refused the request) is the spec's 500
    server_error without a code; a provider that is down after the retries is 503
    `upstream_unavailable`. Neither is retried by the SDK."""
    if failing == "unreachable":
        name, _ = agent(agent_daemon, model='[model]\nprovider = "openai"\nmodel = "gpt-4o"\n'
                                              'base_url = "http://127.0.0.1:9/v1"\n')
        text = "hello"
    else:
        name, _ = agent(agent_daemon)
        text = failing
    with pytest.raises(openai.APIStatusError) as err:
        oa.chat.completions.create(model=name, messages=[{"role": "user", "content": text}])
    if failing == "[[fail:400]]":
        assert err.value.status_code == 500, f"BUG: a failed agent answered {err.value.status_code}"
        assert set(err.value.body) == {"message", "type"}
    else:
        assert err.value.status_code == 503 and err.value.body["code"] == "upstream_unavailable"
    assert err.value.body["type"] == "server_error"
    assert err.value.body["message"].startswith("message delivery failed: ")
    assert err.value.response.headers["x-should-retry"] == "false"


def test_an_agent_whose_provider_has_no_key_answers_424_naming_the_fix(agent_daemon, oa) -> None:
    """A setting the daemon lacks, not an agent that failed: 424 with the native API's message,
    in OpenAI's shape, on chat completions and Responses, plain and streamed."""
    name, _ = agent(agent_daemon, '[model]\nprovider = "groq"\nmodel = "llama-3.3-70b-versatile"\n')
    message = ("message delivery failed: groq model llama-3.3-70b-versatile: no API key: set GROQ_API_KEY "
               "in the daemon's environment or POST /api/providers/groq/key")
    error = {"message": message, "type": "invalid_request_error", "code": "provider_key_missing"}
    with pytest.raises(openai.APIStatusError) as err:
        oa.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
    assert (err.value.status_code, err.value.body) == (424, error)
    assert err.value.response.headers["x-should-retry"] == "false"
    r = agent_daemon.post("/v1/responses", json={"model": name, "input": "hi"})
    assert (r.status_code, r.json(), r.headers["x-should-retry"]) == (424, {"error": error}, "false")
    # Streamed, the run finds the key missing after the stream opened: its error line says the same.
    r = agent_daemon.post("/v1/chat/completions", stream=True, json={
        "model": name, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    lines = [line for line in r.iter_lines(decode_unicode=True) if line.startswith("data:")]
    assert lines[-2:] == ["data: " + json.dumps({"error": error}, separators=(",", ":")), "data: [DONE]"]
    r = agent_daemon.post("/v1/responses", stream=True, json={"model": name, "input": "hi", "stream": True})
    events = [json.loads(line[5:]) for line in r.iter_lines(decode_unicode=True) if line.startswith("data:")]
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "provider_key_missing", "message": message}


def test_langchain_json_mode_and_sampling(agent_daemon, fake_llm) -> None:
    from langchain_openai import ChatOpenAI

    name, marker = agent(agent_daemon)
    llm = ChatOpenAI(model=f"agentd:{name}", base_url=f"{agent_daemon.url}/v1", api_key="unused",
                     max_retries=0, top_p=0.3, presence_penalty=0.5, seed=9, stop=["<end>"])
    structured = llm.with_structured_output(method="json_mode")
    parsed = structured.invoke(f'[[reply:{{"city": "Oslo", "days": 3}}]] {marker} answer in JSON')
    assert parsed == {"city": "Oslo", "days": 3}
    sent = upstream_request(fake_llm, marker)["json"]
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["top_p"] == 0.3 and sent["presence_penalty"] == 0.5 and sent["seed"] == 9
    assert sent["stop"] == ["<end>"]

    streamed = "".join(chunk.content for chunk in llm.stream(f"[[chunks:4]] {marker}-s"))
    assert streamed.split() == ["w1", "w2", "w3", "w4"]
    assert upstream_request(fake_llm, f"{marker}-s")["json"]["top_p"] == 0.3

    async def both() -> list[str]:
        return [m.content for m in await llm.abatch([f"{marker}-a1", f"{marker}-a2"])]

    assert asyncio.run(both()) == [f"echo: {marker}-a1", f"echo: {marker}-a2"]


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


@pytest.mark.parametrize("field, value, expected", [
    ("top_p", 0.5, GenerationParams(top_p=0.5)), ("stop", ["END"], GenerationParams(stop=["END"])),
    ("seed", 7, GenerationParams(seed=7)), ("presence_penalty", 0.4, GenerationParams(presence_penalty=0.4)),
    ("frequency_penalty", -0.3, GenerationParams(frequency_penalty=-0.3)),
    ("response_format", {"type": "json_object"}, GenerationParams(response_format={"type": "json_object"})),
    ("user", "u1", GenerationParams(user="u1")),
])
def test_each_generation_param_alone_is_read(field: str, value, expected: GenerationParams) -> None:
    # The request without any of them shares one value; each one alone must still get through.
    assert ro.generation_params({"model": "m", "messages": [], field: value}) == expected
    assert ro.generation_params({"model": "m", "messages": []}) is ro.generation_params({})


def test_a_request_without_options_drops_nothing_without_asking_the_catalog() -> None:
    class NoCatalog:  # (dropped_params must not look the provider up for the shared empty value)
        def __getattr__(self, name):
            raise AssertionError(f"catalog.{name} read for a request without options")

    handle = type("H", (), {"provider": "anthropic", "name": "a"})()
    app = Flask("t")
    app.extensions["agentd.kernel"] = type("K", (), {"catalog": NoCatalog()})()
    with app.app_context():
        assert ro.dropped_params(handle, ro.generation_params({})) == []


@pytest.mark.parametrize("data, refused", [
    ({"tools": [{"type": "function"}]}, "tools"), ({"tools": []}, None), ({"tools": None}, None),
    ({"functions": [{"name": "f"}]}, "functions"), ({"functions": []}, None),
    ({"tool_choice": "required"}, "tool_choice"), ({"tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tool_choice": "auto"}, None), ({"tool_choice": "none"}, None), ({"tool_choice": None}, None),
    ({"function_call": "f"}, "function_call"), ({"function_call": "auto"}, None), ({"function_call": "none"}, None),
    ({"logprobs": True}, "logprobs"), ({"logprobs": False}, None),
    ({"top_logprobs": 0}, "top_logprobs"), ({"top_logprobs": None}, None),
    ({"n": 2}, None), ({"n": 1}, None), ({"n": None}, None),
    ({"logit_bias": {"50256": -100}}, "logit_bias"), ({"logit_bias": {}}, None),
    ({"n": 1, "tools": [{}]}, "tools"),
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


@pytest.mark.parametrize("delta, finish", [
    ({"role": "assistant"}, None), ({"content": "h\u00e9llo \u2028 \"q\" \\ </script>"}, None), ({}, "stop"),
    ({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                      "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}, "tool_calls")])
def test_a_stream_chunk_is_the_whole_event_encoded_at_once(delta: dict, finish) -> None:
    from agentd.api.sse import format_event

    for name in ("plain", 'n\u00e4me "quoted"', "x" * 64):
        chunk = ro.chunk_format("chatcmpl-1", 1700000000, name)
        assert chunk(delta, finish) == format_event(None, {
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": name,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    assert ro.chunk_format("i", 2, "m")({}) == \
        'data: {"id":"i","object":"chat.completion.chunk","created":2,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":null}]}\n\n'


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
    ("rate_limit", 429, "upstream_rate_limited"), ("server", 503, "upstream_unavailable"),
    ("unreachable", 503, "upstream_unavailable"), ("timeout", 504, "upstream_timeout"),
    # A provider key the daemon lacks is a setting to make, named by the message.
    ("missing_key", 424, "provider_key_missing"),
    # An agent that failed is the spec's 500 server_error, with no code.
    ("auth", 500, None), ("bad_request", 500, None), ("not_found", 500, None), ("bad_response", 500, None), ("loop_guard", 500, None),
    ("reset", 500, None), ("truncated", 500, None), ("something_new", 500, None),
])
def test_run_failure_mapping(bare_app: Flask, kind: str, status: int, code: str | None) -> None:
    got_status, body, headers = failure(bare_app, AgentRunError("it broke", kind=kind))
    assert got_status == status, f"BUG: run failure {kind} answered {got_status}"
    assert body["error"]["message"] == "it broke" and body["error"].get("code") == code
    assert ("code" in body["error"]) == (code is not None), "BUG: a code-less error must leave `code` out"
    assert headers["x-should-retry"] == "false"
    # Every 429 says when to come back (the spec), 1 s when the cause named no delay.
    assert headers.get("Retry-After") == ("1" if status == 429 else None)


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
    assert (status, body["error"]["code"], headers["Retry-After"]) == (429, "quota_exceeded", "1")
    # A full queue and a database outage pass: the SDKs may retry them, after Retry-After.
    status, body, headers = failure(bare_app, TooManyRequests("agent queue full", retry_after=2, code="agent_busy"))
    assert (status, body["error"]["code"], headers["Retry-After"]) == (429, "agent_busy", "2")
    assert "x-should-retry" not in headers
    status, body, headers = failure(bare_app, DatabaseUnavailable("database unavailable"))
    assert (status, body["error"]["type"], headers["Retry-After"]) == (503, "server_error", "2")
    assert "x-should-retry" not in headers


# -- through the app ---------------------------------------------------------------------------------------------
# One kernel, app and test client for the module (and the session's fake LLM): a mutant's run of these tests
# takes seconds. Agents get their own names (`Env.spawn` numbers them); every test gives its stream slots back.
# The model's tool calls name `lookup`, a tool no agent has: the loop answers "permission denied" without running
# a tool. (A tool that runs goes to agents/loop.py's module-level thread pool, which a process forked after the pool
# had threads cannot use: mutmut forks every mutant's child from a process that ran the tests, and such a call
# then hangs until pytest-timeout fails the test, which mutmut counts as a kill.)

MAX_STREAMS = 2
KEEPALIVE_SECS = 1.0
UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


class Env:
    def __init__(self, kernel: Kernel, fake) -> None:
        self.kernel = kernel
        self.fake = fake
        self.app = create_app(kernel)
        self.client = self.app.test_client()
        self.slots = self.app.extensions["agentd.stream_slots"]
        self.count = 0

    def spawn(self, name: str, extra: str = "") -> tuple[str, str]:
        """A new agent `<name>-<n>`: (its name, its id)."""
        self.count += 1
        name = f"{name}-{self.count}"
        r = self.client.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n' + extra}, environ_base=LOCAL)
        assert r.status_code == 201, r.get_data(as_text=True)
        return name, r.get_json()["agent_id"]

    def chat(self, **data):
        return self.client.post("/v1/chat/completions", json=data, environ_base=LOCAL)

    def post(self, data, **kw):
        return self.client.post("/v1/chat/completions", data=data, environ_base=LOCAL, **kw)

    def stream_aside(self, model: str, text: str, environ: dict | None = None) -> "Aside":
        """A stream run on a thread of its own (the test client returns once it has ended)."""
        return Aside(lambda: self.client.post("/v1/chat/completions", json={
            "model": model, "stream": True, "messages": [{"role": "user", "content": text}]},
            environ_base={**LOCAL, **(environ or {})}))

    def held_stream(self, name: str, agent_id: str) -> "Aside":
        """A stream holding its slot (its run waits for the model) until `stop(...)`."""
        handle = self.kernel.agents.find(agent_id)
        before = self.slots.in_use
        aside = self.stream_aside(name, "[[slow:20]] [[reply:never]]")
        assert wait_for(lambda: handle.busy and self.slots.in_use > before), "the stream never started"
        return aside

    def stop(self, agent_id: str, aside: "Aside") -> str:
        """Stop the agent's run; what its stream sent."""
        assert self.kernel.agents.stop(self.kernel.agents.find(agent_id))
        return aside.result().get_data(as_text=True)

    def prompt_tokens(self) -> int:
        """The fake LLM's input count for its last request (words of every message text)."""
        words = 0
        for message in self.fake.requests[-1]["json"]["messages"]:
            content = message.get("content")
            if isinstance(content, str):
                words += len(content.split())
            elif isinstance(content, list):
                words += sum(len(p.get("text", "").split()) for p in content if p.get("type") == "text")
        return max(1, words)


class Aside:
    """`call()` on a thread; `result()` waits for what it returned."""

    def __init__(self, call) -> None:
        self._out: list = []
        self._thread = threading.Thread(target=lambda: self._out.append(call()), daemon=True)
        self._thread.start()

    def result(self, secs: float = 15.0):
        self._thread.join(secs)
        assert self._out, "BUG: the stream did not end"
        return self._out[0]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Env]:
    tmp_path = tmp_path_factory.mktemp("openai")
    patch = pytest.MonkeyPatch()
    patch.setenv("OPENAI_API_KEY", "test-openai")
    patch.setenv("ANTHROPIC_API_KEY", "test-anthropic")
    data = {"api": {"rate_limit_per_second": 10000, "rate_limit_burst": 10000, "max_streams": MAX_STREAMS,
                    "sse_keepalive_secs": KEEPALIVE_SECS},
            "llm": {"timeout_secs": 10, "retries": 1},
            "default_model": {"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
            "provider_urls": {"openai": fake_llm.openai_base, "anthropic": fake_llm.anthropic_base}}
    kernel = Kernel.open(parse_config(with_test_db(data, tmp_path), tmp_path))
    yield Env(kernel, fake_llm)
    kernel.close()
    patch.undo()


@pytest.fixture(autouse=True)
def _slots_given_back(request) -> Iterator[None]:
    """Every test of the app leaves all stream slots free (a leaked slot would show in the next test too)."""
    yield
    if "env" in request.fixturenames:
        env = request.getfixturevalue("env")
        taken = [env.slots.acquire(blocking=False) for _ in range(MAX_STREAMS)]
        for got in taken:
            if got:
                env.slots.release()
        assert all(taken), "BUG: a stream slot was not given back"


def error_body(message: str, code: str | None, type_: str = "invalid_request_error") -> dict:
    """The OpenAI-style error; `code` is left out when there is none (never null)."""
    error = {"message": message, "type": type_}
    if code is not None:
        error["code"] = code
    return {"error": error}


def without_keepalives(text: str) -> str:
    return text.replace(": keep-alive\n\n", "")


def sse(r) -> list:
    events = []
    for block in without_keepalives(r.get_data(as_text=True)).split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def frame(data) -> str:
    return "data: " + json.dumps(data, separators=(",", ":")) + "\n\n"


def chunk_frame(completion_id: str, created: int, model: str, delta: dict, finish=None) -> str:
    return frame({"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                  "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def test_answer_is_exact(env: Env) -> None:
    name, _ = env.spawn("exact")
    before = int(time.time())
    r = env.chat(model=f"agentd:{name}", messages=[{"role": "user", "content": "[[reply:hello there]]"}])
    after = int(time.time())
    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.mimetype == "application/json"
    body = r.get_json()
    assert re.fullmatch(f"chatcmpl-{UUID4}", body["id"]), body["id"]
    assert type(body["created"]) is int and before <= body["created"] <= after, "BUG: created is not the request time"
    prompt = env.prompt_tokens()
    assert body == {
        "id": body["id"], "created": body["created"], "object": "chat.completion", "model": name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello there"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 2, "total_tokens": prompt + 2}}
    assert list(body["usage"]) == ["prompt_tokens", "completion_tokens", "total_tokens"]
    assert ro.DROPPED_HEADER not in r.headers and "x-should-retry" not in r.headers
    second = env.chat(model=name, messages=[{"role": "user", "content": "[[reply:again]]"}]).get_json()
    assert second["id"] != body["id"], "BUG: two answers share a completion id"


def test_length_finish_reason_and_tool_calls_only_when_cut_off(env: Env) -> None:
    name, _ = env.spawn("length")
    r = env.chat(model=name, messages=[{"role": "user", "content": "[[length]] [[reply:a b c d]]"}])
    assert r.get_json()["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "a b"},
                                        "finish_reason": "length"}]
    # A run that called a tool and then answered: a plain answer, no tool_calls in the message.
    r = env.chat(model=name, messages=[{"role": "user", "content": '[[tool:lookup {"q": 1}]]'}])
    assert r.get_json()["choices"][0]["finish_reason"] == "stop"
    assert r.get_json()["choices"][0]["message"]["content"] == \
        "tool said: permission denied: tool 'lookup' is not available to this agent"
    assert set(r.get_json()["choices"][0]["message"]) == {"role", "content"}, \
        "BUG: tool_calls shown for a run that answered"


def test_answer_cut_off_while_calling_tools(env: Env) -> None:
    name, _ = env.spawn("cutoff", "[resources]\nmax_iterations = 1\n")
    r = env.chat(model=name, messages=[{"role": "user",
                                        "content": '[[tools:lookup {"a": 1, "b": "é"} | lookup]]'}])
    assert r.status_code == 200, r.get_data(as_text=True)
    choice = r.get_json()["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert [c["id"][:5] for c in calls] == ["call_", "call_"] and calls[0]["id"] != calls[1]["id"]
    assert choice == {"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "[stopped after 1 iterations: the agent was still calling tools]",
        "tool_calls": [{"id": calls[0]["id"], "type": "function",
                        "function": {"name": "lookup", "arguments": '{"a": 1, "b": "\\u00e9"}'}},
                       {"id": calls[1]["id"], "type": "function",
                        "function": {"name": "lookup", "arguments": "{}"}}]}}


def test_model_lookup(env: Env) -> None:
    name, agent_id = env.spawn("lookme")
    for model in (f"agentd:{name}", agent_id, name):
        r = env.chat(model=model, messages=[{"role": "user", "content": "[[reply:ok]]"}])
        assert r.status_code == 200 and r.get_json()["model"] == name, f"model {model!r} not resolved"
    for model in (f"agentd:{name[:-1]}", f"agentd:{name}2", name[:-1], "agentd:", "", f"AGENTD:{name}",
                  f"agentd:agentd:{name}", f"agentd:{agent_id}", agent_id[:-1], f"gentd:{name}"):
        r = env.chat(model=model, messages=[{"role": "user", "content": "hi"}])
        assert r.status_code == 404, f"BUG: near-miss model {model!r} resolved"
        assert r.get_json() == error_body(f"no agent found for model '{model}'", "model_not_found")
        assert "x-should-retry" not in r.headers
    assert env.client.delete(f"/api/agents/{agent_id}", environ_base=LOCAL).status_code in (200, 204)
    for model in (f"agentd:{name}", agent_id):
        r = env.chat(model=model, messages=[{"role": "user", "content": "hi"}])
        assert r.status_code == 404, "BUG: a killed agent still answers as a model"


def test_resolve_agent_refuses_a_killed_handle(env: Env) -> None:
    """A handle still listed but already marked killed (a kill in progress) is not a model."""
    name, agent_id = env.spawn("dying")
    handle = env.kernel.agents.find(agent_id)
    with env.client.application.app_context():
        assert ro.resolve_agent(f"agentd:{name}") is handle
        handle.killed = True
        try:
            for model in (f"agentd:{name}", agent_id, name):
                with pytest.raises(ro.ModelNotFound) as info:
                    ro.resolve_agent(model)
                assert (info.value.message, info.value.code, info.value.status) == \
                    (f"no agent found for model '{model}'", "model_not_found", 404)
        finally:
            handle.killed = False


def test_system_messages_and_last_user_message(env: Env) -> None:
    name, _ = env.spawn("sys")
    messages = [{"role": "system", "content": "rule one"}, {"role": "user", "content": "first [[reply:no]]"},
                {"role": "assistant", "content": "x"}, {"role": "developer", "content": "  "},
                {"role": "developer", "content": [{"type": "text", "text": "rule two"}]},
                {"role": "tool", "content": "ignored"},
                {"role": "user", "content": "[[echo_params]]"}]
    r = env.chat(model=name, messages=messages, max_completion_tokens=33)
    echoed = json.loads(r.get_json()["choices"][0]["message"]["content"])
    assert (echoed["max_tokens"], echoed["temperature"], echoed["n_images"]) == (33, 0.7, 0), "the agent's own temperature when none is given"
    assert echoed["system"].endswith("\n\nrule one\n\nrule two"), echoed["system"]
    assert "ignored" not in echoed["system"] and "first" not in echoed["system"]
    sent = env.fake.requests[-1]["json"]["messages"]
    assert [m["content"] for m in sent if m["role"] == "user"][-1] == "[[echo_params]]", \
        "BUG: not the last user message was sent"
    r = env.chat(model=name, messages=[{"role": "user", "content": "[[echo_params]]"}], max_tokens=12,
                 max_completion_tokens=40, temperature=0.25)
    echoed = json.loads(r.get_json()["choices"][0]["message"]["content"])
    assert (echoed["max_tokens"], echoed["temperature"]) == (12, 0.25)
    r = env.chat(model=name, messages=[{"role": "user", "content": "[[echo_params]]"}])
    plain = json.loads(r.get_json()["choices"][0]["message"]["content"])["system"]
    assert not plain.endswith("rule two") and "\n\n\n" not in plain, "BUG: extra instructions outlived their run"


def test_user_parts_reach_the_model(env: Env) -> None:
    name, _ = env.spawn("parts")
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    r = env.chat(model=name, messages=[{"role": "user", "content": [{"type": "text", "text": "[[echo_params]]"},
                                                                    image, image]}])
    assert json.loads(r.get_json()["choices"][0]["message"]["content"])["n_images"] == 2
    r = env.chat(model=name, messages=[{"role": "user", "content": [image]}, {"role": "assistant", "content": None}])
    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.get_json()["choices"][0]["message"]["content"] == "echo: (image)"


@pytest.mark.parametrize("messages", [
    [],
    [{"role": "system", "content": "only rules"}],
    [{"role": "user", "content": "   "}],
    [{"role": "user", "content": " \n\t"}],
    [{"role": "user", "content": None}],
    [{"role": "user", "content": []}],
    [{"role": "assistant", "content": "hi"}],
    [{"role": "user", "content": "hi"}, {"role": "user", "content": ""}],
])
def test_no_user_message(env: Env, messages) -> None:
    name, _ = env.spawn("nouser")
    r = env.chat(model=name, messages=messages)
    assert (r.status_code, r.get_json()) == (400, error_body("no user message found in request", "missing_message"))


def test_size_limit(env: Env) -> None:
    name, _ = env.spawn("size")
    r = env.chat(model=name, messages=[{"role": "user", "content": "é" * 32768 + "a"}])
    assert (r.status_code, r.get_json()) == (413, error_body("message too large (max 64 KB)", None))
    exact = "[[reply:k]]" + "a" + "é" * ((65536 - 12) // 2)
    assert len(exact.encode("utf-8")) == 65536
    r = env.chat(model=name, messages=[{"role": "user", "content": exact}])
    assert r.status_code == 200, "BUG: a message of exactly 64 KiB (UTF-8) was refused"
    r = env.chat(model=name, messages=[{"role": "user", "content": [{"type": "text", "text": "a" * 65536},
                                                                    {"type": "text", "text": ""}]}])
    assert r.status_code == 413, "BUG: joined text parts past 64 KiB were accepted"


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("data, message", [
    ({"messages": HI}, "invalid request: model: Missing data for required field."),
    ({"model": 5, "messages": HI}, "invalid request: model: Not a valid string."),
    ({"model": "x"}, "invalid request: messages: Missing data for required field."),
    ({"model": "x", "messages": "hi"}, "invalid request: messages: Not a valid list."),
    ({"model": "x", "messages": HI, "stream": "yes"}, "invalid request: stream: Not a valid boolean."),
    ({"model": "x", "messages": HI, "temperature": 2.5},
     "invalid request: temperature: Must be greater than or equal to 0.0 and less than or equal to 2.0."),
    ({"model": "x", "messages": HI, "stream_options": []}, "invalid request: stream_options: Not a valid mapping type."),
])
def test_bad_requests(env: Env, data, message) -> None:
    r = env.chat(**data)
    assert (r.status_code, r.get_json()) == (400, error_body(message, None))


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": 5}], "messages[0].content must be a string or an array of parts"),
    ([{"role": "system", "content": "a"}, {"role": "user", "content": ["x"]}], "messages[1].content[0] must be an object"),
    ([{"role": "assistant", "content": {"a": 1}}, {"role": "user", "content": "hi"}],
     "messages[0].content must be a string or an array of parts"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}],
     "messages[0].content[0]: only base64 data URIs (data:image/<type>;base64,...) are supported; "
     "image URLs are not fetched"),
])
def test_bad_content_through_the_app(env: Env, messages, message) -> None:
    name, _ = env.spawn("content")
    r = env.chat(model=name, messages=messages)
    assert (r.status_code, r.get_json()) == (400, error_body(message, None))
    assert "x-should-retry" not in r.headers


def test_bad_bodies_and_refused_parameters(env: Env) -> None:
    r = env.post("not json", content_type="application/json")
    assert (r.status_code, r.get_json()) == (400, error_body("malformed JSON: Expecting value at line 1 column 1", None))
    r = env.post(json.dumps([1]), content_type="application/json")
    assert (r.status_code, r.get_json()) == (400, error_body("request body must be a JSON object, got list", None))
    for key, value in (("tools", [{"type": "function"}]), ("logprobs", True), ("tool_choice", "required")):
        r = env.chat(model="nobody", messages=[{"role": "user", "content": "hi"}], **{key: value})
        assert (r.status_code, r.get_json()) == (400, error_body(
            f"unsupported parameter '{key}': agentd agents choose their own tools and answer with one choice; "
            "remove it from the request", None)), "BUG: a refused parameter reached the schema or the lookup"
    r = env.chat(model="nobody", messages=[{"role": "user", "content": "hi"}], n=1, tools=[], tool_choice="auto")
    assert (r.status_code, r.get_json()["error"]["code"]) == (404, "model_not_found")


def test_dropped_parameters_header(env: Env, caplog) -> None:
    name, _ = env.spawn("claude", '[model]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-6"\n')
    caplog.set_level(logging.INFO, logger="agentd.api")
    r = env.chat(model=name, messages=[{"role": "user", "content": "[[reply:ok]]"}], seed=1,
                 presence_penalty=0.5, frequency_penalty=0.2, top_p=0.5)
    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.headers[ro.DROPPED_HEADER] == "seed, presence_penalty, frequency_penalty"
    assert [rec.getMessage() for rec in caplog.records if rec.name == "agentd.api"] == [
        f"agent {name}: anthropic has no equivalent for seed, presence_penalty, frequency_penalty; dropped"]
    caplog.clear()
    r = env.chat(model=name, messages=[{"role": "user", "content": "[[reply:ok]]"}], seed=3, stream=True)
    assert r.headers[ro.DROPPED_HEADER] == "seed", "BUG: a stream does not name the dropped parameters"
    assert sse(r)[-1] == "[DONE]"
    r = env.chat(model=name, messages=[{"role": "user", "content": "[[reply:ok]]"}], top_p=0.5, user="u")
    assert ro.DROPPED_HEADER not in r.headers
    assert not [rec for rec in caplog.records if rec.name == "agentd.api" and "dropped" in rec.getMessage()][1:]
    other, _ = env.spawn("gpt")
    r = env.chat(model=other, messages=[{"role": "user", "content": "[[reply:ok]]"}], seed=1, presence_penalty=0.5)
    assert ro.DROPPED_HEADER not in r.headers
    # A provider the catalog does not know (its own base_url) speaks the OpenAI format: nothing dropped.
    custom, _ = env.spawn("custom", f'[model]\nprovider = "localai"\nmodel = "m1"\nbase_url = "{env.fake.openai_base}"\n')
    r = env.chat(model=custom, messages=[{"role": "user", "content": "[[reply:ok]]"}], seed=1, presence_penalty=0.5,
                 user="u")
    assert (r.status_code, r.get_json()["choices"][0]["message"]["content"]) == (200, "ok"), r.get_data(as_text=True)
    assert ro.DROPPED_HEADER not in r.headers
    assert env.fake.requests[-1]["json"]["seed"] == 1


def test_stream_is_exact(env: Env) -> None:
    name, _ = env.spawn("streamer")
    before = int(time.time())
    r = env.chat(model=f"agentd:{name}", messages=[{"role": "user", "content": "[[reply:one two]]"}],
                 stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200 and r.mimetype == "text/event-stream"
    text = without_keepalives(r.get_data(as_text=True))
    first = json.loads(text.split("\n\n")[1][len("data: "):])
    completion_id, created = first["id"], first["created"]
    assert re.fullmatch(f"chatcmpl-{UUID4}", completion_id), completion_id
    assert type(created) is int and before <= created <= int(time.time())
    prompt = env.prompt_tokens()
    assert text == (": stream open\n\n"
                    + chunk_frame(completion_id, created, name, {"role": "assistant"})
                    + chunk_frame(completion_id, created, name, {"content": "one"})
                    + chunk_frame(completion_id, created, name, {"content": " two"})
                    + chunk_frame(completion_id, created, name, {}, "stop")
                    + frame({"id": completion_id, "object": "chat.completion.chunk", "created": created,
                             "model": name, "choices": [],
                             "usage": {"prompt_tokens": prompt, "completion_tokens": 2, "total_tokens": prompt + 2}})
                    + "data: [DONE]\n\n")


def test_stream_passes_the_run_options(env: Env) -> None:
    name, _ = env.spawn("sopts")
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    r = env.chat(model=name, stream=True, max_tokens=21, temperature=0.5, messages=[
        {"role": "developer", "content": "stream rule"},
        {"role": "user", "content": [{"type": "text", "text": "[[echo_params]]"}, image]}])
    echoed = json.loads("".join(e["choices"][0]["delta"].get("content", "") for e in sse(r)[1:-1]))
    assert (echoed["max_tokens"], echoed["temperature"], echoed["n_images"]) == (21, 0.5, 1), \
        "BUG: a stream's run lost the request's options"
    assert echoed["system"].endswith("\n\nstream rule")


@pytest.mark.parametrize("options", [None, {}, {"include_usage": False}, {"include_usage": None},
                                     {"include_usage_": True}])
def test_stream_without_usage(env: Env, options) -> None:
    name, _ = env.spawn("nousage")
    r = env.chat(model=name, messages=[{"role": "user", "content": "[[reply:x]]"}], stream=True,
                 stream_options=options)
    events = sse(r)
    assert events[-1] == "[DONE]" and events[-2]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    assert len(events) == 4 and all("usage" not in e for e in events[:-1]), "BUG: a usage chunk nobody asked for"


def test_stream_null_is_the_default(env: Env) -> None:
    """`stream: null` means what leaving it out means (OpenAI takes null for false)."""
    name, _ = env.spawn("snull")
    r = env.chat(model=name, messages=[{"role": "user", "content": "[[reply:plain]]"}], stream=None)
    assert r.status_code == 200 and r.mimetype == "application/json"
    assert r.get_json()["choices"][0]["message"] == {"role": "assistant", "content": "plain"}


def test_stream_length_finish(env: Env) -> None:
    name, _ = env.spawn("slen")
    events = sse(env.chat(model=name, messages=[{"role": "user", "content": "[[length]] [[reply:a b c d]]"}],
                          stream=True, stream_options={"include_usage": True}))
    assert events[-3]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "length"}]
    assert events[-2]["usage"]["completion_tokens"] == 2


def test_stream_keepalive(env: Env) -> None:
    name, _ = env.spawn("quiet")
    r = env.chat(model=name, messages=[{"role": "user", "content": f"[[slow:{KEEPALIVE_SECS * 2.5}]] [[reply:late]]"}],
                 stream=True)
    text = r.get_data(as_text=True)
    head, _, rest = text.partition(": keep-alive\n\n")
    assert rest, "BUG: no keep-alive while the model was quiet"
    assert head.startswith(": stream open\n\ndata: ") and head.count("data: ") == 1, "the role chunk comes first"
    events = sse(r)
    assert [e["choices"][0]["delta"] for e in events[1:-2]] == [{"content": "late"}], \
        "BUG: the stream did not go on after a keep-alive"
    assert events[-1] == "[DONE]"


def test_stream_error_event(env: Env) -> None:
    name, _ = env.spawn("failing")
    r = env.chat(model=name, messages=[{"role": "user", "content": "[[fail:400]]"}])
    plain = r.get_json()
    assert (r.status_code, plain["error"]["type"], "code" in plain["error"], r.headers["x-should-retry"]) == \
        (500, "server_error", False, "false")
    r = env.chat(model=name, messages=[{"role": "user", "content": "[[fail:400]]"}], stream=True,
                 stream_options={"include_usage": True})
    assert r.status_code == 200
    text = without_keepalives(r.get_data(as_text=True))
    # The same type and code the unstreamed answer carries (its 500 status line cannot be sent).
    assert text.endswith("\n\n" + frame({"error": {"message": plain["error"]["message"], "type": "server_error"}})
                         + "data: [DONE]\n\n"), text
    assert len(sse(r)) == 3, "only the role chunk, the error and [DONE]"


@pytest.mark.parametrize("text, error", [
    ("[[fail:429]]", {"type": "rate_limit_error", "code": "upstream_rate_limited"}),
    ("[[fail:503]]", {"type": "server_error", "code": "upstream_unavailable"}),
    ("[[fail:401]]", {"type": "server_error", "code": None}),
])
def test_stream_errors_are_mapped_like_unstreamed_ones(env: Env, text: str, error: dict) -> None:
    name, _ = env.spawn(f"mapped-{text[7:10]}")
    r = env.chat(model=name, messages=[{"role": "user", "content": text}], stream=True)
    errors = [json.loads(b[len("data: "):])["error"] for b in without_keepalives(r.get_data(as_text=True)).split("\n\n")
              if b.startswith('data: {"error"')]
    assert len(errors) == 1 and {k: errors[0].get(k) for k in ("type", "code")} == error



@pytest.mark.parametrize("text, last", [
    ("[[reply:one]]", '"finish_reason":"stop"}]}'),
    ("[[fail:400]]", '"type":"server_error"}}'),
    ("[[slow:5]] late", '"type":"invalid_request_error","code":"run_cancelled"}}'),
])
def test_written_stream_ends_with_one_done_marker(env: Env, text: str, last: str) -> None:
    """In the daemon a stream is written in place (api/streaming.py): its final event, whether
    the run finished, failed or was stopped, is what closes it with `[DONE]`."""
    name, agent_id = env.spawn("written")
    if text.startswith("[[slow"):
        threading.Timer(0.5, env.kernel.agents.stop, [env.kernel.agents.get(agent_id)]).start()
    r = env.client.post("/v1/chat/completions", json={"model": name, "stream": True,
                                                      "messages": [{"role": "user", "content": text}]},
                        environ_base=LOCAL)
    assert r.status_code == 200
    frames = without_keepalives(r.get_data(as_text=True)).split("\n\n")
    assert frames[-3:] == [frames[-3], "data: [DONE]", ""] and frames[-3].endswith(last), frames
    assert frames.count("data: [DONE]") == 1


def test_stream_tool_calls_are_forwarded(env: Env) -> None:
    name, _ = env.spawn("tooler")
    r = env.chat(model=name, messages=[{"role": "user", "content": '[[tools:lookup {"a": 1} | lookup]]'}],
                 stream=True)
    events = sse(r)
    completion_id, created = events[0]["id"], events[0]["created"]
    deltas = [e["choices"][0]["delta"] for e in events[1:-2]]
    starts = [d["tool_calls"][0] for d in deltas if "tool_calls" in d and "id" in d["tool_calls"][0]]
    assert [s["id"][:5] for s in starts] == ["call_", "call_"], deltas
    assert starts == [{"index": 0, "id": starts[0]["id"], "type": "function",
                       "function": {"name": "lookup", "arguments": ""}},
                      {"index": 1, "id": starts[1]["id"], "type": "function",
                       "function": {"name": "lookup", "arguments": ""}}]
    args: dict[int, str] = {0: "", 1: ""}
    for d in deltas:
        if "tool_calls" in d and "id" not in d["tool_calls"][0]:
            call = d["tool_calls"][0]
            assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
            args[call["index"]] += call["function"]["arguments"]
    assert (json.loads(args[0]), json.loads(args[1] or "{}")) == ({"a": 1}, {})
    for e in events[:-1]:
        assert (e["id"], e["object"], e["created"], e["model"]) == (completion_id, "chat.completion.chunk", created,
                                                                    name)
    text = "".join(d.get("content", "") for d in deltas)
    assert text == "tool said: permission denied: tool 'lookup' is not available to this agent", text
    assert events[-2]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]


@pytest.mark.parametrize("extra, text, said", [
    ("", '[[think:calls]] [[tool:lookup {"q": 1}]]',
     "calling a tool\n\ntool said: permission denied: tool 'lookup' is not available to this agent"),
    ("[resources]\nmax_iterations = 2\n", '[[think:calls]] [[tool:lookup {"q": 1} x100]]',
     "calling a tool\n\ncalling a tool\n\n[stopped after 2 iterations: the agent was still calling tools]"),
])
def test_the_streamed_text_is_the_unstreamed_content(env: Env, extra: str, text: str, said: str) -> None:
    """What a run said in the turns that called tools, and the text of a run stopped at its
    iteration limit, are in both: a client joining the deltas reads the plain answer's content."""
    name, _ = env.spawn("said", extra)
    r = env.chat(model=name, messages=[{"role": "user", "content": text}])
    assert r.get_json()["choices"][0]["message"]["content"] == said
    events = sse(env.chat(model=name, messages=[{"role": "user", "content": text}], stream=True))
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == said


def test_stream_stopped(env: Env) -> None:
    name, agent_id = env.spawn("stopme")
    aside = env.stream_aside(name, "[[slow:20]] [[reply:never]]")
    deadline = time.monotonic() + 15
    while True:
        stop = env.client.post(f"/api/agents/{agent_id}/stop", environ_base=LOCAL).get_json()
        if stop["was_running"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert stop["was_running"]
    r = aside.result()
    text = without_keepalives(r.get_data(as_text=True))
    assert text.startswith(": stream open\n\n")
    data = [json.loads(b[len("data: "):]) for b in text.split("\n\n") if b.startswith("data: {")]
    # A stopped run is no finished answer (unstreamed it is a 409): an error line, no `finish_reason: stop`.
    assert data[0]["choices"] == [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]
    assert data[1:] == [{"error": {"message": "the run was stopped before the agent answered",
                                   "type": "invalid_request_error", "code": "run_cancelled"}}]
    assert text.endswith("data: [DONE]\n\n")


def wait_for(check, secs: float = 10.0) -> bool:
    deadline = time.monotonic() + secs
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


def test_a_stream_whose_client_left_stops_its_run(env: Env) -> None:
    name, agent_id = env.spawn("leaver")
    handle = env.kernel.agents.find(agent_id)
    gone = threading.Event()
    aside = env.stream_aside(name, "[[slow:20]] [[reply:never]]", {"waitress.client_disconnected": gone.is_set})
    assert wait_for(lambda: handle.busy), "the run never started"
    gone.set()
    # (5 s: well before the call's own 10 s timeout would end it anyway)
    assert wait_for(lambda: not handle.busy, 5.0), "BUG: the run of a stream its client left went on"
    assert "[[reply:never]]" not in aside.result().get_data(as_text=True)


def test_stream_slots(env: Env) -> None:
    agents = [env.spawn("slots") for _ in range(MAX_STREAMS)]
    name = agents[0][0]
    held = [env.held_stream(*agent) for agent in agents]
    try:
        r = env.chat(model=name, messages=[{"role": "user", "content": "hi"}], stream=True)
        assert (r.status_code, r.get_json(), r.headers["Retry-After"]) == \
            (503, error_body("too many concurrent streams; try again shortly", None, "server_error"), "1")
        assert "x-should-retry" not in r.headers
        r = env.chat(model=name, messages=[{"role": "user", "content": "hi"}])
        assert (r.status_code, r.get_json()) == \
            (503, error_body("server busy: too many requests are waiting for agents; try again shortly", None,
                             "server_error"))
    finally:
        for (_, agent_id), aside in zip(agents, held):
            env.stop(agent_id, aside)
    # Ended streams gave their slots back: as many streams as the cap fit again.
    held = [env.held_stream(*agent) for agent in agents]
    for (_, agent_id), aside in zip(agents, held):
        env.stop(agent_id, aside)


def test_quota_refusal(env: Env) -> None:
    name, _ = env.spawn("quota", "[resources]\nmax_llm_tokens_per_hour = 1\n")
    r = env.chat(model=name, messages=[{"role": "user", "content": "[[reply:one two three]]"}])
    used = r.get_json()["usage"]["total_tokens"]
    message = (f"message delivery failed: quota exceeded: {used} of 1 LLM tokens used in the last hour "
               "(max_llm_tokens_per_hour)")
    for stream in (False, True, True, True):
        r = env.chat(model=name, messages=[{"role": "user", "content": "[[reply:x]]"}], stream=stream)
        assert (r.status_code, r.get_json()) == (429, error_body(message, "quota_exceeded", "rate_limit_error"))
        assert r.headers["x-should-retry"] == "false" and 3000 <= int(r.headers["Retry-After"]) <= 3601
    # three refused streams later every slot is free (checked by _slots_given_back as well)


def test_budget_refusal(env: Env) -> None:
    name, _ = env.spawn("budget")
    env.chat(model=name, messages=[{"role": "user", "content": "[[reply:spend]]"}])
    metering = env.kernel.metering
    metering.set_limit(1e-9)
    try:
        with pytest.raises(TooManyRequests) as expected:
            metering.check_budget()
        for stream in (False, True):
            r = env.chat(model=name, messages=[{"role": "user", "content": "[[reply:x]]"}], stream=stream)
            assert (r.status_code, r.get_json()) == (429, error_body(expected.value.message, "budget_exceeded",
                                                                     "rate_limit_error"))
            assert r.headers["x-should-retry"] == "false" and int(r.headers["Retry-After"]) >= 1
    finally:
        metering.set_limit(0)
    assert env.chat(model=name, messages=[{"role": "user", "content": "[[reply:x]]"}]).status_code == 200


def test_models_list(env: Env) -> None:
    name, _ = env.spawn("listed")
    body = env.client.get("/v1/models", environ_base=LOCAL).get_json()
    assert body["object"] == "list"
    entry = [m for m in body["data"] if m["id"] == f"agentd:{name}"]
    assert len(entry) == 1 and entry[0]["object"] == "model" and entry[0]["owned_by"] == "agentd"
