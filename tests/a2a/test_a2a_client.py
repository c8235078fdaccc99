"""The A2A client's pure parts, in process: [a2a] agents, which URLs get a configured key,
endpoints from cards, answers of both protocol generations. The wire is in test_a2a.py."""

from __future__ import annotations

import pytest

from agentd.a2a.client import A2AClient, A2AClientError, RemoteAgent, _answer_text, card_endpoint, remote_agents
from agentd.errors import ConfigError


def test_remote_agents_table() -> None:
    assert remote_agents({}) == []
    assert remote_agents({"a2a": {"agents": [{"name": "r", "url": "https://x/a2a", "api_key_env": "K"}]}}) == [
        RemoteAgent("r", "https://x/a2a", "K")]
    for bad in ({"a2a": []}, {"a2a": {"agents": {}}}, {"a2a": {"agents": [{"name": "r"}]}},
                {"a2a": {"agents": [{"name": "r", "url": "ftp://x"}]}},
                {"a2a": {"agents": [{"name": "", "url": "http://x"}]}},
                {"a2a": {"agents": [{"name": "r", "url": "http://x", "api_key_env": 5}]}}):
        with pytest.raises(ConfigError, match="config key a2a.agents"):
            remote_agents(bad)


def test_the_key_goes_only_to_the_configured_origin() -> None:
    client = A2AClient([RemoteAgent("r", "http://host:1/a2a/agents/r", "K"), RemoteAgent("n", "http://other", "")],
                       {"K": "secret"}.get)
    assert client.headers_for("http://host:1/a2a") == {"Authorization": "Bearer secret"}
    for url in ("http://host:1.evil.example/a2a", "https://host:1/a2a", "http://host:2/a2a", "http://other/a2a"):
        assert client.headers_for(url) == {}, url
    assert client.resolve("r") == "http://host:1/a2a/agents/r"
    with pytest.raises(A2AClientError, match=r"no A2A agent named 'x' \(known: n, r;"):
        client.resolve("x")


def test_card_endpoint_prefers_the_jsonrpc_interface() -> None:
    card = {"url": "http://a/old", "supportedInterfaces": [
        {"url": "http://a/grpc", "protocolBinding": "GRPC"}, {"url": "http://a/rpc", "protocolBinding": "JSONRPC"}]}
    assert card_endpoint(card) == "http://a/rpc"
    assert card_endpoint({"url": "http://a/old"}) == "http://a/old"
    with pytest.raises(A2AClientError):
        card_endpoint({"name": "x"})


def test_answers_of_both_generations() -> None:
    text = [{"kind": "text", "text": "hi"}]
    assert _answer_text({"kind": "message", "parts": text}) == "hi"
    assert _answer_text({"status": {"state": "completed"}, "artifacts": [{"parts": text}, {"parts": [{"text": "!"}]}]}) \
        == "hi\n!"
    assert _answer_text({"status": {"state": "TASK_STATE_COMPLETED", "message": {"parts": [{"text": "st"}]}}}) == "st"
    assert _answer_text({"status": {"state": "working"}}) == "[the remote task is working; no answer yet]"
    with pytest.raises(A2AClientError, match="ended failed: boom"):
        _answer_text({"status": {"state": "TASK_STATE_FAILED", "message": {"parts": [{"text": "boom"}]}}})
