"""Tests for tests/fakellm.py: every directive in all three wire formats, streamed and not, over real HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fakellm import FakeLLM, parse_script, stream_pieces  # noqa: E402

PROVIDERS = ["openai", "anthropic", "gemini"]
COMBOS = [(p, s) for p in PROVIDERS for s in (False, True)]
COMBO_IDS = [f"{p}-{'stream' if s else 'plain'}" for p, s in COMBOS]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


@pytest.fixture(autouse=True)
def _clean(fake: FakeLLM) -> None:
    fake.reset()


# --------------------------------------------------------------------------------------------------
# A tiny provider-neutral client so each directive can be tested in all six (provider, stream) combos
# --------------------------------------------------------------------------------------------------

@dataclass
class Result:
    status: int
    text: str = ""
    calls: list[tuple[str, str, dict]] = field(default_factory=list)   # (id, name, args)
    finish: str | None = None            # normalised: "stop" | "length" | "tool"
    usage: tuple[int, int] | None = None  # (input, output)
    pieces: list[str] = field(default_factory=list)  # streamed text pieces, in order
    body: Any = None
    headers: Any = None


FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool",
          "end_turn": "stop", "max_tokens": "length", "tool_use": "tool",
          "STOP": "stop", "MAX_TOKENS": "length"}


class Client:
    """Speaks one provider's wire format; history items: ("user", text|parts), ("calls", [...]),
    ("results", [(call_id, name, content), ...])."""

    def __init__(self, fake: FakeLLM, provider: str, stream: bool, key: str | None = None) -> None:
        self.fake, self.provider, self.stream, self.key = fake, provider, stream, key
        self.http = requests.Session()

    # -- request building ---------------------------------------------------------------------------

    def request(self, history: list[tuple[str, Any]], **params: Any) -> tuple[str, dict, dict]:
        headers: dict[str, str] = {}
        model = params.pop("model", "test-model")
        system = params.pop("system", None)
        images = params.pop("images", 0)
        tools = params.pop("tools", [])
        if self.provider == "openai":
            messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
            for kind, value in history:
                if kind == "user":
                    content: Any = value
                    if images:
                        content = [{"type": "text", "text": value}] + [
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}] * images
                    messages.append({"role": "user", "content": content})
                elif kind == "calls":
                    messages.append({"role": "assistant", "content": None, "tool_calls": [
                        {"id": cid, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                        for cid, n, a in value]})
                else:
                    messages += [{"role": "tool", "tool_call_id": cid, "content": c} for cid, _, c in value]
            body: dict[str, Any] = {"model": model, "messages": messages, **params}
            if tools:
                body["tools"] = [{"type": "function", "function": {"name": t, "parameters": {}}} for t in tools]
            if self.stream:
                body["stream"] = True
                body["stream_options"] = {"include_usage": True}
            if self.key:
                headers["Authorization"] = f"Bearer {self.key}"
            return f"{self.fake.openai_base}/chat/completions", body, headers
        if self.provider == "anthropic":
            messages = []
            for kind, value in history:
                if kind == "user":
                    content = value
                    if images:
                        content = [{"type": "text", "text": value}] + [{"type": "image", "source": {
                            "type": "base64", "media_type": "image/png", "data": "AAAA"}}] * images
                    messages.append({"role": "user", "content": content})
                elif kind == "calls":
                    messages.append({"role": "assistant", "content": [
                        {"type": "tool_use", "id": cid, "name": n, "input": a} for cid, n, a in value]})
                else:
                    messages.append({"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": cid, "content": c} for cid, _, c in value]})
            body = {"model": model, "messages": messages, "max_tokens": params.pop("max_tokens", 256), **params}
            if system:
                body["system"] = system
            if tools:
                body["tools"] = [{"name": t, "input_schema": {"type": "object"}} for t in tools]
            if self.stream:
                body["stream"] = True
            headers["anthropic-version"] = "2023-06-01"
            if self.key:
                headers["x-api-key"] = self.key
            return f"{self.fake.anthropic_base}/v1/messages", body, headers
        contents: list[dict[str, Any]] = []
        for kind, value in history:
            if kind == "user":
                parts: list[dict[str, Any]] = [{"text": value}]
                parts += [{"inlineData": {"mimeType": "image/png", "data": "AAAA"}}] * images
                contents.append({"role": "user", "parts": parts})
            elif kind == "calls":
                contents.append({"role": "model", "parts": [{"functionCall": {"name": n, "args": a}}
                                                            for _, n, a in value]})
            else:
                contents.append({"role": "user", "parts": [
                    {"functionResponse": {"name": n, "response": {"content": c}}} for _, n, c in value]})
        body = {"contents": contents}
        config = {}
        if "max_tokens" in params:
            config["maxOutputTokens"] = params.pop("max_tokens")
        if "temperature" in params:
            config["temperature"] = params.pop("temperature")
        if config:
            body["generationConfig"] = config
        if system:
            body["systemInstruction"] = {"parts": [{"text": system}]}
        if tools:
            body["tools"] = [{"functionDeclarations": [{"name": t} for t in tools]}]
        if self.key:
            headers["x-goog-api-key"] = self.key
        action = "streamGenerateContent?alt=sse" if self.stream else "generateContent"
        return f"{self.fake.gemini_base}/v1beta/models/{model}:{action}", body, headers

    # -- response parsing ---------------------------------------------------------------------------

    def ask(self, history: list[tuple[str, Any]] | str, timeout: float = 10, **params: Any) -> Result:
        if isinstance(history, str):
            history = [("user", history)]
        url, body, headers = self.request(history, **params)
        resp = self.http.post(url, json=body, headers=headers, timeout=timeout, stream=self.stream)
        result = Result(status=resp.status_code, headers=resp.headers)
        expected_type = "text/event-stream" if self.stream else "application/json"
        if resp.status_code != 200 or resp.headers["Content-Type"] != expected_type or resp.content.startswith(
                b"this is not json"):
            result.body = resp.content
            return result
        if not self.stream:
            result.body = resp.json()
            getattr(self, f"_plain_{self.provider}")(result, result.body)
        else:
            lines = [line.decode() for line in resp.iter_lines()]
            getattr(self, f"_stream_{self.provider}")(result, lines)
            result.text = "".join(result.pieces)
        return result

    @staticmethod
    def _plain_openai(result: Result, body: dict) -> None:
        assert body["object"] == "chat.completion"
        choice = body["choices"][0]
        message = choice["message"]
        assert message["role"] == "assistant"
        result.text = message["content"] or ""
        result.calls = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                        for c in message.get("tool_calls") or []]
        assert all(c["type"] == "function" for c in message.get("tool_calls") or [])
        result.finish = FINISH[choice["finish_reason"]]
        usage = body["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        result.usage = (usage["prompt_tokens"], usage["completion_tokens"])

    @staticmethod
    def _plain_anthropic(result: Result, body: dict) -> None:
        assert body["type"] == "message" and body["role"] == "assistant"
        for block in body["content"]:
            if block["type"] == "text":
                result.text += block["text"]
            else:
                assert block["type"] == "tool_use"
                result.calls.append((block["id"], block["name"], block["input"]))
        result.finish = FINISH[body["stop_reason"]]
        result.usage = (body["usage"]["input_tokens"], body["usage"]["output_tokens"])

    @staticmethod
    def _plain_gemini(result: Result, body: dict) -> None:
        candidate = body["candidates"][0]
        assert candidate["content"]["role"] == "model"
        for part in candidate["content"]["parts"]:
            if "text" in part:
                result.text += part["text"]
            else:
                call = part["functionCall"]
                result.calls.append(("", call["name"], call["args"]))
        result.finish = FINISH[candidate["finishReason"]]
        if result.calls:  # Gemini says STOP for function calls too
            assert result.finish == "stop"
            result.finish = "tool"
        meta = body["usageMetadata"]
        assert meta["totalTokenCount"] == meta["promptTokenCount"] + meta["candidatesTokenCount"]
        result.usage = (meta["promptTokenCount"], meta["candidatesTokenCount"])

    @staticmethod
    def _stream_openai(result: Result, lines: list[str]) -> None:
        data = [line[len("data: "):] for line in lines if line]
        assert all(line.startswith("data: ") for line in lines if line)
        assert data[-1] == "[DONE]"
        calls: dict[int, dict[str, Any]] = {}
        for raw in data[:-1]:
            chunk = json.loads(raw)
            assert chunk["object"] == "chat.completion.chunk"
            if not chunk["choices"]:
                result.usage = (chunk["usage"]["prompt_tokens"], chunk["usage"]["completion_tokens"])
                continue
            choice = chunk["choices"][0]
            delta = choice["delta"]
            if delta.get("content"):
                result.pieces.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": None, "name": None, "args": "", "frags": 0})
                if "id" in tc:
                    assert tc["type"] == "function" and slot["id"] is None
                    slot["id"], slot["name"] = tc["id"], tc["function"]["name"]
                else:
                    slot["frags"] += 1
                slot["args"] += tc["function"].get("arguments") or ""
            if choice["finish_reason"]:
                result.finish = FINISH[choice["finish_reason"]]
        for slot in calls.values():
            assert slot["frags"] >= 2, "arguments must arrive in 2+ fragments"
            result.calls.append((slot["id"], slot["name"], json.loads(slot["args"])))

    @staticmethod
    def _stream_anthropic(result: Result, lines: list[str]) -> None:
        events: list[tuple[str, dict]] = []
        name = None
        for line in lines:
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
                assert data["type"] == name
                events.append((name, data))
        kinds = [k for k, _ in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
        start = events[0][1]["message"]
        assert start["usage"]["input_tokens"] >= 1 and start["content"] == []
        blocks: dict[int, dict[str, Any]] = {}
        open_blocks: set[int] = set()
        for kind, data in events[1:-2]:
            if kind == "content_block_start":
                blocks[data["index"]] = {**data["content_block"], "json": "", "frags": 0}
                open_blocks.add(data["index"])
            elif kind == "content_block_delta":
                assert data["index"] in open_blocks
                delta = data["delta"]
                if delta["type"] == "text_delta":
                    result.pieces.append(delta["text"])
                else:
                    assert delta["type"] == "input_json_delta"
                    blocks[data["index"]]["json"] += delta["partial_json"]
                    blocks[data["index"]]["frags"] += 1
            else:
                assert kind == "content_block_stop"
                open_blocks.remove(data["index"])
        assert not open_blocks
        for block in blocks.values():
            if block["type"] == "tool_use":
                assert block["frags"] >= 2
                result.calls.append((block["id"], block["name"], json.loads(block["json"])))
        delta = events[-2][1]
        result.finish = FINISH[delta["delta"]["stop_reason"]]
        result.usage = (start["usage"]["input_tokens"], delta["usage"]["output_tokens"])

    @staticmethod
    def _stream_gemini(result: Result, lines: list[str]) -> None:
        chunks = [json.loads(line[len("data: "):]) for line in lines if line]
        assert all(line.startswith("data: ") for line in lines if line)
        for chunk in chunks:
            candidate = chunk["candidates"][0]
            for part in candidate["content"]["parts"]:
                if "text" in part:
                    if part["text"]:
                        result.pieces.append(part["text"])
                else:
                    result.calls.append(("", part["functionCall"]["name"], part["functionCall"]["args"]))
            if "finishReason" in candidate:
                assert chunk is chunks[-1]
                result.finish = FINISH[candidate["finishReason"]]
                meta = chunk["usageMetadata"]
                result.usage = (meta["promptTokenCount"], meta["candidatesTokenCount"])
        if result.calls:  # Gemini says STOP for function calls too
            assert result.finish == "stop"
            result.finish = "tool"


def run_loop(client: Client, prompt: str, max_steps: int = 50,
             tool_output: Any = lambda name, args, step: f"result {step} of {name}") -> tuple[Result, list]:
    """Drive an agent loop: execute every tool call, send results back, until a text answer."""
    history: list[tuple[str, Any]] = [("user", prompt)]
    executed = []
    for step in range(max_steps):
        result = client.ask(history)
        assert result.status == 200
        if result.finish != "tool":
            return result, executed
        assert result.calls and not result.text
        calls = [(cid or f"gem{step}_{i}", n, a) for i, (cid, n, a) in enumerate(result.calls)]
        history.append(("calls", calls))
        outputs = [(cid, n, tool_output(n, a, step)) for cid, n, a in calls]
        executed.append(calls)
        history.append(("results", outputs))
    raise AssertionError("loop did not finish")


@pytest.fixture(params=COMBOS, ids=COMBO_IDS)
def client(request: pytest.FixtureRequest, fake: FakeLLM) -> Client:
    provider, stream = request.param
    return Client(fake, provider, stream)


# --------------------------------------------------------------------------------------------------
# Directive parsing (pure)
# --------------------------------------------------------------------------------------------------

def test_parse_script_combined_and_literal() -> None:
    script = parse_script('Hi [[tool:search {"q": "a ]] b", "l": [[1]]} x3]] there [[nope]] [[slow:0.5]]'
                          ' [[pace:20]] [[fail:429 times=2 retry_after=7]] [[think:unclosed]] [[chunks:4]]')
    assert script.tools == [("search", {"q": "a ]] b", "l": [[1]]})] and script.tool_repeat == 3
    assert not script.parallel
    assert script.slow == 0.5 and script.pace == pytest.approx(0.02) and script.chunks == 4
    assert (script.fail_status, script.fail_times, script.retry_after) == (429, 2, "7")
    assert script.think == "unclosed"
    assert script.text.split() == ["Hi", "there", "[[nope]]"]


def test_parse_script_tools_and_flags() -> None:
    script = parse_script("[[tools:a {} | b {\"x\": 1}|c]] [[garbage]][[hang]][[length]][[echo_params]][[reply:ok then]]")
    assert script.parallel and script.tools == [("a", {}), ("b", {"x": 1}), ("c", {})]
    assert script.garbage and script.hang and script.length and script.echo_params
    assert script.reply == "ok then" and script.text == ""
    for bad in ("[[tool:x [1]]]", "[[slow:abc]]", "[[think:maybe]]", "[[fail:abc]]", "[[reply:unterminated"):
        assert parse_script(bad).text == bad


def test_stream_pieces_split_think_tags() -> None:
    pieces = stream_pieces("<think>secret reasoning</think>echo: hi")
    assert "".join(pieces) == "<think>secret reasoning</think>echo: hi"
    assert pieces[:2] == ["<thi", "nk>secret"]
    assert not any("<think>" in p or "</think>" in p for p in pieces)
    assert stream_pieces("w1 w2  w3 ") == ["w1", " w2", "  w3", " "]


# --------------------------------------------------------------------------------------------------
# Directives, in every wire format, streamed and not
# --------------------------------------------------------------------------------------------------

def test_echo_and_usage(client: Client) -> None:
    result = client.ask("Hello there   big world")
    assert result.status == 200
    assert result.text == "echo: Hello there   big world"
    assert result.finish == "stop" and not result.calls
    assert result.usage == (4, 5)


def test_echo_strips_directives_and_counts_system(client: Client) -> None:
    result = client.ask("  [[slow:0]] one two [[pace:0]] ", system="be brief please")
    assert result.text == "echo: one two"
    assert result.usage == (2 + 2 + 3, 3)  # directive words count as input words


def test_reply(client: Client) -> None:
    result = client.ask("[[reply:Exactly this, with  spaces!]]")
    assert result.text == "Exactly this, with  spaces!"
    assert result.usage[1] == 4


def test_single_tool_call_then_answer(client: Client) -> None:
    first = client.ask('please [[tool:search {"query": "cats and dogs", "n": [1, 2]}]]')
    assert first.finish == "tool" and first.text == ""
    assert [(n, a) for _, n, a in first.calls] == [("search", {"query": "cats and dogs", "n": [1, 2]})]
    if client.provider == "openai":
        assert first.calls[0][0].startswith("call_")
    elif client.provider == "anthropic":
        assert first.calls[0][0].startswith("toolu_")
    assert first.usage[1] == 1
    final, executed = run_loop(client, 'please [[tool:search {"query": "cats and dogs", "n": [1, 2]}]]')
    assert len(executed) == 1
    assert final.text == "tool said: result 0 of search" and final.finish == "stop"


def test_tool_repeat_xn(client: Client) -> None:
    final, executed = run_loop(client, "[[tool:step {} x4]] go")
    assert [len(c) for c in executed] == [1, 1, 1, 1]
    assert final.text == "tool said: result 3 of step"
    assert len(client.fake.requests) == 5


def test_tool_result_truncated_to_500(client: Client) -> None:
    final, _ = run_loop(client, "[[tool:big]]", tool_output=lambda *_: "x" * 2000)
    assert final.text == "tool said: " + "x" * 500


def test_parallel_tools(client: Client) -> None:
    first = client.ask('[[tools:read {"path": "a.txt"} | list {} | read {"path": "b.txt"}]]')
    assert first.finish == "tool"
    assert [(n, a) for _, n, a in first.calls] == [("read", {"path": "a.txt"}), ("list", {}),
                                                  ("read", {"path": "b.txt"})]
    assert first.usage[1] == 3
    if client.provider != "gemini":
        assert len({cid for cid, _, _ in first.calls}) == 3
    final, executed = run_loop(client, '[[tools:read {"path": "a.txt"} | list {} | read {"path": "b.txt"}]]',
                               tool_output=lambda name, args, step: f"{name}:{args.get('path', '-')}")
    assert [len(c) for c in executed] == [3]
    assert final.text == "tool said: read:b.txt"


def test_think(client: Client) -> None:
    result = client.ask("[[think]] hi")
    assert result.text == "<think>secret reasoning</think>echo: hi"
    if client.stream:
        assert "<thi" in result.pieces and any(p.startswith("nk>") for p in result.pieces)
        assert not any("<think>" in p for p in result.pieces)


def test_think_unclosed(client: Client) -> None:
    result = client.ask("[[think:unclosed]] hi")
    assert result.text == "echo: hi<think>never closed..."
    if client.stream:
        assert not any("<think>" in p for p in result.pieces)
        assert any(p.endswith("<thi") for p in result.pieces)


def test_slow(client: Client) -> None:
    started = time.monotonic()
    result = client.ask("[[slow:0.2]] x")
    assert time.monotonic() - started >= 0.2
    assert result.text == "echo: x"


def test_chunks(client: Client) -> None:
    result = client.ask("[[chunks:7]]")
    assert result.text == "w1 w2 w3 w4 w5 w6 w7"
    assert result.usage[1] == 7
    if client.stream:
        assert result.pieces == ["w1", " w2", " w3", " w4", " w5", " w6", " w7"]


def test_pace_only_delays_streams(client: Client) -> None:
    started = time.monotonic()
    result = client.ask("[[pace:30]] [[chunks:3]]")
    assert result.text == "w1 w2 w3"
    if client.stream:  # at least (events - 1) * 30 ms; every format sends >= 3 events here
        assert time.monotonic() - started >= 0.06


def test_fail(client: Client) -> None:
    result = client.ask("[[fail:503]] nope")
    assert result.status == 503
    assert_error_shape(client.provider, 503, json.loads(result.body))
    assert client.ask("[[fail:503]] nope").status == 503  # every time without times=


def test_fail_times_then_success_and_reset(client: Client) -> None:
    prompt = "[[fail:500 times=2]] flaky"
    assert [client.ask(prompt).status for _ in range(3)] == [500, 500, 200]
    assert client.ask(prompt).text == "echo: flaky"
    assert client.ask("[[fail:500 times=2]] other prompt").status == 500  # keyed by exact text
    client.fake.reset()
    assert client.ask(prompt).status == 500


def test_fail_retry_after(client: Client) -> None:
    result = client.ask("[[fail:429 retry_after=2]]")
    assert result.status == 429 and result.headers["Retry-After"] == "2"
    assert_error_shape(client.provider, 429, json.loads(result.body))
    assert "Retry-After" not in client.ask("[[fail:429]]").headers


def test_fail_during_tool_loop_counts_per_prompt(client: Client) -> None:
    prompt = "[[fail:529 times=1]] [[tool:t {} x2]]"
    assert client.ask(prompt).status == 529
    final, executed = run_loop(client, prompt)
    assert len(executed) == 2 and final.text.startswith("tool said:")


def test_garbage(client: Client) -> None:
    result = client.ask("[[garbage]]")
    assert result.status == 200
    assert result.headers["Content-Type"] == "application/json"
    assert result.body == b"this is not json{{{"


def test_length(client: Client) -> None:
    result = client.ask("[[length]] [[chunks:5]]")
    assert result.finish == "length"
    assert result.text == "w1 w2 w3"
    result = client.ask("[[length]] tell me a long story")
    assert result.finish == "length" and result.text == "echo: tell me"


def test_echo_params(client: Client) -> None:
    result = client.ask("[[echo_params]] look", model="my-model", max_tokens=123, temperature=0.25,
                        images=2, tools=["a", "b", "c"], system="You are terse.")
    assert json.loads(result.text) == {"max_tokens": 123, "temperature": 0.25, "model": "my-model",
                                       "n_images": 2, "n_tools": 3, "system": "You are terse."}


def test_echo_params_defaults(client: Client) -> None:
    params = json.loads(client.ask("[[echo_params]]", model="m2").text)
    assert params["n_images"] == 0 and params["n_tools"] == 0 and params["system"] is None
    assert params["temperature"] is None and params["model"] == "m2"


def test_model_echoed(client: Client) -> None:
    url, body, headers = client.request([("user", "hi")], model="some-model-7")
    text = requests.post(url, json=body, headers=headers, timeout=10).text
    assert text.count("some-model-7") >= 1 and "test-model" not in text
    assert client.fake.requests[-1]["provider"] == client.provider


def test_hang_times_out_client_and_stop_is_prompt() -> None:
    with FakeLLM() as server:
        for provider in PROVIDERS:
            client = Client(server, provider, stream=False)
            with pytest.raises(requests.exceptions.ReadTimeout):
                client.ask("[[hang]]", timeout=0.3)
        # a request still hanging when stop() is called must not delay it
        hung = Client(server, "openai", stream=True)
        errors: list[BaseException] = []

        def call() -> None:
            try:
                hung.ask("[[hang]]", timeout=30)
            except BaseException as exc:  # noqa: BLE001 - any failure ends the request
                errors.append(exc)

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        assert server.wait_requests(4, timeout=5)
        started = time.monotonic()
        server.stop()
        assert time.monotonic() - started < 3
        thread.join(5)
        assert not thread.is_alive() and errors  # the connection was closed on it
        assert all(e["status"] is None for e in server.requests)


# --------------------------------------------------------------------------------------------------
# Streaming transport
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_stream_is_incremental(fake: FakeLLM, provider: str) -> None:
    """The first event reaches the client while the server is still writing the rest."""
    url, body, headers = Client(fake, provider, stream=True).request([("user", "[[pace:80]] [[chunks:6]]")])
    with requests.post(url, json=body, headers=headers, stream=True, timeout=10) as resp:
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith(b"data: "))
        entry = fake.requests[-1]
        assert entry["status"] == 200 and entry["done"] is None  # server has not finished writing
        got_first = time.time()
        rest = [line for line in lines if line]
    assert first and rest
    assert entry["done"] is not None and entry["done"] > got_first


@pytest.mark.parametrize("provider", PROVIDERS)
def test_streams_keep_connection_alive(fake: FakeLLM, provider: str) -> None:
    client = Client(fake, provider, stream=True)
    for _ in range(4):
        assert client.ask("[[chunks:3]]").text == "w1 w2 w3"
        assert client.ask("[[tool:t {}]]").calls
    assert len({entry["peer"] for entry in fake.requests}) == 1
    assert all(entry["headers"]["Content-Type"] == "application/json" for entry in fake.requests)


def test_openai_stream_shape(fake: FakeLLM) -> None:
    url, body, _ = Client(fake, "openai", stream=True).request([("user", "[[chunks:2]]")])
    del body["stream_options"]  # the usage chunk is sent even when not asked for
    resp = requests.post(url, json=body, timeout=10)
    assert resp.headers["Content-Type"] == "text/event-stream"
    assert resp.headers["Transfer-Encoding"] == "chunked"
    events = [line for line in resp.text.split("\n\n") if line]
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert events[-1] == "data: [DONE]"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert len({c["id"] for c in chunks}) == 1 and all(c["model"] == "test-model" for c in chunks)


def test_anthropic_event_sequence(fake: FakeLLM) -> None:
    url, body, headers = Client(fake, "anthropic", stream=True).request([("user", "[[tools:a {} | b {\"k\": \"v\"}]]")])
    resp = requests.post(url, json=body, headers=headers, timeout=10)
    names = [line[len("event: "):] for line in resp.text.splitlines() if line.startswith("event: ")]
    assert names == ["message_start",
                     "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]


def test_gemini_stream_variants(fake: FakeLLM) -> None:
    base = f"{fake.gemini_base}/v1beta/models/gm:streamGenerateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": "[[chunks:3]]"}]}]}
    sse = requests.post(base + "?alt=sse", json=body, timeout=10)
    assert sse.headers["Content-Type"] == "text/event-stream"
    assert sse.text.count("\r\n\r\n") == 3 and sse.text.startswith("data: {")
    array = requests.post(base, json=body, timeout=10).json()  # no alt=sse: a JSON array
    assert "".join(c["candidates"][0]["content"]["parts"][0]["text"] for c in array) == "w1 w2 w3"
    assert array[-1]["candidates"][0]["finishReason"] == "STOP"
    snake = {"contents": [{"role": "user", "parts": [{"text": "[[echo_params]]"}]}],
             "generation_config": {"max_output_tokens": 9}, "system_instruction": {"parts": [{"text": "sys"}]}}
    plain = requests.post(f"{fake.gemini_base}/v1/models/gm:generateContent", json=snake, timeout=10).json()
    params = json.loads(plain["candidates"][0]["content"]["parts"][0]["text"])
    assert params["max_tokens"] == 9 and params["system"] == "sys" and params["model"] == "gm"


# --------------------------------------------------------------------------------------------------
# Which message is scripted
# --------------------------------------------------------------------------------------------------

def test_openai_last_user_message_and_parts(fake: FakeLLM) -> None:
    messages = [{"role": "system", "content": "s1"}, {"role": "developer", "content": "s2"},
                {"role": "user", "content": "[[reply:old]]"}, {"role": "assistant", "content": "old"},
                {"role": "user", "content": [{"type": "text", "text": "new"}, {"type": "image_url", "image_url": {}},
                                             {"type": "text", "text": "[[echo_params]]"}]}]
    body = requests.post(f"{fake.openai_base}/chat/completions", json={"model": "x", "messages": messages,
                                                                      "max_completion_tokens": 5}).json()
    params = json.loads(body["choices"][0]["message"]["content"])
    assert params["system"] == "s1\ns2" and params["n_images"] == 1 and params["max_tokens"] == 5


def test_anthropic_skips_tool_result_only_user_messages(fake: FakeLLM) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "[[tool:t {} x2]]"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "1", "name": "t", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1",
                                              "content": [{"type": "text", "text": "first"}]}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "2", "name": "t", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "2", "content": "second"}]}]
    body = requests.post(f"{fake.anthropic_base}/v1/messages",
                         json={"model": "c", "max_tokens": 10, "messages": messages,
                               "system": [{"type": "text", "text": "sys prompt"}]}).json()
    assert body["content"] == [{"type": "text", "text": "tool said: second"}]
    assert body["usage"]["input_tokens"] == 3 + 1 + 1 + 2  # "[[tool:t {} x2]]" + two tool results + system


def test_gemini_function_response_results(fake: FakeLLM) -> None:
    contents = [{"role": "user", "parts": [{"text": "[[tool:f {\"a\": 1}]]"}]},
                {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"a": 1}}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"x": [1, 2]}}}]}]
    body = requests.post(f"{fake.gemini_base}/v1beta/models/g:generateContent", json={"contents": contents}).json()
    assert body["candidates"][0]["content"]["parts"] == [{"text": 'tool said: {"x":[1,2]}'}]


# --------------------------------------------------------------------------------------------------
# Auth, errors, models, log, lifecycle
# --------------------------------------------------------------------------------------------------

def assert_error_shape(provider: str, status: int, body: dict) -> None:
    if provider == "openai":
        assert set(body["error"]) == {"message", "type", "param", "code"}
    elif provider == "anthropic":
        assert body["type"] == "error" and {"type", "message"} <= set(body["error"])
        expected = {401: "authentication_error", 429: "rate_limit_error", 529: "overloaded_error",
                    503: "api_error", 400: "invalid_request_error"}.get(status)
        if expected:
            assert body["error"]["type"] == expected
    else:
        assert body["error"]["code"] == status and body["error"]["message"]
        expected = {401: "UNAUTHENTICATED", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE",
                    400: "INVALID_ARGUMENT"}.get(status)
        if expected:
            assert body["error"]["status"] == expected


@pytest.mark.parametrize("provider,stream", COMBOS, ids=COMBO_IDS)
def test_auth(provider: str, stream: bool) -> None:
    with FakeLLM(required_key="sek-ret") as server:
        for key in (None, "wrong"):
            result = Client(server, provider, stream, key=key).ask("hi")
            assert result.status == 401
            assert_error_shape(provider, 401, json.loads(result.body))
        assert Client(server, provider, stream, key="sek-ret").ask("hi").text == "echo: hi"
        if provider == "gemini":
            url, body, _ = Client(server, provider, stream).request([("user", "q")])
            sep = "&" if "?" in url else "?"
            assert requests.post(f"{url}{sep}key=sek-ret", json=body, timeout=5).status_code == 200
        if provider == "anthropic":  # a Bearer token is not an Anthropic key
            url, body, _ = Client(server, provider, stream).request([("user", "q")])
            assert requests.post(url, json=body, headers={"Authorization": "Bearer sek-ret"}).status_code == 401


def test_models_endpoints() -> None:
    with FakeLLM(required_key="k") as server:
        assert requests.get(f"{server.openai_base}/models").status_code == 401
        openai_list = requests.get(f"{server.openai_base}/models", headers={"Authorization": "Bearer k"}).json()
        assert openai_list["object"] == "list" and openai_list["data"][0]["object"] == "model"
        denied = requests.get(f"{server.anthropic_base}/v1/models", headers={"x-api-key": "bad"})
        assert denied.status_code == 401 and denied.json()["type"] == "error"
        claude = requests.get(f"{server.anthropic_base}/v1/models", headers={"x-api-key": "k"}).json()
        assert claude["data"][0]["type"] == "model" and claude["has_more"] is False
        gemini = requests.get(f"{server.gemini_base}/v1beta/models?key=k").json()
        assert gemini["models"][0]["name"].startswith("models/")


def test_bad_requests(fake: FakeLLM) -> None:
    bad = requests.post(f"{fake.openai_base}/chat/completions", data=b"{nope",
                        headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    empty = requests.post(f"{fake.anthropic_base}/v1/messages", json={"model": "m", "messages": []})
    assert empty.status_code == 400 and empty.json()["error"]["type"] == "invalid_request_error"
    nogem = requests.post(f"{fake.gemini_base}/v1beta/models/g:generateContent", json={})
    assert nogem.status_code == 400 and nogem.json()["error"]["status"] == "INVALID_ARGUMENT"
    missing = requests.get(f"{fake.url}/nowhere")
    assert missing.status_code == 404 and "error" in missing.json()
    assert requests.get(fake.url).json()["ok"] is True


def test_request_log(fake: FakeLLM) -> None:
    before = time.time()
    requests.post(f"{fake.gemini_base}/v1beta/models/g1:generateContent?alt=json&key=abc",
                  json={"contents": [{"parts": [{"text": "hey"}]}]}, headers={"X-Custom": "Yes"})
    requests.get(f"{fake.openai_base}/models")
    first, second = fake.requests
    assert first["path"] == "/v1beta/models/g1:generateContent" and first["method"] == "POST"
    assert first["query"] == {"alt": "json", "key": "abc"}
    assert first["json"] == {"contents": [{"parts": [{"text": "hey"}]}]}
    assert first["headers"]["x-custom"] == "Yes" and first["headers"]["X-Custom"] == "Yes"
    assert "x-CUSTOM" in first["headers"]
    assert before <= first["time"] <= second["time"] <= time.time()
    assert first["status"] == 200 and first["done"] >= first["time"] and first["provider"] == "gemini"
    assert second["method"] == "GET" and second["json"] is None
    assert requests.get(f"{fake.url}/_fakellm/stats").json() == {"requests": 3}
    assert requests.post(f"{fake.url}/_fakellm/reset").json() == {"ok": True}
    assert fake.requests == []  # the reset request's own entry is cleared too


def test_concurrent_requests_are_all_logged(fake: FakeLLM) -> None:
    clients = [Client(fake, PROVIDERS[i % 3], stream=bool(i % 2)) for i in range(12)]
    results: list[str] = []

    def work(client: Client, n: int) -> None:
        for k in range(5):
            results.append(client.ask(f"[[reply:{n}-{k}]]").text)

    threads = [threading.Thread(target=work, args=(c, n)) for n, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(results) == sorted(f"{n}-{k}" for n in range(12) for k in range(5))
    assert len(fake.requests) == 60


def test_max_log_trims() -> None:
    with FakeLLM(max_log=5) as server:
        client = Client(server, "openai", stream=False)
        for i in range(30):
            client.ask(f"[[reply:{i}]]")
        assert 5 <= len(server.requests) <= 10
        assert server.requests[-1]["json"]["messages"][0]["content"] == "[[reply:29]]"


def test_cli_foreground() -> None:
    script = Path(__file__).resolve().parents[1] / "fakellm.py"
    proc = subprocess.Popen([sys.executable, str(script), "--port", "0", "--key", "kk"],
                            stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        resp = requests.post(f"{url}/v1/messages", headers={"x-api-key": "kk"}, timeout=5,
                             json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "yo"}]})
        assert resp.json()["content"][0]["text"] == "echo: yo"
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_openai_sdk_compatibility(fake: FakeLLM) -> None:
    openai = pytest.importorskip("openai")
    sdk = openai.OpenAI(base_url=fake.openai_base, api_key="x", max_retries=0)
    reply = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[tools:a {\"x\": 1} | b]]"}])
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["a", "b"]
    stream = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[chunks:3]]"}],
                                         stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "w1 w2 w3"
    assert chunks[-1].usage.completion_tokens == 3
    with pytest.raises(openai.RateLimitError):
        sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[fail:429]]"}])
