"""POST /v1/responses and GET /v1/responses/{id} against the real daemon, driven with the
official `openai` SDK (create, the streaming helper, stream=True, retrieve) and the OpenAI
Agents SDK's default Responses model; the fake LLM records what reached the provider."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter

import openai
import pytest
import requests

from support import db_rows
from tests.agents.test_agents import spawn
from tests.memory.test_races import _together


@pytest.fixture(scope="module")
def oa(agent_daemon):
    return openai.OpenAI(base_url=f"{agent_daemon.url}/v1", api_key="unused", max_retries=0)


def agent(d) -> str:
    name = f"r-{uuid.uuid4().hex[:8]}"
    spawn(d, name)
    return name


def upstream(fake, marker: str) -> dict:
    for entry in reversed(fake.requests):
        if marker in json.dumps(entry.get("json") or {}):
            return entry["json"]
    raise AssertionError(f"no upstream request mentions {marker}")


def test_create_and_retrieve(agent_daemon, oa) -> None:
    name = agent(agent_daemon)
    response = oa.responses.create(model=f"agentd:{name}", input="hello there")
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.error is None
    assert response.model == name and response.store is True
    assert response.output_text == "echo: hello there"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert [(p.type, p.text) for p in message.content] == [("output_text", "echo: hello there")]
    usage = response.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    again = oa.responses.retrieve(response.id)
    assert again.model_dump() == response.model_dump()


def test_delete_forgets_a_stored_response(agent_daemon, oa) -> None:
    name = agent(agent_daemon)
    kept = oa.responses.create(model=f"agentd:{name}", input="keep")
    gone = oa.responses.create(model=f"agentd:{name}", input="forget")
    r = requests.delete(f"{agent_daemon.url}/v1/responses/{gone.id}", timeout=30)
    assert r.status_code == 200 and r.json() == {"id": gone.id, "object": "response.deleted", "deleted": True}
    for method in ("GET", "DELETE"):
        r = requests.request(method, f"{agent_daemon.url}/v1/responses/{gone.id}", timeout=30)
        assert r.status_code == 404, r.text
        assert r.json() == {"error": {"message": f"no stored response with id '{gone.id}'",
                                      "type": "invalid_request_error", "code": "response_not_found"}}
    with pytest.raises(openai.NotFoundError):
        oa.responses.create(model=f"agentd:{name}", input="x", previous_response_id=gone.id)
    oa.responses.delete(kept.id)  # the SDK's own call
    with pytest.raises(openai.NotFoundError):
        oa.responses.retrieve(kept.id)


def test_a_killed_agents_responses_go_with_it(agent_daemon, oa) -> None:
    name = f"r-{uuid.uuid4().hex[:8]}"
    agent_id = spawn(agent_daemon, name)
    response = oa.responses.create(model=f"agentd:{name}", input="soon gone")
    assert agent_daemon.delete(f"/api/agents/{agent_id}").status_code == 200
    with pytest.raises(openai.NotFoundError):
        oa.responses.retrieve(response.id)


def test_store_false_is_not_kept(agent_daemon, oa) -> None:
    name = agent(agent_daemon)
    response = oa.responses.create(model=f"agentd:{name}", input="ephemeral", store=False)
    assert response.store is False and response.output_text == "echo: ephemeral"
    with pytest.raises(openai.NotFoundError) as err:
        oa.responses.retrieve(response.id)
    assert err.value.status_code == 404
    assert err.value.body["message"] == f"no stored response with id '{response.id}'"


def test_previous_response_continues_the_agents_session(agent_daemon, fake_llm, oa) -> None:
    name = agent(agent_daemon)
    marker = uuid.uuid4().hex[:10]
    first = oa.responses.create(model=f"agentd:{name}", input=f"first {marker}")
    second = oa.responses.create(model=f"agentd:{name}", input=f"second {marker}",
                                 previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.output_text == f"echo: second {marker}"
    sent = upstream(fake_llm, f"second {marker}")["messages"]
    said = [(m["role"], m["content"]) for m in sent if m["role"] != "system"]
    assert said == [("user", f"first {marker}"), ("assistant", f"echo: first {marker}"),
                    ("user", f"second {marker}")]
    with pytest.raises(openai.NotFoundError) as err:
        oa.responses.create(model=f"agentd:{name}", input="x", previous_response_id="resp_nope")
    assert err.value.code == "previous_response_not_found"
    other = agent(agent_daemon)
    with pytest.raises(openai.BadRequestError) as err:
        oa.responses.create(model=f"agentd:{other}", input="x", previous_response_id=first.id)
    assert err.value.code == "previous_response_mismatch"


def test_message_items_and_instructions(agent_daemon, fake_llm, oa) -> None:
    name = agent(agent_daemon)
    response = oa.responses.create(
        model=f"agentd:{name}", instructions="Answer briefly.",
        input=[{"role": "developer", "content": "Be kind."},
               {"role": "user", "content": "older question"},
               {"role": "assistant", "content": [{"type": "output_text", "text": "older answer"}]},
               {"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "[[echo_params]]"}, {"type": "input_text", "text": "now"}]}])
    echoed = json.loads(response.output_text)
    assert echoed["system"].endswith("Answer briefly.\n\nBe kind.")
    assert echoed["n_images"] == 0 and response.instructions == "Answer briefly."


def test_sampling_and_format_reach_the_model(agent_daemon, fake_llm, oa) -> None:
    name = agent(agent_daemon)
    marker = uuid.uuid4().hex[:10]
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    response = oa.responses.create(
        model=f"agentd:{name}", input=f'[[reply:{{"ok": true}}]] {marker}', temperature=0.3, top_p=0.5,
        max_output_tokens=77, user="user-9",
        text={"format": {"type": "json_schema", "name": "verdict", "schema": schema, "strict": True}})
    sent = upstream(fake_llm, marker)
    assert sent["temperature"] == 0.3 and sent["top_p"] == 0.5 and sent["max_tokens"] == 77
    assert sent["user"] == "user-9"
    assert sent["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "verdict", "schema": schema, "strict": True}}
    assert json.loads(response.output_text) == {"ok": True}
    assert response.text.format.type == "json_schema" and response.temperature == 0.3
    marker = uuid.uuid4().hex[:10]
    oa.responses.create(model=f"agentd:{name}", input=marker, text={"format": {"type": "json_object"}})
    assert upstream(fake_llm, marker)["response_format"] == {"type": "json_object"}
    marker = uuid.uuid4().hex[:10]
    oa.responses.create(model=f"agentd:{name}", input=marker, text={"format": {"type": "text"}})
    assert "response_format" not in upstream(fake_llm, marker)


def test_cut_off_answer_is_incomplete(agent_daemon, oa) -> None:
    name = agent(agent_daemon)
    response = oa.responses.create(model=f"agentd:{name}", input="[[length]] one two three four")
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"


def test_stream_events(agent_daemon, oa) -> None:
    name = agent(agent_daemon)
    stream = oa.responses.create(model=f"agentd:{name}", input="[[chunks:3]]", stream=True)
    events = list(stream)
    types = [e.type for e in events]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                     "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "w1 w2 w3"
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    done = events[-1].response
    assert done.id == events[0].response.id and done.output_text == "w1 w2 w3" and done.usage.total_tokens > 0
    assert events[7].text == "w1 w2 w3" and events[9].item.id == events[2].item.id
    assert oa.responses.retrieve(done.id).output_text == "w1 w2 w3"


def test_stream_helper(agent_daemon, oa) -> None:
    name = agent(agent_daemon)
    with oa.responses.stream(model=f"agentd:{name}", input="streamed hello") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "echo: streamed hello" and final.output_text == "echo: streamed hello"
    assert final.status == "completed"


def test_the_streamed_text_is_the_unstreamed_output_text(agent_daemon, oa) -> None:
    """Text of a turn that called a tool is streamed as it comes, and is part of the answer."""
    name = agent(agent_daemon)
    said = "calling a tool\n\ntool said: permission denied: tool 'lookup' is not available to this agent"
    text = '[[think:calls]] [[tool:lookup {"q": 1}]]'
    assert oa.responses.create(model=f"agentd:{name}", input=text).output_text == said
    with oa.responses.stream(model=f"agentd:{name}", input=text) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == said
    assert [e.text for e in events if e.type == "response.output_text.done"] == [said]
    assert final.output_text == said and oa.responses.retrieve(final.id).output_text == said


def test_stream_failure_is_response_failed(agent_daemon, oa) -> None:
    name = agent(agent_daemon)
    events = list(oa.responses.create(model=f"agentd:{name}", input="[[fail:400]]", stream=True))
    assert events[-1].type == "response.failed"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error"
    assert oa.responses.retrieve(failed.id).status == "failed"


def test_a_stopped_stream_is_response_failed_and_streams_go_on(agent_daemon, oa) -> None:
    d, name = agent_daemon, f"r-{uuid.uuid4().hex[:8]}"
    agent_id = spawn(d, name)
    with requests.post(f"{d.url}/v1/responses", json={"model": f"agentd:{name}", "input": "[[slow:3]] b",
                                                      "stream": True}, stream=True, timeout=30) as r:
        lines = r.iter_lines(decode_unicode=True)
        for line in lines:
            if line == "event: response.in_progress":
                assert d.post(f"/api/agents/{agent_id}/stop").json()["was_running"] is True
                break
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    failed = events[-1]
    assert failed["type"] == "response.failed", events
    assert (failed["response"]["status"], failed["response"]["error"]) == (
        "failed", {"code": "run_cancelled", "message": "the run was stopped before the agent answered"})
    assert oa.responses.retrieve(failed["response"]["id"]).status == "failed"
    # The stop was delivered from the thread that watches every stream: it goes on watching.
    later = list(oa.responses.create(model=f"agentd:{name}", input="[[slow:0.2]] again", stream=True))
    assert later[-1].type == "response.completed"


def test_failures_and_refusals(agent_daemon) -> None:
    d = agent_daemon
    name = agent(d)
    for fmt, missing in [({"type": "json_schema"}, "name"), ({"type": "json_schema", "name": "pet"}, "schema")]:
        r = d.post("/v1/responses", json={"model": f"agentd:{name}", "input": "hi", "text": {"format": fmt}})
        assert (r.status_code, r.json()["error"]["message"]) == (
            400, f"invalid request: text.format.{missing}: required with type json_schema"), r.text
    r = d.post("/v1/responses", json={"model": f"agentd:{name}", "input": "[[fail:400]]"})
    assert r.status_code == 500 and r.headers["x-should-retry"] == "false"
    assert r.json()["error"]["type"] == "server_error" and "code" not in r.json()["error"]
    for model in ("agentd:nobody", "agentd:", ""):
        r = d.post("/v1/responses", json={"model": model, "input": "hi"})
        assert (r.status_code, r.json()["error"]) == (404, {
            "message": f"no agent found for model '{model}'", "type": "invalid_request_error",
            "code": "model_not_found"}), model
    for extra, message in [
            ({"tools": [{"type": "function", "name": "f"}]}, "unsupported parameter 'tools'"),
            ({"background": True}, "unsupported parameter 'background'"),
            ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
             "input[0]: item type 'function_call_output' is not supported"),
            ({"input": [{"role": "assistant", "content": "only me"}]}, "no user message found in input"),
            ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
             "only base64 data URIs"),
            ({"input": 5}, "invalid request"),
            ({"temperature": 3}, "invalid request")]:
        r = d.post("/v1/responses", json={"model": f"agentd:{name}", "input": "hi", **extra})
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error" and message in r.json()["error"]["message"]
    r = d.get("/v1/responses/resp_missing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"


def test_agents_sdk_default_model(agent_daemon) -> None:
    """The OpenAI Agents SDK's default model provider speaks only Responses."""
    agents = pytest.importorskip("agents")
    name = agent(agent_daemon)
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{agent_daemon.url}/v1", api_key="unused", max_retries=0)
    run_config = agents.RunConfig(model_provider=agents.OpenAIProvider(openai_client=client))
    helper = agents.Agent(name="helper", instructions="Be brief.", model=f"agentd:{name}")
    assert isinstance(run_config.model_provider.get_model(helper.model), agents.OpenAIResponsesModel)

    async def both() -> tuple[str, str]:
        plain = await agents.Runner.run(helper, "what is agentd?", run_config=run_config)
        streamed = agents.Runner.run_streamed(helper, "and streamed?", run_config=run_config)
        async for _ in streamed.stream_events():
            pass
        return plain.final_output, streamed.final_output

    assert asyncio.run(both()) == ("echo: what is agentd?", "echo: and streamed?")


def test_openapi_documents_the_routes(agent_daemon) -> None:
    paths = requests.get(f"{agent_daemon.url}/api/openapi.json", timeout=10).json()["paths"]
    assert set(paths["/v1/responses"]) >= {"post"}
    assert set(paths["/v1/responses/{response_id}"]) >= {"get", "delete"}
    assert "post" in paths["/v1/embeddings"]


def test_responses_racing_the_agents_deletion_keep_nothing_of_it(agent_daemon) -> None:
    d = agent_daemon
    answers: Counter = Counter()
    for round_ in range(8):
        agent_id = spawn(d)

        def work(i: int, s: requests.Session) -> None:
            if i == 0:
                time.sleep(0.01 * (round_ % 4))  # some runs answer first in some rounds
                answers[("KILL", s.delete(f"{d.url}/api/agents/{agent_id}").status_code)] += 1
                return
            for _ in range(4):
                r = s.post(f"{d.url}/v1/responses", json={"model": agent_id, "input": "[[slow:0.02]] hi"})
                answers[("RESPONSE", r.status_code)] += 1

        _together(5, work)
        assert db_rows(d.home, "SELECT COUNT(*) FROM openai_responses WHERE agent_id = ?", (agent_id,)) == [(0,)], \
            "BUG: a response stored after its agent was deleted outlives the agent"
    assert answers[("KILL", 200)] == 8
    assert set(answers) <= {("KILL", 200), ("RESPONSE", 200), ("RESPONSE", 404), ("RESPONSE", 409)}, answers
