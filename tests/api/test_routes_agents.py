"""agentd/api/routes_agents.py helpers exactly: the message size limit in bytes (at and one
past 64 KB), empty messages, the spec's result body, and agent lookup through the real app
in process. (Route functions themselves are Flask-decorated, which mutmut 3 leaves alone;
they are exercised through the daemon in tests/agents/test_agents.py.)"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from agentd.agents.loop import RunResult
from agentd.agents.manager import MESSAGE_LIMIT
from agentd.api.routes_agents import message_text, result_body
from agentd.errors import BadRequest, PayloadTooLarge
from agentd.llm.types import Usage
from tests.api.test_http_shell import LOCAL, make_client


def test_message_limit_is_64_kib_of_utf8() -> None:
    assert MESSAGE_LIMIT == 65536
    at = "a" * MESSAGE_LIMIT
    assert message_text({"message": at}) is at
    with pytest.raises(PayloadTooLarge) as info:
        message_text({"message": at + "a"})
    assert str(info.value) == "message too large (max 64 KB)"
    # Bytes, not characters: 32768 two-byte characters fill the limit exactly.
    assert message_text({"message": "é" * 32768}) == "é" * 32768
    with pytest.raises(PayloadTooLarge):
        message_text({"message": "é" * 32768 + "a"})
    with pytest.raises(PayloadTooLarge):
        message_text({"message": "é" * 32769})


@pytest.mark.parametrize("text", ["", " ", "\n\t  ", "\u3000"])
def test_empty_message_is_refused(text: str) -> None:
    with pytest.raises(BadRequest) as info:
        message_text({"message": text})
    assert str(info.value) == "message is empty"


def test_message_is_kept_as_sent() -> None:
    assert message_text({"message": "  hi \n"}) == "  hi \n"
    assert message_text({"message": "x"}) == "x"


def test_result_body_is_the_spec_shape() -> None:
    result = RunResult(response="hello", usage=Usage(input_tokens=12, output_tokens=34), iterations=3,
                       finish_reason="stop", new_messages=[], cost_usd=0.0123)
    assert result_body(result) == {"response": "hello", "input_tokens": 12, "output_tokens": 34,
                                   "iterations": 3, "cost_usd": 0.0123}
    assert list(result_body(result)) == ["response", "input_tokens", "output_tokens", "iterations", "cost_usd"]
    free = RunResult(response="", usage=Usage(), iterations=1, finish_reason="stop", new_messages=[])
    assert result_body(free) == {"response": "", "input_tokens": 0, "output_tokens": 0, "iterations": 1,
                                 "cost_usd": None}


def test_agent_lookup_through_the_app(tmp_path: Path) -> None:
    client, kernel = make_client(tmp_path)
    try:
        r = client.post("/api/agents", json={"manifest_toml": 'name = "lookup"\n'}, environ_base=LOCAL)
        assert r.status_code == 201, r.text
        agent_id = r.get_json()["agent_id"]
        r = client.get(f"/api/agents/{agent_id}", environ_base=LOCAL)
        assert r.status_code == 200 and r.get_json()["name"] == "lookup"
        r = client.get(f"/api/agents/{uuid.uuid4()}", environ_base=LOCAL)
        assert r.status_code == 404 and r.get_json() == {"error": "agent not found"}
        r = client.post(f"/api/agents/{uuid.uuid4()}/message", json={"message": "hi"}, environ_base=LOCAL)
        assert r.status_code == 404 and r.get_json() == {"error": "agent not found"}
        r = client.post(f"/api/agents/{agent_id}/message", json={"message": "   "}, environ_base=LOCAL)
        # The schema refuses it first; message_text's own check guards the dashboard's chat form.
        assert r.status_code == 400 and r.get_json() == {"error": "invalid request: message: must not be empty"}
        r = client.post(f"/api/agents/{agent_id}/message", json={"message": "a" * 65537}, environ_base=LOCAL)
        assert r.status_code == 413 and r.get_json() == {"error": "message too large (max 64 KB)"}
        assert client.delete(f"/api/agents/{agent_id}", environ_base=LOCAL).status_code in (200, 204)
        r = client.get(f"/api/agents/{agent_id}", environ_base=LOCAL)
        assert r.status_code == 404, "BUG: a killed agent is still found"
    finally:
        kernel.close()


# -- through the real daemon ---------------------------------------------------------------

KEYLESS = 'name = "{name}"\n[model]\nprovider = "groq"\nmodel = "llama-3.3-70b-versatile"\n'
FIX = "set GROQ_API_KEY in the daemon's environment or POST /api/providers/groq/key"


def test_agent_without_a_provider_key_spawns_with_a_warning_and_answers_424(shared_daemon) -> None:
    import json

    import websocket

    d = shared_daemon
    r = d.post("/api/agents", json={"manifest_toml": KEYLESS.format(name="keyless") + "colour = 3\n"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert set(body) == {"agent_id", "name", "warnings"}
    assert body["warnings"][-1] == "provider groq has no API key: set GROQ_API_KEY or POST /api/providers/groq/key"
    assert len(body["warnings"]) == 2, "the unknown manifest key is still reported"
    agent_id = body["agent_id"]

    r = d.post(f"/api/agents/{agent_id}/message", json={"message": "hi"})
    assert r.status_code == 424, r.text
    assert set(r.json()) == {"error"} and FIX in r.json()["error"]

    r = d.post(f"/api/agents/{agent_id}/message/stream", json={"message": "hi"}, stream=True)
    events = [line for line in r.iter_lines(decode_unicode=True) if line.startswith(("event:", "data:"))]
    assert "event: error" in events
    error = json.loads(events[events.index("event: error") + 1][len("data:"):])
    assert error["status"] == 424 and FIX in error["error"]

    ws = websocket.create_connection(f"ws://127.0.0.1:{d.port}/api/agents/{agent_id}/ws", timeout=10)
    try:
        assert json.loads(ws.recv())["type"] == "connected"
        ws.send(json.dumps({"type": "message", "content": "hi"}))
        frames = [json.loads(ws.recv())]
        while frames[-1]["type"] != "error":
            frames.append(json.loads(ws.recv()))
    finally:
        ws.close()
    assert FIX in frames[-1]["content"]

    # An agent whose provider has its key spawns without warnings.
    r = d.post("/api/agents", json={"manifest_toml": 'name = "keyed"\n[model]\nprovider = "ollama"\n'
                                                     'model = "llama3.2"\n'})
    assert r.status_code == 201 and r.json()["warnings"] == []


def test_a_name_where_the_id_belongs_answers_400_naming_the_id(shared_daemon) -> None:
    d = shared_daemon
    r = d.post("/api/agents", json={"manifest_toml": 'name = "named-one"\n'})
    agent_id = r.json()["agent_id"]
    for method, path, payload in [("GET", "/api/agents/named-one", None),
                                  ("POST", "/api/agents/named-one/message", {"message": "hi"}),
                                  ("POST", "/api/agents/named-one/message/stream", {"message": "hi"}),
                                  ("GET", "/api/agents/named-one/uploads", None),
                                  ("DELETE", "/api/agents/named-one", None)]:
        r = d.request(method, path, json=payload)
        assert r.status_code == 400, (path, r.text)
        assert r.json() == {"error": f"invalid agent id: 'named-one' is not a UUID: did you mean agent {agent_id}?"}
    r = d.get("/api/agents/nobody-by-this-name")
    assert r.status_code == 400 and r.json() == {"error": "invalid agent id: 'nobody-by-this-name' is not a UUID"}
    assert d.get(f"/api/agents/{agent_id}").status_code == 200


def test_null_options_of_a_message_are_left_out(agent_daemon) -> None:
    """JSON clients send `null` for `attachments`, `user` and `session` they do not use: the
    message runs as without them, on the plain and the streamed endpoint alike."""
    d = agent_daemon
    agent_id = d.post("/api/agents", json={"manifest_toml": f'name = "nulls-{uuid.uuid4().hex[:6]}"\n'
                                                             '[model]\nprovider = "openai"\nmodel = "gpt-4o"\n'}
                      ).json()["agent_id"]
    nulls = {"attachments": None, "user": None, "session": None}
    r = d.post(f"/api/agents/{agent_id}/message", json={"message": "[[reply:plain]]", **nulls})
    assert (r.status_code, r.json()["response"]) == (200, "plain"), r.text
    r = d.post(f"/api/agents/{agent_id}/message/stream", json={"message": "[[reply:streamed]]", **nulls})
    assert r.status_code == 200 and 'data: {"content":"streamed","done":false}' in r.text, r.text
    messages = d.get(f"/api/agents/{agent_id}/session").json()["messages"]
    assert [m["content"] for m in messages] == ["[[reply:plain]]", "plain", "[[reply:streamed]]", "streamed"], \
        "BUG: a null user or session moved the turn out of the agent's own session"
    # The message itself stays required.
    r = d.post(f"/api/agents/{agent_id}/message", json={"message": None, **nulls})
    assert (r.status_code, r.json()) == (400, {"error": "invalid request: message: Field may not be null."})
