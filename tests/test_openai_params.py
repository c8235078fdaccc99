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

from test_agents import spawn

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


def test_client_tools_and_other_refusals_stay(agent_daemon, oa) -> None:
    name, _ = agent(agent_daemon)
    refused = [({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "'tools'"),
               ({"tool_choice": "required"}, "'tool_choice'"), ({"n": 3}, "'n'"), ({"logprobs": True}, "'logprobs'"),
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
