"""agentd as an MCP server at /mcp, reached with the official SDK's client and by a second
agentd that has the first as one of its `[[mcp_servers]]`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from typing import Any, Iterator

import httpx2
import pytest
import requests
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, stop_shared, wait_until
from tests.mcp.support_mcp import url_server, wait_state

KEY = "k-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[tuple[Daemon, Daemon]]:
    """`first` (with an API key) serves its agents over MCP; `second` (keyless) uses it."""
    first = Daemon(make_home(tmp_path_factory.mktemp("mcp-first"), f'api_key = "{KEY}"\n' + llm_config(fake_llm)),
                   api_key=KEY, env_extra=LLM_ENV).start()
    # /mcp loads the MCP SDK on its first request; on a loaded host that can outlast the
    # second daemon's discover probe, whose client then settles for the older revision.
    loaded = first.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=60,
                        headers={"Authorization": f"Bearer {KEY}", "Accept": "application/json, text/event-stream"})
    assert loaded.status_code == 200, loaded.text
    extra = url_server("first", f"{first.url}/mcp", headers_env={"Authorization": "FIRST_AUTH"}, timeout_secs=20)
    second = Daemon(make_home(tmp_path_factory.mktemp("mcp-second"), llm_config(fake_llm, extra)),
                    env_extra={**LLM_ENV, "FIRST_AUTH": f"Bearer {KEY}"}).start()
    try:
        yield first, second
    finally:
        stop_shared(second)
        stop_shared(first)


def _spawn(d: Daemon, name: str) -> str:
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\ndescription = "the {name} agent"\n'})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def _client(d: Daemon, key: str | None = KEY, extra: dict[str, str] | None = None, **kw: Any) -> Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers.update(extra or {})
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0))
    return Client(streamable_http_client(f"{d.url}/mcp", http_client=http), **kw)


def test_sdk_client_lists_and_calls_agentd_tools(pair) -> None:
    first, _ = pair
    agent_id = _spawn(first, "helper")
    remembered = first.post(f"/api/memory/agents/{agent_id}/memories", json={"content": "The wifi password is on the fridge"})
    assert remembered.status_code == 201, remembered.text

    async def session() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with _client(first) as client:
            out["version"] = client.protocol_version
            out["tools"] = {t.name: t for t in (await client.session.list_tools()).tools}
            out["agents"] = json.loads((await client.call_tool("list_agents", {})).content[0].text)
            notes: list[tuple[float, str | None]] = []

            async def progress(value: float, total: float | None, message: str | None) -> None:
                notes.append((value, message))

            out["reply"] = await client.session.call_tool("message_agent", {"agent": "helper",
                                                                            "message": "[[chunks:3]]"},
                                                          progress_callback=progress)
            out["notes"] = notes
            out["missing"] = await client.call_tool("message_agent", {"agent": "nobody", "message": "hi"})
            out["blank"] = await client.call_tool("message_agent", {"agent": "helper", "message": "  "})
            out["recall"] = await client.call_tool("recall_memory", {"agent": "helper", "query": "wifi password"})
        async with _client(first, mode="legacy") as legacy:
            out["legacy"] = legacy.protocol_version
            out["legacy_agents"] = json.loads((await legacy.call_tool("list_agents", {})).content[0].text)
        return out

    out = asyncio.run(session())
    assert out["version"] == "2026-07-28"
    assert set(out["tools"]) == {"list_agents", "message_agent", "recall_memory"}
    assert out["tools"]["message_agent"].input_schema["required"] == ["agent", "message"]
    recall = out["tools"]["recall_memory"].input_schema
    assert recall["required"] == ["agent", "query"]
    assert recall["properties"]["limit"] == {"default": 5, "description": "How many fragments", "maximum": 100,
                                             "minimum": 1, "title": "Limit", "type": "integer"}
    assert out["tools"]["message_agent"].input_schema["properties"]["agent"]["description"] == (
        "The agent's id or name (as list_agents gives them)")
    helper = [a for a in out["agents"] if a["name"] == "helper"]
    assert helper == [{"id": agent_id, "name": "helper", "state": "Running", "mode": "Auto",
                       "model": "openai/gpt-4o", "description": "the helper agent"}]
    assert out["reply"].is_error is False and out["reply"].content[0].text == "w1 w2 w3"
    # The run streamed: its text arrived as progress notifications, in order, before the result.
    messages = [m for _, m in out["notes"]]
    assert "".join(m for m in messages if m and m.strip().startswith("w")) == "w1 w2 w3"
    assert [v for v, _ in out["notes"]] == sorted(v for v, _ in out["notes"])
    assert out["missing"].is_error is True
    assert out["missing"].content[0].text.endswith("no agent with id or name 'nobody'")
    assert out["blank"].is_error is True and out["blank"].content[0].text.endswith(": message is empty")
    assert out["recall"].is_error is False
    recalled = json.loads(out["recall"].content[0].text)
    assert recalled and recalled[0]["content"] == "The wifi password is on the fridge"
    assert out["legacy"] == "2025-11-25" and out["legacy_agents"] == out["agents"]
    # The run went through the one run path, named as MCP's.
    session = first.get(f"/api/agents/{agent_id}/session").json()
    assert [m["content"] for m in session["messages"]][-2:] == ["[[chunks:3]]", "w1 w2 w3"]


def test_second_agentd_calls_through_the_first(pair) -> None:
    first, second = pair
    _spawn(first, "remote")
    ready = wait_state(second, "first", "ready")
    assert ready["transport"] == "streamable_http" and ready["protocol_version"] == "2026-07-28"
    assert ready["server_info"]["name"] == "agentd"
    local = _spawn(second, "caller")
    call = '[[tool:mcp_first_message_agent {"agent": "remote", "message": "hello over mcp"}]]'
    r = second.post(f"/api/agents/{local}/message", json={"message": call})
    assert r.status_code == 200, r.text
    assert r.json()["response"] == "tool said: echo: hello over mcp"
    remote = first.get("/api/agents").json()
    remote_id = next(a["id"] for a in remote if a["name"] == "remote")
    messages = first.get(f"/api/agents/{remote_id}/session").json()["messages"]
    assert [m["content"] for m in messages] == ["hello over mcp", "echo: hello over mcp"]


def test_mcp_endpoint_has_the_api_auth(pair) -> None:
    first, second = pair
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    import requests

    missing = requests.post(f"{first.url}/mcp", json=body, headers=headers, timeout=10)
    assert missing.status_code == 401 and missing.json() == {
        "error": "missing API key: send Authorization: Bearer <api_key>"}
    wrong = requests.post(f"{first.url}/mcp", json=body, headers={**headers, "Authorization": "Bearer nope"},
                          timeout=10)
    assert wrong.status_code == 401 and wrong.json() == {"error": "invalid API key"}

    async def refused() -> str:
        try:
            async with _client(first, key="nope"):
                return "connected"
        except BaseException as exc:  # noqa: BLE001 - the SDK raises through its task groups
            return type(exc).__name__

    assert asyncio.run(refused()) != "connected"
    # Keyless: loopback only, and the Host / Origin checks of the rest of the API.
    rebinding = requests.post(f"{second.url}/mcp", json=body, headers={**headers, "Host": "evil.example"},
                              timeout=10)
    assert rebinding.status_code == 400
    cross_site = requests.post(f"{second.url}/mcp", json=body,
                               headers={**headers, "Origin": "http://evil.example"}, timeout=10)
    assert cross_site.status_code == 403


def test_a_scoped_key_sees_and_messages_only_its_agents(pair) -> None:
    first, _ = pair
    mine, other = _spawn(first, "scoped-mine"), _spawn(first, "scoped-other")
    created = first.post("/api/keys", json={"name": "mcp-scoped", "scopes": ["read", "message"],
                                            "agents": ["scoped-mine"]})
    assert created.status_code == 201, created.text
    reader = first.post("/api/keys", json={"name": "mcp-reader", "scopes": ["read"]}).json()["key"]
    # A key id sent by the client is not trusted: the daemon sets the header from the real key.
    forged = {"X-Agentd-Key-Id": ""}  # "": the admin's

    async def session() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with _client(first, created.json()["key"], forged) as client:
            out["agents"] = json.loads((await client.call_tool("list_agents", {})).content[0].text)
            out["other"] = await client.call_tool("message_agent", {"agent": "scoped-other", "message": "hi"})
            out["mine"] = await client.call_tool("message_agent", {"agent": "scoped-mine", "message": "[[reply:ok]]"})
        return out

    out = asyncio.run(session())
    assert [a["id"] for a in out["agents"]] == [mine]
    assert out["other"].is_error and out["other"].content[0].text.endswith("no agent with id or name 'scoped-other'")
    refused = [e["detail"] for e in first.get("/api/audit/recent", params={"limit": 50}).json()
               if e["event"] == "key.refused" and e["subject"] == "mcp-scoped"]
    assert refused == [{"key_id": created.json()["id"], "reason": "agent", "agent_id": other}]
    assert out["mine"].is_error is False and out["mine"].content[0].text == "ok"
    refused = first.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         headers={"Authorization": f"Bearer {reader}", "Accept": "application/json, text/event-stream"})
    assert refused.status_code == 403 and "missing scope 'message'" in refused.json()["error"]
    # The scoped key's run is its own: the agent's own session did not get it.
    assert other and first.get(f"/api/agents/{mine}/session").json()["messages"] == []
    # Nor does its recall see another person's exchange with the agent.
    assert first.post(f"/api/agents/{mine}/message", json={"message": "[[reply:zed's secret]]", "user": "zed"}
                      ).status_code == 200
    wait_until(lambda: first.get(f"/api/memory/agents/{mine}/memories").json()["total"] == 2, "both exchanges stored")

    async def recall() -> list[dict[str, Any]]:
        async with _client(first, created.json()["key"]) as client:
            found = await client.call_tool("recall_memory", {"agent": "scoped-mine", "query": "secret", "limit": 10})
        return json.loads(found.content[0].text)

    assert [m["metadata"]["owner"] for m in asyncio.run(recall())] == [f"key:{created.json()['id']}"]


def test_endpoint_refuses_what_it_does_not_serve_with_json_errors(pair) -> None:
    first, _ = pair
    auth = {"Authorization": f"Bearer {KEY}", "Accept": "application/json, text/event-stream"}
    # Stateless: no server-initiated stream to hold open, so GET is refused at once.
    get = first.get("/mcp", headers={**auth, "Accept": "text/event-stream"}, timeout=5)
    assert get.status_code == 405 and get.json() == {"error": "method GET not allowed on /mcp"}
    assert get.headers["Allow"] == "OPTIONS, POST"
    # Nor is there a session to end: DELETE is refused the same way.
    delete = first.delete("/mcp", headers=auth, timeout=5)
    assert delete.status_code == 405 and delete.json() == {"error": "method DELETE not allowed on /mcp"}
    # /mcp is rate-limited like the rest of the API.
    assert int(get.headers["X-RateLimit-Limit"]) > 0
    hello = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    plain = first.post("/mcp", data=hello, headers={**auth, "Content-Type": "text/plain"})
    assert plain.status_code == 415
    assert plain.json() == {"error": "Content-Type must be application/json (got text/plain)"}
    size = 4 * 1024 * 1024 + 1
    big = first.post("/mcp", data=b"{" + b" " * (size - 2) + b"}",
                     headers={**auth, "Content-Type": "application/json"})
    assert big.status_code == 413
    assert big.json() == {"error": f"request body too large: {size} bytes (limit {4 * 1024 * 1024})"}


def test_a_message_run_stops_when_its_client_leaves_or_cancels(pair, fake_llm) -> None:
    first, _ = pair
    agent_id = _spawn(first, "slowpoke")
    # Nine model turns of a second each, eight of them calling a tool.
    slow = "[[slow:1]] [[tool:system_time {} x8]]"

    # The fake LLM is shared with other tests: a message is known by a word of its own.
    left, cancelled_word = f"left-{uuid.uuid4().hex[:8]}", f"cancelled-{uuid.uuid4().hex[:8]}"

    def stopped(marker: str) -> None:
        """The run of the message starting with `marker` stopped: it made no model call once
        its client left, and the session has its stop, not its answer."""
        time.sleep(3.5)
        calls = sum(marker in json.dumps(r["json"] or {}) for r in list(fake_llm.requests))
        assert calls <= 3, f"the run went on after its client left ({calls} model calls)"
        messages = first.get(f"/api/agents/{agent_id}/session").json()["messages"]
        asked = max(i for i, m in enumerate(messages) if str(m["content"]).startswith(marker))
        assert messages[-1]["content"] == "[run stopped before the agent answered]"
        assert len(messages) - asked <= 6, messages[asked:]

    async def leave() -> None:
        async with _client(first) as client:
            call = asyncio.ensure_future(client.session.call_tool(
                "message_agent", {"agent": "slowpoke", "message": f"{left} {slow}"}))
            await asyncio.sleep(1.5)
            call.cancel()
            with contextlib.suppress(BaseException):
                await call

    asyncio.run(leave())
    stopped(left)

    # A client that keeps its stream open and posts notifications/cancelled for its request.
    headers = {"Authorization": f"Bearer {KEY}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json", "MCP-Protocol-Version": "2025-11-25"}
    call = {"jsonrpc": "2.0", "id": 77, "method": "tools/call",
            "params": {"name": "message_agent", "arguments": {"agent": "slowpoke", "message": f"{cancelled_word} {slow}"}}}
    answer: list[str] = []

    def stream() -> None:
        with requests.post(f"{first.url}/mcp", json=call, headers=headers, stream=True, timeout=30) as r:
            answer.extend(line for line in r.iter_lines(decode_unicode=True) if line.startswith("data:"))

    reader = threading.Thread(target=stream)
    reader.start()
    time.sleep(1.5)
    cancelled = requests.post(f"{first.url}/mcp", headers=headers, timeout=10, json={
        "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 77, "reason": "user"}})
    assert cancelled.status_code == 202
    reader.join(10)
    assert not reader.is_alive(), "the cancelled request was not answered"
    assert answer and json.loads(answer[-1].removeprefix("data:"))["result"]["isError"] is True
    stopped(cancelled_word)
