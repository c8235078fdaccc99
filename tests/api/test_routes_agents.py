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
        assert r.status_code == 400 and r.get_json() == {"error": "invalid request: message: message is empty"}
        r = client.post(f"/api/agents/{agent_id}/message", json={"message": "a" * 65537}, environ_base=LOCAL)
        assert r.status_code == 413 and r.get_json() == {"error": "message too large (max 64 KB)"}
        assert client.delete(f"/api/agents/{agent_id}", environ_base=LOCAL).status_code in (200, 204)
        r = client.get(f"/api/agents/{agent_id}", environ_base=LOCAL)
        assert r.status_code == 404, "BUG: a killed agent is still found"
    finally:
        kernel.close()
