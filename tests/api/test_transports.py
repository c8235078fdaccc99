"""Live transports through the real daemon: SSE, WebSocket, the OpenAI-compatible API
(with the official `openai` SDK) and the diagnostic echo socket."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import uuid

import openai
import pytest
import requests
import websocket

from tests.agents.test_agents import PNG, spawn


def sse_events(response: requests.Response) -> list[tuple[str, dict]]:
    """Parse `event:`/`data:` pairs from a streaming response."""
    events: list[tuple[str, dict]] = []
    name = "message"
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            payload = line[5:].strip()
            events.append((name, json.loads(payload) if payload != "[DONE]" else {"DONE": True}))
            name = "message"
    return events


def stream(d, agent_id: str, text: str) -> list[tuple[str, dict]]:
    r = d.post(f"/api/agents/{agent_id}/message/stream", json={"message": text}, stream=True)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/event-stream")
    return sse_events(r)


# -- SSE ----------------------------------------------------------------------------

def test_sse_text_stream(agent_daemon) -> None:
    agent_id = spawn(agent_daemon)
    events = stream(agent_daemon, agent_id, "[[chunks:5]] go")
    chunks = [e for n, e in events if n == "chunk"]
    assert len(chunks) >= 2 and all(c["done"] is False for c in chunks)
    assert "".join(c["content"] for c in chunks).split() == ["w1", "w2", "w3", "w4", "w5"]
    name, done = events[-1]
    assert name == "done" and done["done"] is True
    assert done["usage"]["input_tokens"] > 0 and done["usage"]["output_tokens"] > 0
    assert ("phase", {"phase": "streaming", "detail": ""}) in events


def test_sse_tool_events_and_totals(agent_daemon) -> None:
    agent_id = spawn(agent_daemon, extra='profile = "minimal"')
    events = stream(agent_daemon, agent_id, '[[tool:file_list {"path": "."}]]')
    names = [n for n, _ in events]
    assert names.index("tool_use") < names.index("tool_result") < names.index("done")
    tool_use = dict(events)["tool_use"]
    assert tool_use["tool"] == "file_list"
    result = [e for n, e in events if n == "tool_result"][0]
    assert result["tool"] == "file_list" and result["input"] == {"path": "."} and result["is_error"] is False
    assert any(n == "phase" and e["phase"] == "tool_use" for n, e in events)
    done = events[-1][1]
    blocking = agent_daemon.post(f"/api/agents/{agent_id}/message",
                                 json={"message": '[[tool:file_list {"path": "."}]]'}).json()
    assert blocking["iterations"] == 2
    assert done["usage"]["input_tokens"] > 0 and done["iterations"] == 2


@pytest.mark.parametrize("provider,model", [("anthropic", "claude-sonnet-4-6"), ("gemini", "gemini-2.5-flash")])
def test_sse_streams_from_every_driver_family(agent_daemon, provider, model) -> None:
    """Deltas come from each provider's own streaming API, tool calls included."""
    agent_id = spawn(agent_daemon, extra='profile = "minimal"',
                     model=f'[model]\nprovider = "{provider}"\nmodel = "{model}"\n')
    events = stream(agent_daemon, agent_id, "[[chunks:4]] [[think]]")
    chunks = [e["content"] for n, e in events if n == "chunk"]
    assert len(chunks) >= 2 and "".join(chunks).split() == ["w1", "w2", "w3", "w4"]
    events = stream(agent_daemon, agent_id, '[[tool:file_list {"path": "."}]]')
    names = [n for n, _ in events]
    assert names.index("tool_use") < names.index("tool_result") < names.index("done")
    assert events[-1][1]["iterations"] == 2 and events[-1][1]["usage"]["output_tokens"] > 0


def test_sse_never_leaks_think(agent_daemon) -> None:
    agent_id = spawn(agent_daemon)
    events = stream(agent_daemon, agent_id, "[[think]] hidden thoughts")
    text = "".join(e["content"] for n, e in events if n == "chunk")
    assert "secret" not in text and "<thi" not in text and "hidden thoughts" in text


def test_sse_error_event(agent_daemon) -> None:
    agent_id = spawn(agent_daemon)
    events = stream(agent_daemon, agent_id, "[[fail:400]] bad")
    assert events[-1][0] == "error" and "openai" in events[-1][1]["error"]


def test_sse_stop_ends_stream_promptly(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    r = d.post(f"/api/agents/{agent_id}/message/stream", json={"message": "[[hang]]"}, stream=True)
    lines = r.iter_lines(decode_unicode=True)
    next(lines)  # the stream is open
    deadline = time.monotonic() + 30  # a deadline only: the first stop that finds the run ends the loop
    while not d.post(f"/api/agents/{agent_id}/stop").json()["was_running"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    events = sse_events_from(lines)
    assert events[-1][0] == "done" and events[-1][1]["stopped"] is True


def sse_events_from(lines) -> list[tuple[str, dict]]:
    events, name = [], "message"
    for line in lines:
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            events.append((name, json.loads(line[5:])))
    return events


def test_sse_client_disconnect_keeps_daemon_healthy(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    r = d.post(f"/api/agents/{agent_id}/message/stream", json={"message": "[[chunks:50]] [[pace:20]]"},
               stream=True)
    next(r.iter_lines())
    r.close()
    assert d.get("/api/health").ok
    deadline = time.monotonic() + 10
    while d.post(f"/api/agents/{agent_id}/stop").json()["was_running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.post(f"/api/agents/{agent_id}/message", json={"message": "still alive"}).json()["response"] == \
        "echo: still alive"


def test_sse_quota_is_a_json_429(agent_daemon) -> None:
    agent_id = spawn(agent_daemon, extra="[capabilities]\nmax_llm_tokens_per_hour = 1")
    agent_daemon.post(f"/api/agents/{agent_id}/message", json={"message": "spend"})
    r = agent_daemon.post(f"/api/agents/{agent_id}/message/stream", json={"message": "more"})
    assert r.status_code == 429 and "quota exceeded" in r.json()["error"] and r.headers["Retry-After"]


# -- WebSocket ----------------------------------------------------------------------------

def ws_connect(d, agent_id: str, **kwargs) -> websocket.WebSocket:
    url = d.url.replace("http://", "ws://") + f"/api/agents/{agent_id}/ws"
    ws = websocket.create_connection(url, timeout=15, **kwargs)
    first = json.loads(ws.recv())
    assert first == {"type": "connected", "agent_id": agent_id}
    return ws


def frames_until(ws, kind: str) -> list[dict]:
    frames = []
    while True:
        frame = json.loads(ws.recv())
        frames.append(frame)
        if frame["type"] == kind:
            return frames


def test_websocket_conversation(agent_daemon) -> None:
    agent_id = spawn(agent_daemon, extra='profile = "minimal"')
    ws = ws_connect(agent_daemon, agent_id)
    try:
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv()) == {"type": "pong"}
        ws.send(json.dumps({"type": "message", "content": "[[chunks:4]] hi"}))
        frames = frames_until(ws, "typing")  # typing start
        assert frames[-1]["state"] == "start"
        frames = frames_until(ws, "response")
        text = "".join(f["content"] for f in frames if f["type"] == "text_delta")
        assert text.split() == ["w1", "w2", "w3", "w4"]
        response = frames[-1]
        assert response["iterations"] == 1 and response["input_tokens"] > 0 and "cost_usd" in response
        assert frames[-2] == {"type": "typing", "state": "stop"}, "typing stop must precede the response"
        ws.send(json.dumps({"type": "message", "content": '[[tool:file_list {"path": "."}]]'}))
        frames = frames_until(ws, "response")
        kinds = [f["type"] for f in frames]
        assert kinds.index("tool_start") < kinds.index("tool_end") < kinds.index("tool_result")
        start = [f for f in frames if f["type"] == "tool_start"][0]
        end = [f for f in frames if f["type"] == "tool_end"][0]
        assert start["tool"] == "file_list" and end["id"] == start["id"] and end["input"] == {"path": "."}
        assert {"type": "typing", "state": "tool", "tool": "file_list"} in frames
        assert frames[-1]["iterations"] == 2
        ws.send(json.dumps({"type": "command", "command": "reset"}))
        frames = frames_until(ws, "command_result")
        assert frames[-1]["command"] == "reset"
        assert agent_daemon.get(f"/api/agents/{agent_id}/session").json()["message_count"] == 0
    finally:
        ws.close()


def test_websocket_limits_and_errors(agent_daemon) -> None:
    agent_id = spawn(agent_daemon)
    ws = ws_connect(agent_daemon, agent_id)
    try:
        ws.send(json.dumps({"type": "message", "content": "x" * (70 * 1024)}))
        frame = json.loads(ws.recv())
        assert frame["type"] == "error" and "too large" in frame["content"]
        ws.send(json.dumps({"type": "bogus"}))
        assert json.loads(ws.recv())["type"] == "error"
        ws.send(json.dumps({"type": "command", "command": "stop"}))
        assert json.loads(ws.recv()) == {"type": "command_result", "command": "stop", "message": "no run in progress"}
        for i in range(11):
            ws.send(json.dumps({"type": "message", "content": f"n{i}"}))
        frames = []
        while not any(f["type"] == "error" and "rate limit" in f.get("content", "") for f in frames):
            frames.append(json.loads(ws.recv()))
        ws.send(json.dumps({"type": "ping"}))
        while json.loads(ws.recv())["type"] != "pong":
            pass
    finally:
        ws.close()


def test_websocket_auth_and_unknown_agent(daemon_factory, fake_llm) -> None:
    from conftest import LLM_ENV, llm_config

    d = daemon_factory(llm_config(fake_llm).replace("[api]", 'api_key = "wskey"\n[api]', 1), api_key="wskey",
                       env_extra=LLM_ENV)
    agent_id = spawn(d)
    base = d.url.replace("http://", "ws://")
    with pytest.raises(websocket.WebSocketBadStatusException) as err:
        websocket.create_connection(f"{base}/api/agents/{agent_id}/ws", timeout=5)
    assert err.value.status_code == 401
    ws = ws_connect(d, agent_id, header=["Authorization: Bearer wskey"])
    ws.close()
    url = f"{base}/api/agents/{agent_id}/ws?token=wskey"
    ws = websocket.create_connection(url, timeout=5)
    assert json.loads(ws.recv())["type"] == "connected"
    ws.close()
    with pytest.raises(websocket.WebSocketBadStatusException) as err:
        websocket.create_connection(f"{base}/api/agents/{uuid.uuid4()}/ws?token=wskey", timeout=5)
    assert err.value.status_code == 404


def test_echo_socket_survives_abrupt_disconnects(shared_daemon) -> None:
    url = shared_daemon.url.replace("http://", "ws://") + "/api/_ws/echo"
    for _ in range(5):
        ws = websocket.create_connection(url, timeout=5)
        ws.send("hello")
        assert ws.recv() == "hello"
        ws.sock.shutdown(socket.SHUT_RDWR)
        ws.sock.close()
    sockets = [websocket.create_connection(url, timeout=10) for _ in range(24)]
    for i, ws in enumerate(sockets):
        ws.send(f"m{i}")
    assert [ws.recv() for ws in sockets] == [f"m{i}" for i in range(24)]
    for ws in sockets:
        ws.close()
    assert shared_daemon.get("/api/health").ok


# -- OpenAI-compatible API ---------------------------------------------------------------

@pytest.fixture(scope="module")
def oa(agent_daemon):
    return openai.OpenAI(base_url=f"{agent_daemon.url}/v1", api_key="unused", max_retries=0)


def test_openai_sdk_non_stream(agent_daemon, oa) -> None:
    name = f"oa-{uuid.uuid4().hex[:6]}"
    spawn(agent_daemon, name)
    completion = oa.chat.completions.create(
        model=f"agentd:{name}", messages=[{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": "[[think]] hello sdk"}])
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    assert completion.model == name
    assert completion.choices[0].message.content.strip() == "echo: hello sdk"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    by_plain_name = oa.chat.completions.create(model=name, messages=[{"role": "user", "content": "plain"}])
    assert by_plain_name.choices[0].message.content == "echo: plain"


def test_openai_params_reach_the_model(agent_daemon, oa) -> None:
    name = f"oa-{uuid.uuid4().hex[:6]}"
    agent_id = spawn(agent_daemon, name)
    image = "data:image/png;base64," + base64.b64encode(PNG).decode()
    completion = oa.chat.completions.create(
        model=agent_id, max_tokens=77, temperature=0.25,
        messages=[{"role": "system", "content": "extra rule"},
                  {"role": "user", "content": [{"type": "text", "text": "[[echo_params]]"},
                                               {"type": "image_url", "image_url": {"url": image}}]}])
    params = json.loads(completion.choices[0].message.content)
    assert params["max_tokens"] == 77 and params["temperature"] == 0.25 and params["n_images"] == 1
    assert "extra rule" in params["system"]


def test_openai_length_and_tool_usage_cover_every_call(agent_daemon, oa) -> None:
    name = f"oa-{uuid.uuid4().hex[:6]}"
    spawn(agent_daemon, name, extra='profile = "minimal"')
    completion = oa.chat.completions.create(model=name, messages=[{"role": "user", "content": "[[length]] cut"}])
    assert completion.choices[0].finish_reason == "length"
    other = spawn(agent_daemon, extra='profile = "minimal"')
    direct = agent_daemon.post(f"/api/agents/{other}/message",
                               json={"message": '[[tool:file_list {"path": "."}]]'}).json()
    completion = oa.chat.completions.create(
        model=name, messages=[{"role": "user", "content": '[[tool:file_list {"path": "."}]]'}])
    assert completion.usage.completion_tokens == direct["output_tokens"]


def test_openai_sdk_stream(agent_daemon, oa) -> None:
    name = f"oa-{uuid.uuid4().hex[:6]}"
    spawn(agent_daemon, name, extra='profile = "minimal"')
    chunks = list(oa.chat.completions.create(model=name, stream=True,
                                             messages=[{"role": "user", "content": "[[chunks:6]] [[think]] x"}]))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "secret" not in text and "w6" in text
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].choices[0].delta.content is None
    assert len({c.id for c in chunks}) == 1
    chunks = list(oa.chat.completions.create(
        model=name, stream=True, messages=[{"role": "user", "content": '[[tool:file_list {"path": "."}]]'}]))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].id and calls[0].type == "function" and calls[0].function.name == "file_list"
    assert calls[0].function.arguments == ""
    args = "".join(tc.function.arguments or "" for tc in calls[1:])
    assert json.loads(args) == {"path": "."}
    assert "tool said" in "".join(c.choices[0].delta.content or "" for c in chunks)


def test_openai_raw_stream_ends_with_done(agent_daemon) -> None:
    name = f"oa-{uuid.uuid4().hex[:6]}"
    spawn(agent_daemon, name)
    r = agent_daemon.post("/v1/chat/completions", stream=True,
                          json={"model": name, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    lines = [line for line in r.iter_lines(decode_unicode=True) if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][5:])
    assert last["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}


def test_openai_errors(agent_daemon, oa) -> None:
    name = f"oa-{uuid.uuid4().hex[:6]}"
    spawn(agent_daemon, name)
    with pytest.raises(openai.NotFoundError) as err:
        oa.chat.completions.create(model="agentd:nobody", messages=[{"role": "user", "content": "x"}])
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as err:
        oa.chat.completions.create(model=name, messages=[{"role": "system", "content": "only system"}])
    assert err.value.code == "missing_message"
    for params, word in (({"temperature": 3}, "temperature"),
                         ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
                         ({"logprobs": True}, "logprobs")):
        with pytest.raises(openai.BadRequestError) as err:
            oa.chat.completions.create(model=name, messages=[{"role": "user", "content": "x"}], **params)
        assert word in str(err.value)
    with pytest.raises(openai.BadRequestError) as err:
        oa.chat.completions.create(model=name, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
    assert "data URI" in str(err.value)
    with pytest.raises(openai.InternalServerError):
        oa.chat.completions.create(model=name, messages=[{"role": "user", "content": "[[fail:400]] x"}])
    r = agent_daemon.post("/v1/chat/completions", data="{bad", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_openai_non_vision_model_rejects_images(agent_daemon, oa) -> None:
    name = f"oa-{uuid.uuid4().hex[:6]}"
    spawn(agent_daemon, name, model='[model]\nprovider = "deepseek"\nmodel = "deepseek-chat"\n')
    image = "data:image/png;base64," + base64.b64encode(PNG).decode()
    with pytest.raises(openai.BadRequestError) as err:
        oa.chat.completions.create(model=name, messages=[{"role": "user", "content": [
            {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": image}}]}])
    assert "does not support images" in str(err.value)


def test_openai_models_list(agent_daemon, oa) -> None:
    name = f"oa-{uuid.uuid4().hex[:6]}"
    agent_id = spawn(agent_daemon, name)
    models = {m.id: m for m in oa.models.list()}
    entry = models[f"agentd:{name}"]
    assert entry.owned_by == "agentd" and entry.object == "model"
    created = agent_daemon.get(f"/api/agents/{agent_id}").json()["created_at"]
    from datetime import datetime
    assert entry.created == int(datetime.fromisoformat(created).timestamp())


def _client_threads() -> int:
    """Threads of this process but the fake LLM's connection handlers: the daemon keeps its
    keep-alive connections to the provider open for the next call, and the fake a thread
    for each."""
    return sum(1 for t in threading.enumerate() if not t.name.endswith("(process_request_thread)"))


@pytest.mark.slow
def test_fifty_mixed_streams(agent_daemon, oa) -> None:
    """50 concurrent streams over SSE, WebSocket and /v1 to 10 agents: each gets its own content."""
    names = [f"mix-{uuid.uuid4().hex[:6]}" for _ in range(10)]
    ids = [spawn(agent_daemon, n) for n in names]
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        agent_id, name = ids[i % 10], names[i % 10]
        text = f"[[reply:stream {i} ok]] [[slow:0.05]]"
        try:
            if i % 3 == 0:
                events = stream(agent_daemon, agent_id, text)
                results[i] = "".join(e["content"] for n, e in events if n == "chunk")
            elif i % 3 == 1:
                ws = ws_connect(agent_daemon, agent_id)
                ws.send(json.dumps({"type": "message", "content": text}))
                results[i] = frames_until(ws, "response")[-1]["content"]
                ws.close()
            else:
                chunks = oa.chat.completions.create(model=name, stream=True,
                                                    messages=[{"role": "user", "content": text}])
                results[i] = "".join(c.choices[0].delta.content or "" for c in chunks)
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised below
            errors.append(exc)

    threads_before = _client_threads()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert results == {i: f"stream {i} ok" for i in range(50)}
    assert _client_threads() <= threads_before + 1
    detail = agent_daemon.get("/api/health/detail").json()
    deadline = time.monotonic() + 10
    while detail["thread_pool"]["busy"] > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
        detail = agent_daemon.get("/api/health/detail").json()
    assert detail["thread_pool"]["busy"] <= 1
