"""The A2A client in process: [a2a] agents, which URLs get a configured key, endpoints from
cards, answers of both protocol generations, and its requests to a remote agent on a real
local HTTP server (card paths, keys, refusals, exact errors). Between daemons: test_a2a.py."""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

import pytest
import requests
from flask import Flask, Response, jsonify, request

from agentd.a2a.client import (MAX_RESPONSE_BYTES, A2AClient, A2AClientError, RemoteAgent, _answer_text, _json,
                               card_endpoint, remote_agents, summary)
from agentd.errors import ConfigError
from fakes.http import FakeServer


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
    assert card_endpoint(card) == ("http://a/rpc", "0.3")
    assert card_endpoint({"url": "http://a/old"}) == ("http://a/old", "0.3")
    # A JSON-RPC interface of a 1.x version is spoken as 1.0, ahead of one of 0.3.
    both = {"url": "http://a/old", "supportedInterfaces": [
        {"url": "http://a/v03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        {"url": "http://a/v1", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]}
    assert card_endpoint(both) == ("http://a/v1", "1.0")
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


class Remote:
    """A remote A2A agent on a real local HTTP server: the card paths and a JSON-RPC endpoint,
    each answer scripted per path (status, body), every request recorded."""

    def __init__(self) -> None:
        # path -> (status, body): a dict is sent as JSON, bytes as they are (with a Location
        # header), a callable's chunks one by one
        self.answers: dict[str, tuple[int, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        app = Flask("remote-a2a")

        @app.route("/<path:path>", methods=["GET", "POST"])
        def any_path(path: str) -> Any:
            self.requests.append({"method": request.method, "path": request.path, "headers": dict(request.headers),
                                  "json": request.get_json(silent=True)})
            status, body = self.answers.get(request.path, (404, {"error": "not found"}))
            if callable(body):
                return Response(body(), status, mimetype="application/json")
            if isinstance(body, bytes):
                return Response(body, status, {"Location": "/elsewhere"})
            return jsonify(body), status

        self.server = FakeServer(app).start()
        self.url = self.server.url

    def card(self, path: str, card: dict[str, Any], status: int = 200) -> None:
        self.answers[path] = (status, card)


@pytest.fixture()
def remote() -> Iterator[Remote]:
    r = Remote()
    yield r
    r.server.stop()


def fetch(client: A2AClient, url: str, checked: list[str] | None = None) -> tuple[dict, str]:
    return client.fetch_card(url, requests.get, (checked if checked is not None else []).append)


CARD = {"name": "far", "url": "http://far.example/rpc", "description": "A remote agent"}


def test_a_base_url_finds_the_card_at_either_well_known_path(remote) -> None:
    client = A2AClient([], {}.get, timeout=7.5)
    remote.card("/.well-known/agent.json", CARD)
    checked: list[str] = []
    assert fetch(client, remote.url + "/", checked) == (CARD, remote.url + "/.well-known/agent.json")
    assert checked == [remote.url + "/.well-known/agent-card.json", remote.url + "/.well-known/agent.json"]
    assert [r["path"] for r in remote.requests] == ["/.well-known/agent-card.json", "/.well-known/agent.json"]
    assert remote.requests[0]["headers"]["Accept"] == "application/json"
    assert "Authorization" not in remote.requests[0]["headers"]
    # Discovered by name: a2a_send can name it now.
    assert client.resolve("far") == remote.url + "/.well-known/agent.json"
    remote.card("/.well-known/agent-card.json", {**CARD, "name": "newer"})
    assert fetch(client, remote.url) == ({**CARD, "name": "newer"}, remote.url + "/.well-known/agent-card.json")
    assert len(remote.requests) == 3, "the first path answered: the second is not asked"


def test_a_card_url_is_read_as_it_is(remote) -> None:
    client = A2AClient([], {}.get)
    remote.card("/cards/far.json/", CARD)
    assert fetch(client, remote.url + "/cards/far.json/") == (CARD, remote.url + "/cards/far.json/")
    assert [r["path"] for r in remote.requests] == ["/cards/far.json/"]
    with pytest.raises(A2AClientError) as err:
        fetch(client, remote.url + "/cards/none.json")
    assert str(err.value) == f"the agent card at {remote.url}/cards/none.json answered HTTP 404"


def test_cards_that_cannot_be_used(remote) -> None:
    client = A2AClient([], {}.get)
    with pytest.raises(A2AClientError) as err:
        fetch(client, remote.url)
    assert str(err.value) == f"the agent card at {remote.url}/.well-known/agent.json answered HTTP 404"
    remote.card("/.well-known/agent-card.json", {"error": "down"}, status=500)
    with pytest.raises(A2AClientError) as err:
        fetch(client, remote.url)
    assert str(err.value) == f"the agent card at {remote.url}/.well-known/agent-card.json answered HTTP 500"
    assert remote.requests[-1]["path"] == "/.well-known/agent-card.json", "only a 404 moves on to the next path"
    remote.answers["/.well-known/agent-card.json"] = (302, b"")
    with pytest.raises(A2AClientError) as err:
        fetch(client, remote.url)
    assert str(err.value) == f"the agent card at {remote.url}/.well-known/agent-card.json answered HTTP 302"
    assert remote.requests[-1]["path"] == "/.well-known/agent-card.json", "a redirect is not followed"
    for card in ({"description": "no name"}, {"name": 5}, ["far"]):
        remote.card("/c.json", card)
        with pytest.raises(A2AClientError) as err:
            fetch(client, remote.url + "/c.json")
        assert str(err.value) == f"{remote.url}/c.json is not an A2A agent card (no name)"
    remote.answers["/c.json"] = (200, "x" * (MAX_RESPONSE_BYTES + 1))
    with pytest.raises(A2AClientError) as err:
        fetch(client, remote.url + "/c.json")
    assert str(err.value) == f"the agent card at {remote.url}/c.json answered more than 4194304 bytes"
    with pytest.raises(A2AClientError, match=r"^no A2A agent named 'far' \(known: none; discover one with "
                                             r"a2a_discover or list it under \[a2a\] agents\)$"):
        client.resolve("far")
    head = b'{"name": "big", "pad": "'
    remote.answers["/big.json"] = (200, head + b"x" * (MAX_RESPONSE_BYTES - len(head) - 2) + b'"}')
    assert fetch(client, remote.url + "/big.json")[0]["name"] == "big", "a card of exactly the limit is read"


def test_an_answer_that_is_not_json(remote) -> None:
    class Page:
        status_code = 200

        def iter_content(self, size: int) -> Iterator[bytes]:
            assert size == 65536
            yield b"<html>"

    with pytest.raises(A2AClientError) as err:
        _json(Page(), "the agent card at x")
    assert str(err.value) == "the agent card at x did not answer JSON"


def test_an_endless_or_stalled_answer_is_cut_off(remote) -> None:
    def endless() -> Iterator[bytes]:
        yield b'{"name": "' + b"x" * MAX_RESPONSE_BYTES
        time.sleep(5)
        yield b'"}'

    def stalled() -> Iterator[bytes]:
        time.sleep(5)
        yield b"{}"
    for path in ("/endless.json", "/endless"):
        remote.answers[path] = (200, endless)
    for path in ("/stalled.json", "/stalled"):
        remote.answers[path] = (200, stalled)
    client = A2AClient([], {}.get, timeout=0.5)
    began = time.monotonic()
    with pytest.raises(A2AClientError) as err:
        fetch(client, remote.url + "/endless.json")
    assert str(err.value) == f"the agent card at {remote.url}/endless.json answered more than 4194304 bytes"
    with pytest.raises(A2AClientError) as err:
        client.send(remote.url + "/endless", "hi", "c", requests.post, [].append)
    assert str(err.value) == f"the A2A endpoint {remote.url}/endless answered more than 4194304 bytes"
    with pytest.raises(requests.exceptions.Timeout):
        fetch(client, remote.url + "/stalled.json")
    with pytest.raises(requests.exceptions.Timeout):
        client.send(remote.url + "/stalled", "hi", "c", requests.post, [].append)
    assert time.monotonic() - began < 6


def test_the_address_check_runs_before_each_request(remote) -> None:
    client = A2AClient([], {}.get)

    def refuse(url: str) -> None:
        raise A2AClientError(f"refusing {url}")
    with pytest.raises(A2AClientError) as err:
        client.fetch_card(remote.url, requests.get, refuse)
    assert str(err.value) == f"refusing {remote.url}/.well-known/agent-card.json"
    with pytest.raises(A2AClientError) as err:
        client.send(remote.url + "/rpc", "hi", "ctx", requests.post, refuse)
    assert str(err.value) == f"refusing {remote.url}/rpc"
    assert remote.requests == []


def test_the_key_goes_with_the_card_request_and_the_message(remote) -> None:
    client = A2AClient([RemoteAgent("far", remote.url + "/rpc", "FAR_KEY")], {"FAR_KEY": "k-123"}.get)
    remote.card("/.well-known/agent-card.json", {**CARD, "url": remote.url + "/rpc"})
    remote.answers["/rpc"] = (200, {"jsonrpc": "2.0", "id": "1", "result": {"kind": "message", "parts": [
        {"kind": "text", "text": "hello "}, {"kind": "data", "data": {}}, {"kind": "text", "text": "back"}]}})
    endpoint, version = client.endpoint(remote.url, requests.get, [].append)
    assert (endpoint, version) == (remote.url + "/rpc", "0.3")
    assert client.send(endpoint, "hi", "ctx-1", requests.post, [].append) == "hello back"
    card_request, rpc = remote.requests
    assert card_request["headers"]["Authorization"] == rpc["headers"]["Authorization"] == "Bearer k-123"
    assert rpc["method"] == "POST" and rpc["headers"]["Accept"] == "application/json"
    assert "a2a-version" not in {k.lower() for k in rpc["headers"]}  # none: 0.3
    sent = rpc["json"]
    message = sent["params"]["message"]
    assert (sent["jsonrpc"], sent["method"], list(sent["params"])) == ("2.0", "message/send", ["message"])
    assert {k: message[k] for k in ("kind", "role", "contextId", "parts")} == {
        "kind": "message", "role": "user", "contextId": "ctx-1", "parts": [{"kind": "text", "text": "hi"}]}
    assert uuid.UUID(sent["id"]) and uuid.UUID(message["messageId"]) and sent["id"] != message["messageId"]
    # Without the variable set, nothing is sent.
    assert A2AClient([RemoteAgent("far", remote.url, "FAR_KEY")], {}.get).headers_for(remote.url) == {}


def test_which_urls_are_read_for_an_endpoint(remote) -> None:
    client = A2AClient([], {}.get)
    remote.card("/.well-known/agent-card.json", CARD)
    remote.card("/far.json", {**CARD, "url": "http://far.example/other"})
    for base in (remote.url, remote.url + "/"):
        assert client.endpoint(base, requests.get, [].append) == ("http://far.example/rpc", "0.3")
    remote.card("/far.json/", {**CARD, "url": "http://far.example/slash"})
    assert client.endpoint(remote.url + "/far.json", requests.get, [].append) == ("http://far.example/other", "0.3")
    assert client.endpoint(remote.url + "/far.json/", requests.get, [].append) == ("http://far.example/slash", "0.3")
    before = len(remote.requests)
    assert client.endpoint(remote.url + "/a2a/agents/far", requests.get, [].append) == (
        remote.url + "/a2a/agents/far", "0.3")
    assert len(remote.requests) == before, "an endpoint's own URL is used without a card"


def test_what_a_remote_agent_may_answer_a_message(remote) -> None:
    client = A2AClient([], {}.get)
    url = remote.url + "/rpc"

    def answer(body: Any, status: int = 200) -> str:
        remote.answers["/rpc"] = (status, body)
        return client.send(url, "hi", "c", requests.post, [].append)
    task = {"kind": "task", "status": {"state": "completed"},
            "artifacts": [{"parts": [{"kind": "text", "text": "done"}]}]}
    assert answer({"jsonrpc": "2.0", "id": "1", "result": task}) == "done"
    assert answer({"jsonrpc": "2.0", "id": "1", "result": {"task": task}}) == "done"
    assert answer({"jsonrpc": "2.0", "id": "1", "result": {"message": {"parts": [{"text": "m"}]}}}) == "m"
    refusals = (({"jsonrpc": "2.0", "id": "1", "error": {"code": -32001, "message": "task not found"}}, 200,
                 "the remote agent refused: task not found (code -32001)"),
                ([1, 2], 200, "the remote agent answered something that is not JSON-RPC"),
                ({"jsonrpc": "2.0", "id": "1"}, 200, "the remote agent's answer has no result"),
                ({"jsonrpc": "2.0", "id": "1", "result": "text"}, 200, "the remote agent's answer has no result"),
                ({}, 503, f"the A2A endpoint {url} answered HTTP 503"),
                (b"", 307, f"the A2A endpoint {url} answered HTTP 307"))
    for body, status, message in refusals:
        with pytest.raises(A2AClientError) as err:
            answer(body, status)
        assert str(err.value) == message


def test_what_a_model_is_shown_of_a_card() -> None:
    v1 = {"name": "far", "description": "d", "version": "2.1", "securitySchemes": {"bearer": {}},
          "capabilities": {"streaming": True},
          "supportedInterfaces": [{"url": "http://far/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
                                  "junk", {"url": "http://far/rpc", "protocolBinding": "jsonrpc"}],
          "skills": [{"id": "s", "name": "S", "description": "does", "tags": ["t"], "examples": ["e"]}, "junk",
                     {"id": "bare"}]}
    assert summary(v1, "http://far/card.json") == {
        "name": "far", "description": "d", "url": "http://far/rpc", "card_url": "http://far/card.json",
        "version": "2.1", "protocols": ["GRPC 1.0", "jsonrpc"], "streaming": True, "auth_required": True,
        "skills": [{"id": "s", "name": "S", "description": "does", "tags": ["t"]}, {"id": "bare"}]}
    old = {"name": "old", "url": "http://old/rpc", "protocolVersion": "0.3.0", "preferredTransport": "HTTP+JSON"}
    assert summary(old, "u") == {
        "name": "old", "description": None, "url": "http://old/rpc", "card_url": "u", "version": None,
        "protocols": ["HTTP+JSON 0.3.0"], "streaming": False, "auth_required": False, "skills": []}
    assert summary({"name": "bare", "url": ""}, "u")["protocols"] == ["JSONRPC"]
    assert summary({"name": "bare", "url": ""}, "u")["url"] == ""


def test_card_endpoints_that_are_not_usable() -> None:
    card = {"supportedInterfaces": [{"url": 5, "protocolBinding": "JSONRPC"}, "junk",
                                    {"url": "http://a/grpc", "protocolBinding": "GRPC"}], "url": "http://a/old"}
    assert card_endpoint(card) == ("http://a/old", "0.3")
    for bad in ({"url": ""}, {"url": 7}, {"supportedInterfaces": [{"url": "http://a/x"}]}):
        with pytest.raises(A2AClientError) as err:
            card_endpoint(bad)
        assert str(err.value) == "the agent card names no JSON-RPC endpoint"


def test_how_a_task_that_ended_badly_or_without_text_reads() -> None:
    for state in ("canceled", "TASK_STATE_REJECTED"):
        with pytest.raises(A2AClientError) as err:
            _answer_text({"status": {"state": state}})
        assert str(err.value) == f"the remote task ended {state.lower().replace('task_state_', '')}: no reason given"
    assert _answer_text({"status": {"state": "completed"}, "artifacts": [{"parts": []}, "junk", {"parts": [
        {"text": "a"}]}, {"parts": [{"text": ""}]}], "metadata": {}}) == "a"
    assert _answer_text({"status": {"state": "completed"}}) == ""
    assert _answer_text({"status": "odd"}) == ""
    assert _answer_text({"status": {"state": "input-required", "message": "junk"}}) == (
        "[the remote task is input-required; no answer yet]")
    assert _answer_text({"parts": None}) == ""
