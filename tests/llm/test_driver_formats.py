"""The three wire formats value by value: what each driver sends (URL, headers, body: system
prompt placement, tool schemas, max_tokens, temperature, stop and the other parameters), what it
reads back (text, tool calls and their arguments, usage numbers, finish reasons), the stream
events it emits, and how provider errors become `LLMError`s (kind, HTTP status, Retry-After).

Pure functions are checked with hand-made provider answers; the same bodies are then checked
on the wire against the fake provider (tests/fakellm.py records every request).
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
import requests

from agentd.llm import drivers
from agentd.llm.drivers import anthropic, assemble, gemini, openai_compat
from agentd.llm.drivers.assemble import Assembler
from agentd.llm.drivers.guard import CallGuard
from agentd.llm.types import (ChatRequest, ChatResponse, GenerationParams, ImagePart, LLMError, Message,
                              ProviderEndpoint, TextDelta, ToolCall, ToolCallDelta, ToolCallEnd, ToolCallStart,
                              ToolSpec, Usage)
from upstream_stub import answer as stub_answer
from upstream_stub import stalled, upstream

KEY = "sk-formats"
EP = {kind: ProviderEndpoint("acme", kind, "http://up.example/api/", api_key="k-1")
      for kind in ("openai", "anthropic", "gemini")}
SCHEMA = {"type": "object", "properties": {"path": {"type": "string", "minLength": 1}},
          "required": ["path"], "additionalProperties": False}
READ = ToolSpec("file_read", "read a file", SCHEMA)
PARAMS = GenerationParams(top_p=0.9, stop=("END", "STOP"), seed=7, presence_penalty=0.5, frequency_penalty=-0.25,
                          response_format={"type": "json_object"}, user="u-1")
JSON_HINT = "Answer with one valid JSON object only: no prose, no code fences."


def full(**kw) -> ChatRequest:
    """A request with every option set; temperature 0 (a common, falsy value) must still be sent."""
    fields = dict(model="m-1", messages=[Message("user", "hi")], system="be brief", tools=[READ], max_tokens=77,
                  temperature=0.0, params=PARAMS)
    fields.update(kw)
    return ChatRequest(**fields)


def minimal() -> ChatRequest:
    return ChatRequest(model="m-1", messages=[Message("user", "hi")])


class _Raw:
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    def read1(self, size: int, decode_content: bool = True) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


def streamed(fmt, body: bytes | list[bytes], kind: str) -> tuple[ChatResponse, list]:
    """Run `fmt.parse_stream` over an SSE body; the response and the events it emitted."""
    r = requests.Response()
    r.raw = _Raw(body if isinstance(body, list) else [body])
    seen: list = []
    guard = CallGuard(time.monotonic() + 5, None, threading.Event())
    return fmt.parse_stream(EP[kind], "m1", r, seen.append, guard), seen


def sse(*objects: object, sep: str = "\n\n") -> bytes:
    return "".join(f"data: {o if isinstance(o, str) else json.dumps(o)}{sep}" for o in objects).encode()


def named(*pairs: tuple[str, object]) -> bytes:
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in pairs).encode()


def bad(fmt, kind: str, data: dict) -> str:
    with pytest.raises(LLMError) as caught:
        fmt.parse(EP[kind], "m1", data)
    assert caught.value.kind == "bad_response"
    return caught.value.message


# -- OpenAI -----------------------------------------------------------------------------------

OPENAI_FULL = {"model": "m-1", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
               "tools": [{"type": "function", "function": {"name": "file_read", "description": "read a file",
                                                           "parameters": SCHEMA}}],
               "max_tokens": 77, "temperature": 0.0, "top_p": 0.9, "seed": 7, "presence_penalty": 0.5,
               "frequency_penalty": -0.25, "response_format": {"type": "json_object"}, "user": "u-1",
               "stop": ["END", "STOP"]}


def test_openai_request_body() -> None:
    url, headers, body = openai_compat.prepare(EP["openai"], full(), False)
    assert url == "http://up.example/api/chat/completions"
    assert headers == {"Authorization": "Bearer k-1"}
    assert body == OPENAI_FULL, "BUG: the OpenAI request body lost or renamed a field"
    _, _, body = openai_compat.prepare(EP["openai"], full(), True)
    assert body == {**OPENAI_FULL, "stream": True, "stream_options": {"include_usage": True}}
    keyless = ProviderEndpoint("acme", "openai", "http://up.example/v1", key_required=False)
    url, headers, body = openai_compat.prepare(keyless, minimal(), False)
    assert (url, headers, body) == ("http://up.example/v1/chat/completions", {},
                                    {"model": "m-1", "messages": [{"role": "user", "content": "hi"}]})
    assert openai_compat.UNSUPPORTED_PARAMS == frozenset()


def test_openai_message_shapes() -> None:
    call = ToolCall("c1", "f", {"b": 1, "a": "x y"})
    msgs = [Message("user", "look", images=[ImagePart("image/png", "AAA")]),
            Message("user", "", images=[ImagePart("image/jpeg", "BBB")]),
            Message("assistant", "", tool_calls=[call]),
            Message("assistant", "let me", tool_calls=[call]),
            Message("tool", "out", tool_call_id="c1", tool_name="f"),
            Message("tool", "lost"),
            Message("assistant", "done")]
    _, _, body = openai_compat.prepare(EP["openai"], ChatRequest(model="m", messages=msgs), False)
    fn = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": "x y"}'}}
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,BBB"}}]},
        {"role": "assistant", "content": None, "tool_calls": [fn]},
        {"role": "assistant", "content": "let me", "tool_calls": [fn]},
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
        {"role": "tool", "tool_call_id": "", "content": "lost"},
        {"role": "assistant", "content": "done"}]


def test_openai_answer_parsing() -> None:
    data = {"model": "served-m", "usage": {"prompt_tokens": 11, "completion_tokens": 5},
            "choices": [{"finish_reason": "stop", "message": {"content": "hello", "tool_calls": [
                "junk", {"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}},
                {"function": {"name": "g"}}, {"id": "c3"}]}}]}
    r = openai_compat.parse(EP["openai"], "m1", data)
    assert r == ChatResponse(text="hello", tool_calls=[ToolCall("c1", "f", {"a": 1}), ToolCall("call_2", "g", {}),
                                                       ToolCall("c3", "", {})],
                             finish_reason="tool_calls", usage=Usage(11, 5), model="served-m")
    plain = openai_compat.parse(EP["openai"], "m1", {"choices": [{"message": {"content": None}}]})
    assert plain == ChatResponse(text="", finish_reason="stop", usage=Usage(0, 0), model="m1")
    listed = openai_compat.parse(EP["openai"], "m1", {"choices": [{"message": {"content": [{"type": "text"}]}}],
                                                      "usage": {"prompt_tokens": 3}})
    assert (listed.text, listed.usage) == ("", Usage(3, 0))
    assert openai_compat.parse(EP["openai"], "m1", {"choices": [{"finish_reason": "length"}]}).text == ""


@pytest.mark.parametrize("reason,finish", [("stop", "stop"), ("length", "length"), ("tool_calls", "tool_calls"),
                                           ("function_call", "tool_calls"), ("content_filter", "stop"),
                                           ("weird", "stop"), (None, "stop")])
def test_openai_finish_reasons(reason, finish) -> None:
    r = openai_compat.parse(EP["openai"], "m1", {"choices": [{"message": {"content": "x"}, "finish_reason": reason}]})
    assert r.finish_reason == finish, f"BUG: finish_reason {reason!r} mapped to {r.finish_reason!r}"


def test_openai_unusable_answers() -> None:
    for data in ({}, {"choices": []}, {"choices": "x"}, {"choices": ["x"]}):
        assert bad(openai_compat, "openai", data) == "acme model m1: unusable response: no choices in the answer"


def test_openai_stream() -> None:
    def tc(**call) -> dict:
        return {"choices": [{"delta": {"tool_calls": [call]}, "finish_reason": None}]}

    body = sse({"choices": [{"delta": {"role": "assistant", "content": ""}}], "usage": None},
               {"choices": [{"delta": {"content": "Hel"}}]}, {"choices": [{"delta": {"content": "lo"}}]},
               tc(index=0, id="c1", function={"name": "f", "arguments": ""}),
               tc(index=0, function={"arguments": '{"a":'}), tc(index=0, function={"arguments": "1}"}),
               tc(index=1, id="c2", function={"name": "g"}), tc(index=1, function={}),
               tc(index=2, id="c3", function={}),
               {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
               {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}},
               "[DONE]", {"choices": [{"delta": {"content": "after the end"}}]})
    r, seen = streamed(openai_compat, body, "openai")
    assert seen == [TextDelta("Hel"), TextDelta("lo"), ToolCallStart(0, "c1", "f"), ToolCallDelta(0, '{"a":'),
                    ToolCallDelta(0, "1}"), ToolCallStart(1, "c2", "g"), ToolCallStart(2, "c3", ""),
                    ToolCallEnd(0, "c1", "f", {"a": 1}), ToolCallEnd(1, "c2", "g", {}), ToolCallEnd(2, "c3", "", {})]
    assert r == ChatResponse(text="Hello", tool_calls=[ToolCall("c1", "f", {"a": 1}), ToolCall("c2", "g", {})],
                             finish_reason="tool_calls", usage=Usage(9, 4), model="m1")


def test_openai_stream_without_index_done_or_usage() -> None:
    body = sse({"choices": [{"delta": {"tool_calls": [{"id": "c9", "function": {"name": "g", "arguments": "{}"}}]}}]},
               {"choices": [{"delta": {"content": 5}, "finish_reason": "length"}]}, {"usage": {}})
    r, seen = streamed(openai_compat, body, "openai")
    assert seen == [ToolCallStart(0, "c9", "g"), ToolCallDelta(0, "{}"), ToolCallEnd(0, "c9", "g", {})], \
        "BUG: a tool-call chunk without an index is not call 0"
    assert (r.tool_calls, r.usage) == ([ToolCall("c9", "g", {})], Usage(0, 0))
    r, _ = streamed(openai_compat, sse({"choices": [{"delta": {"content": "ab"}, "finish_reason": "length"}]}),
                    "openai")
    assert (r.text, r.finish_reason) == ("ab", "length")
    r, _ = streamed(openai_compat, sse({"choices": [{"delta": {"content": "ab"}, "finish_reason": "odd"}]}), "openai")
    assert r.finish_reason == "stop"
    r, _ = streamed(openai_compat, b"data: {\"choices\": [{}]}\n\ndata:  [DONE] \n\n", "openai")
    assert (r.text, r.finish_reason) == ("", "stop")


def test_openai_stream_errors() -> None:
    with pytest.raises(LLMError) as caught:
        streamed(openai_compat, sse({"choices": [{"delta": {"content": "a"}}]}), "openai")
    assert (caught.value.kind, caught.value.message) == (
        "truncated", "acme model m1: the stream was cut off before the answer was complete "
                     "(no [DONE] or finish_reason)")
    with pytest.raises(LLMError) as caught:
        streamed(openai_compat, sse({"error": {"message": "overloaded"}}), "openai")
    assert (caught.value.kind, caught.value.message) == (
        "bad_response", "acme model m1: unusable response: the stream reported an error: {'message': 'overloaded'}")


# -- Anthropic --------------------------------------------------------------------------------

ANTHROPIC_FULL = {"model": "m-1", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                  "max_tokens": 77, "system": "be brief\n\n" + JSON_HINT,
                  "tools": [{"name": "file_read", "description": "read a file", "input_schema": SCHEMA}],
                  "temperature": 0.0, "top_p": 0.9, "stop_sequences": ["END", "STOP"], "metadata": {"user_id": "u-1"}}


def test_anthropic_request_body(caplog) -> None:
    caplog.set_level(logging.INFO, logger="agentd.llm")
    url, headers, body = anthropic.prepare(EP["anthropic"], full(), False)
    assert url == "http://up.example/api/v1/messages"
    assert headers == {"anthropic-version": "2023-06-01", "x-api-key": "k-1"}
    assert body == ANTHROPIC_FULL, "BUG: the Anthropic request body lost or renamed a field"
    assert [r.getMessage() for r in caplog.records] == [
        "acme model m-1: dropping seed, presence_penalty, frequency_penalty (no equivalent in the anthropic API)"]
    _, _, body = anthropic.prepare(EP["anthropic"], full(), True)
    assert body == {**ANTHROPIC_FULL, "stream": True}
    keyless = ProviderEndpoint("acme", "anthropic", "http://up.example", key_required=False)
    url, headers, body = anthropic.prepare(keyless, minimal(), False)
    assert (url, headers) == ("http://up.example/v1/messages", {"anthropic-version": "2023-06-01"})
    assert body == {"model": "m-1", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                    "max_tokens": 4096}, "BUG: the required max_tokens is missing or not the default"
    _, _, body = anthropic.prepare(keyless, full(system="", params=GenerationParams(response_format={
        "type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}})), False)
    assert body["system"] == JSON_HINT + ' It must match this JSON schema: {"type":"object"}'
    assert "top_p" not in body and "stop_sequences" not in body and "metadata" not in body


def test_anthropic_turns_and_blocks() -> None:
    call = ToolCall("t1", "f", {"a": 1})
    msgs = [Message("system", "ignored? no: a user-side turn"), Message("user", "look", images=[ImagePart("image/png", "AAA")]),
            Message("assistant", "let me", tool_calls=[call]), Message("tool", "out", tool_call_id="t1"),
            Message("tool", "boom", is_error=True), Message("user", "next"), Message("assistant", "")]
    _, _, body = anthropic.prepare(EP["anthropic"], ChatRequest(model="m", messages=msgs), False)
    assert body["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "ignored? no: a user-side turn"}, {"type": "text", "text": "look"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}}]},
        {"role": "assistant", "content": [{"type": "text", "text": "let me"},
                                          {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "out", "is_error": False},
            {"type": "tool_result", "tool_use_id": "", "content": "boom", "is_error": True},
            {"type": "text", "text": "next"}]}], "BUG: Anthropic turns or content blocks are built wrongly"


def test_anthropic_answer_parsing() -> None:
    data = {"model": "claude-x", "stop_reason": "end_turn", "usage": {"input_tokens": 12, "output_tokens": 6},
            "content": [{"type": "text", "text": "Hel"}, {"type": "thinking", "thinking": "hmm"}, {"type": "text"},
                        {"type": "text", "text": "lo"}, "junk", {"type": "tool_use", "id": "t1", "name": "f",
                                                                 "input": {"a": 1}},
                        {"type": "tool_use", "id": "t2", "name": "g", "input": "not a dict"}, {"type": "tool_use"}]}
    r = anthropic.parse(EP["anthropic"], "m1", data)
    assert r == ChatResponse(text="Hello", tool_calls=[ToolCall("t1", "f", {"a": 1}), ToolCall("t2", "g", {}),
                                                       ToolCall("", "", {})],
                             finish_reason="tool_calls", usage=Usage(12, 6), model="claude-x")
    plain = anthropic.parse(EP["anthropic"], "m1", {"content": []})
    assert plain == ChatResponse(text="", finish_reason="stop", usage=Usage(0, 0), model="m1")
    for data in ({}, {"content": "text"}):
        assert bad(anthropic, "anthropic", data) == "acme model m1: unusable response: no content in the answer"


@pytest.mark.parametrize("reason,finish", [("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"),
                                           ("tool_use", "tool_calls"), ("refusal", "stop"), (None, "stop")])
def test_anthropic_stop_reasons(reason, finish) -> None:
    r = anthropic.parse(EP["anthropic"], "m1", {"content": [{"type": "text", "text": "x"}], "stop_reason": reason})
    assert r.finish_reason == finish, f"BUG: stop_reason {reason!r} mapped to {r.finish_reason!r}"


def test_anthropic_stream() -> None:
    body = named(("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 10,
                                                                                   "output_tokens": 1}}}),
                 ("ping", {"type": "ping"}),
                 ("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}}),
                 ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": "Hi"}}),
                 ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta"}}),
                 ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                 ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
                     "type": "tool_use", "id": "t1", "name": "f", "input": {}}}),
                 ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                          "delta": {"type": "input_json_delta", "partial_json": '{"a":'}}),
                 ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                          "delta": {"type": "input_json_delta"}}),
                 ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                          "delta": {"type": "input_json_delta", "partial_json": "1}"}}),
                 ("content_block_stop", {"type": "content_block_stop", "index": 1}),
                 ("content_block_start", {"type": "content_block_start", "index": 2, "content_block": {
                     "type": "text", "text": " after"}}),
                 ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                                    "usage": {"output_tokens": 7}}),
                 ("message_stop", {"type": "message_stop"}),
                 ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": "too late"}}))
    r, seen = streamed(anthropic, body, "anthropic")
    assert seen == [TextDelta("Hi"), ToolCallStart(1, "t1", "f"), ToolCallDelta(1, '{"a":'), ToolCallDelta(1, "1}"),
                    ToolCallEnd(1, "t1", "f", {"a": 1}), TextDelta(" after")]
    assert r == ChatResponse(text="Hi after", tool_calls=[ToolCall("t1", "f", {"a": 1})], finish_reason="tool_calls",
                             usage=Usage(10, 7), model="m1"), "BUG: Anthropic stream usage or content read wrongly"


def test_anthropic_stream_without_indexes_or_types() -> None:
    # Events named only by their `event:` line, blocks without an index (= block 0).
    body = named(("message_start", {"message": {}}),
                 ("content_block_start", {"content_block": {"type": "tool_use", "id": "t0", "name": "f"}}),
                 ("content_block_delta", {"delta": {"type": "input_json_delta", "partial_json": "{}"}}),
                 ("content_block_stop", {}),
                 ("content_block_delta", {"delta": {"type": "text_delta", "text": "then text"}}),
                 ("message_delta", {"delta": {}, "usage": {"output_tokens": None}}),
                 ("message_stop", {}))
    r, seen = streamed(anthropic, body, "anthropic")
    assert seen == [ToolCallStart(0, "t0", "f"), ToolCallDelta(0, "{}"), ToolCallEnd(0, "t0", "f", {}),
                    TextDelta("then text")], "BUG: an Anthropic block without an index is not block 0"
    assert (r.usage, r.finish_reason) == (Usage(0, 0), "tool_calls")
    body = named(("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 4,
                                                                                   "output_tokens": 1}}}),
                 ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "text_delta",
                                                                                  "text": "cut"}}),
                 ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {}}),
                 ("message_stop", {"type": "message_stop"}))
    r, _ = streamed(anthropic, body, "anthropic")
    assert (r.text, r.finish_reason, r.usage) == ("cut", "length", Usage(4, 1))
    body = named(("message_delta", {"type": "message_delta", "delta": {"stop_reason": "pause_turn"},
                                    "usage": "n/a"}), ("message_stop", {"type": "message_stop"}))
    r, _ = streamed(anthropic, body, "anthropic")
    assert (r.finish_reason, r.usage) == ("stop", Usage(0, 0))


def test_anthropic_stream_errors() -> None:
    for error, detail in (({"type": "overloaded_error", "message": "Overloaded"}, "Overloaded"),
                          ({"type": "api_error"}, "unknown error"), (None, "unknown error")):
        with pytest.raises(LLMError) as caught:
            streamed(anthropic, named(("error", {"type": "error", "error": error})), "anthropic")
        assert (caught.value.kind, caught.value.message) == (
            "bad_response", f"acme model m1: unusable response: the stream reported an error: {detail}")
    with pytest.raises(LLMError) as caught:
        streamed(anthropic, named(("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}})),
                 "anthropic")
    assert (caught.value.kind, caught.value.message) == (
        "truncated", "acme model m1: the stream was cut off before the answer was complete (no message_stop)")


# -- Gemini -----------------------------------------------------------------------------------

GEMINI_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
GEMINI_FULL = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
               "systemInstruction": {"parts": [{"text": "be brief"}]},
               "tools": [{"functionDeclarations": [{"name": "file_read", "description": "read a file",
                                                    "parameters": GEMINI_SCHEMA}]}],
               "generationConfig": {"maxOutputTokens": 77, "temperature": 0.0, "topP": 0.9, "seed": 7,
                                    "presencePenalty": 0.5, "frequencyPenalty": -0.25, "stopSequences": ["END", "STOP"],
                                    "responseMimeType": "application/json"}}


def test_gemini_request_body(caplog) -> None:
    caplog.set_level(logging.INFO, logger="agentd.llm")
    url, headers, body = gemini.prepare(EP["gemini"], full(), False)
    assert url == "http://up.example/api/v1beta/models/m-1:generateContent"
    assert headers == {"x-goog-api-key": "k-1"}
    assert body == GEMINI_FULL, "BUG: the Gemini request body lost or renamed a field"
    assert [r.getMessage() for r in caplog.records] == [
        "acme model m-1: dropping user (no equivalent in the gemini API)"]
    url, _, streamed_body = gemini.prepare(EP["gemini"], full(), True)
    assert url == "http://up.example/api/v1beta/models/m-1:streamGenerateContent?alt=sse"
    assert streamed_body == GEMINI_FULL, "BUG: Gemini streams are asked for in the body, not the URL"
    keyless = ProviderEndpoint("acme", "gemini", "http://up.example", key_required=False)
    url, headers, body = gemini.prepare(keyless, minimal(), False)
    assert (url, headers, body) == ("http://up.example/v1beta/models/m-1:generateContent", {},
                                    {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "additionalProperties": False, "properties": {"a": {"type": "integer", "minimum": 0}}}}}
    _, _, body = gemini.prepare(keyless, ChatRequest("m", [Message("user", "x")], params=GenerationParams(
        response_format=schema)), False)
    assert body["generationConfig"] == {"responseMimeType": "application/json", "responseSchema": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}
    _, _, body = gemini.prepare(keyless, ChatRequest("m", [Message("user", "x")], max_tokens=0), False)
    assert body["generationConfig"] == {"maxOutputTokens": 0}


def test_gemini_schema_keeps_only_the_openapi_subset() -> None:
    schema = {"type": "object", "title": "T", "$schema": "x", "description": "d", "nullable": True,
              "properties": {"list": {"type": "array", "items": {"type": "string", "pattern": "^a", "enum": ["a"],
                                                                 "format": "uri"}, "minItems": 1},
                             "items": {"type": "string", "default": "x"}},
              "required": ["list"]}
    assert gemini.gemini_schema(schema) == {
        "type": "object", "description": "d", "nullable": True,
        "properties": {"list": {"type": "array", "items": {"type": "string", "enum": ["a"], "format": "uri"}},
                       "items": {"type": "string"}},
        "required": ["list"]}, "BUG: a keyword Gemini rejects reached its schema"
    assert gemini.gemini_schema({"properties": "odd", "items": True}) == {"properties": "odd", "items": True}
    assert gemini.gemini_schema(None) is None


def test_gemini_turns_and_parts() -> None:
    call = ToolCall("c1", "f", {"a": 1})
    msgs = [Message("user", "look", images=[ImagePart("image/png", "AAA")]), Message("assistant", "let me",
                                                                                    tool_calls=[call]),
            Message("tool", "out", tool_call_id="c1", tool_name="f"), Message("tool", "anon"), Message("user", "go")]
    _, _, body = gemini.prepare(EP["gemini"], ChatRequest(model="m", messages=msgs), False)
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": "AAA"}}]},
        {"role": "model", "parts": [{"text": "let me"}, {"functionCall": {"name": "f", "args": {"a": 1}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"content": "out"}}},
                                   {"functionResponse": {"name": "", "response": {"content": "anon"}}},
                                   {"text": "go"}]}], "BUG: Gemini turns or parts are built wrongly"


def test_gemini_answer_parsing() -> None:
    data = {"usageMetadata": {"promptTokenCount": 8, "candidatesTokenCount": 3, "totalTokenCount": 11},
            "modelVersion": "ignored", "candidates": [{"finishReason": "STOP", "content": {"parts": [
                {"text": "Hel"}, {"functionCall": {"name": "f", "args": {"a": 1}}}, {"text": "lo"}, "junk text",
                {"text": None}, {"text": 5}, {"thought": True},
                {"functionCall": {"name": "g"}}, {"functionCall": {"args": {"b": 2}}}, {"functionCall": "x"}]}}]}
    r = gemini.parse(EP["gemini"], "m1", data)
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("f", {"a": 1}), ("g", {}), ("", {"b": 2})]
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in r.tool_calls)
    assert len({c.id for c in r.tool_calls}) == 3, "BUG: Gemini tool calls share an id"
    assert (r.text, r.finish_reason, r.usage, r.model) == ("Hello", "tool_calls", Usage(8, 3), "m1")
    plain = gemini.parse(EP["gemini"], "m1", {"candidates": [{"content": {"parts": [{"text": "x"}]}}]})
    assert plain == ChatResponse(text="x", finish_reason="stop", usage=Usage(0, 0), model="m1")
    assert gemini.parse(EP["gemini"], "m1", {"candidates": [{"finishReason": "STOP"}]}).text == ""
    for data in ({}, {"candidates": []}, {"candidates": "x"}, {"candidates": ["x"]}, {"candidates": [{}]},
                 {"promptFeedback": {}}):
        assert bad(gemini, "gemini", data) == "acme model m1: unusable response: no candidates"
    assert bad(gemini, "gemini", {"promptFeedback": {"blockReason": "SAFETY"}}) == \
        "acme model m1: unusable response: no candidates (blocked: SAFETY)"


@pytest.mark.parametrize("reason,finish", [("STOP", "stop"), ("MAX_TOKENS", "length"), ("SAFETY", "stop"),
                                           (None, "stop")])
def test_gemini_finish_reasons(reason, finish) -> None:
    r = gemini.parse(EP["gemini"], "m1", {"candidates": [{"content": {"parts": [{"text": "x"}]},
                                                          "finishReason": reason}]})
    assert r.finish_reason == finish, f"BUG: finishReason {reason!r} mapped to {r.finish_reason!r}"


def test_gemini_stream() -> None:
    body = sse({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}}],
                "usageMetadata": {"promptTokenCount": 6}},
               {"candidates": [{"content": {"parts": [{"text": "lo"}, {"text": 3}, "junk",
                                                      {"functionCall": {"name": "f", "args": {"a": 1}}},
                                                      {"functionCall": {"name": "g"}}]},
                                "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": 6, "candidatesTokenCount": 2}},
               {"usageMetadata": {"promptTokenCount": 6, "candidatesTokenCount": 4}}, sep="\r\n\r\n")
    r, seen = streamed(gemini, body, "gemini")
    ids = [e.id for e in seen if isinstance(e, ToolCallStart)]
    assert len(ids) == 2 and ids[0] != ids[1] and all(i.startswith("call_") for i in ids)
    assert seen == [TextDelta("Hel"), TextDelta("lo"), ToolCallStart(0, ids[0], "f"), ToolCallDelta(0, '{"a": 1}'),
                    ToolCallEnd(0, ids[0], "f", {"a": 1}), ToolCallStart(1, ids[1], "g"), ToolCallDelta(1, "{}"),
                    ToolCallEnd(1, ids[1], "g", {})]
    assert r == ChatResponse(text="Hello", tool_calls=[ToolCall(ids[0], "f", {"a": 1}), ToolCall(ids[1], "g", {})],
                             finish_reason="tool_calls", usage=Usage(6, 4), model="m1"), \
        "BUG: Gemini stream usage is not the last usageMetadata"
    r, _ = streamed(gemini, sse({"candidates": [{"content": {"parts": [{"text": "cut"}]},
                                                 "finishReason": "MAX_TOKENS"}]}), "gemini")
    assert (r.text, r.finish_reason, r.usage) == ("cut", "length", Usage(0, 0))
    r, _ = streamed(gemini, sse({"candidates": [{"finishReason": "OTHER"}]}), "gemini")
    assert (r.text, r.finish_reason) == ("", "stop")


def test_gemini_stream_errors() -> None:
    with pytest.raises(LLMError) as caught:
        streamed(gemini, sse({"candidates": [{"content": {"parts": [{"text": "a"}]}}]}), "gemini")
    assert (caught.value.kind, caught.value.message) == (
        "truncated", "acme model m1: the stream was cut off before the answer was complete (no finishReason)")
    with pytest.raises(LLMError) as caught:
        streamed(gemini, sse({"error": {"code": 500, "message": "x"}}), "gemini")
    assert caught.value.message == \
        "acme model m1: unusable response: the stream reported an error: {'code': 500, 'message': 'x'}"


# -- the assembler ----------------------------------------------------------------------------

def test_assembler_events_and_response() -> None:
    seen: list = []
    out = Assembler(seen.append)
    out.add_text("")
    out.add_text("a")
    out.start_call(0, None, "")
    out.start_call(0, "ignored", "f")
    generated = out.calls[0]["id"]
    assert generated.startswith("call_") and len(generated) == 29 and int(generated[5:], 16) >= 0
    out.add_arguments(0, "")
    out.add_arguments(7, "{}")  # no such call: dropped
    out.add_arguments(0, '{"x": 1}')
    out.end_call(0)
    out.end_call(0)
    out.end_call(3)
    out.start_call(1, "c1", "")  # a call that never got a name is not returned
    out.whole_call("w", "g", {"k": [1]})
    out.input_tokens, out.output_tokens = 5, 6
    r = out.response("m")
    assert seen == [TextDelta("a"), ToolCallStart(0, generated, ""), ToolCallStart(0, generated, "f"),
                    ToolCallDelta(0, '{"x": 1}'), ToolCallEnd(0, generated, "f", {"x": 1}),
                    ToolCallStart(1, "c1", ""), ToolCallStart(2, "w", "g"), ToolCallDelta(2, '{"k": [1]}'),
                    ToolCallEnd(2, "w", "g", {"k": [1]}), ToolCallEnd(1, "c1", "", {})]
    assert r == ChatResponse(text="a", tool_calls=[ToolCall(generated, "f", {"x": 1}), ToolCall("w", "g", {"k": [1]})],
                             finish_reason="tool_calls", usage=Usage(5, 6), model="m")
    quiet = Assembler(None)
    quiet.add_text("t")
    quiet.finish = "length"
    assert quiet.response("q") == ChatResponse(text="t", finish_reason="length", usage=Usage(0, 0), model="q")
    assert assemble.new_call_id() != assemble.new_call_id()


# -- complete(): the entry point --------------------------------------------------------------

def test_complete_refuses_before_sending() -> None:
    cases = [(ProviderEndpoint("aws", "bedrock", "http://x", api_key="k"), "bad_request",
              "aws: unsupported API format 'bedrock'"),
             (ProviderEndpoint("acme", "openai", "http://x", api_key_env="ACME_KEY"), "missing_key",
              "acme model m-1: no API key: set ACME_KEY in the daemon's environment or POST /api/providers/acme/key"),
             (ProviderEndpoint("acme", "openai", "http://x"), "missing_key",
              "acme model m-1: no API key: set its API key variable in the daemon's environment or "
              "POST /api/providers/acme/key"),
             (ProviderEndpoint("acme", "gemini", "", api_key="k"), "bad_request", "acme: no base URL configured"),
             (ProviderEndpoint("acme", "gemini", "", key_required=False), "bad_request",
              "acme: no base URL configured")]
    for ep, kind, message in cases:
        with pytest.raises(LLMError) as caught:
            drivers.complete(ep, minimal())
        err = caught.value
        assert (err.kind, err.message, err.provider, err.model) == (kind, message, ep.provider, "m-1")


def test_backoff_delays() -> None:
    from agentd.llm.drivers import retry_delay

    for n, base in enumerate([0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0]):
        assert 0.8 * base <= retry_delay(n, None) <= 1.2 * base
    assert (retry_delay(0, 2.5), retry_delay(3, 0.0), retry_delay(0, 30.0), retry_delay(0, 45.0)) == \
        (2.5, 0.0, 30.0, 30.0), "BUG: Retry-After is not honoured as given (capped at 30 s)"


# -- on the wire, against the fake provider ---------------------------------------------------

@pytest.fixture(scope="module")
def fake():
    from fakellm import FakeLLM

    server = FakeLLM(required_key=KEY).start()
    yield server
    server.stop()


def live(fake, kind: str, **kw) -> ProviderEndpoint:
    base = {"openai": fake.openai_base, "anthropic": fake.anthropic_base, "gemini": fake.gemini_base}[kind]
    return ProviderEndpoint(**{"provider": f"p-{kind}", "kind": kind, "base_url": base, "api_key": KEY,
                               "timeout": 5.0, **kw})


FORMAT = {"openai": openai_compat, "anthropic": anthropic, "gemini": gemini}
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages",
         "gemini": "/v1beta/models/m-1:generateContent"}
AUTH = {"openai": ("authorization", f"Bearer {KEY}"), "anthropic": ("x-api-key", KEY),
        "gemini": ("x-goog-api-key", KEY)}


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_wire_carries_the_prepared_request(fake, kind, stream) -> None:
    request = full(messages=[Message("user", "[[reply:fine thanks]]")])
    seen: list = []
    r = drivers.complete(live(fake, kind), request, on_event=seen.append if stream else None)
    sent = fake.requests[-1]
    _, _, expected = FORMAT[kind].prepare(live(fake, kind), request, stream)
    assert sent["json"] == expected and sent["method"] == "POST"
    path = PATHS[kind].replace("generateContent", "streamGenerateContent") if stream and kind == "gemini" else PATHS[kind]
    assert sent["path"] == path and sent["query"] == ({"alt": "sse"} if stream and kind == "gemini" else {})
    name, value = AUTH[kind]
    assert sent["headers"][name] == value and sent["headers"]["content-type"] == "application/json"
    if kind == "anthropic":
        assert sent["headers"]["anthropic-version"] == "2023-06-01"
    # fakellm counts words: 2 user words + 2 system words (+ the JSON hint Anthropic adds to the system prompt)
    inputs = 2 + 2 + (len(JSON_HINT.split()) if kind == "anthropic" else 0)
    assert (r.text, r.finish_reason, r.usage, r.model) == ("fine thanks", "stop", Usage(inputs, 2), "m-1"), \
        f"BUG: {kind} usage numbers read wrongly"
    if stream:
        assert "".join(e.text for e in seen) == "fine thanks" and len(seen) == 2


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_with_arguments_on_the_wire(fake, kind, stream) -> None:
    args = {"path": "dir/a b.txt", "n": [1, {"deep": None}], "flag": False}
    request = ChatRequest("m-1", [Message("user", f"[[tools:file_read {json.dumps(args)} | noop]]")], tools=[READ])
    r = drivers.complete(live(fake, kind), request, on_event=(lambda e: None) if stream else None)
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("file_read", args), ("noop", {})], \
        f"BUG: {kind} tool-call arguments decoded wrongly"
    assert r.finish_reason == "tool_calls" and r.usage.output_tokens == 2
    assert len({c.id for c in r.tool_calls}) == 2 and all(c.id for c in r.tool_calls)


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize("status,error_kind", [(400, "bad_request"), (401, "auth"), (403, "auth"),
                                               (404, "not_found"), (429, "rate_limit"), (500, "server"),
                                               (503, "server")])
def test_provider_errors_map_to_kinds(fake, kind, status, error_kind) -> None:
    with pytest.raises(LLMError) as caught:
        drivers.complete(live(fake, kind), ChatRequest("m-1", [Message("user", f"[[fail:{status}]] {kind}")]),
                         retries=0)
    err = caught.value
    reason = f"fakellm: scripted failure {status}"
    expected = (f"p-{kind} model m-1: HTTP {status}: the provider rejected the API key ({reason})"
                if error_kind == "auth" else f"p-{kind} model m-1: HTTP {status}: {reason}")
    assert (err.kind, err.http_status, err.message, err.retry_after) == (error_kind, status, expected, None)
    assert err.retryable is (error_kind in ("rate_limit", "server"))


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_retry_after_reaches_the_error(fake, kind) -> None:
    fake.reset()
    with pytest.raises(LLMError) as caught:
        drivers.complete(live(fake, kind, timeout=1.0), ChatRequest("m-1", [Message(
            "user", f"[[fail:429 retry_after=7]] {kind}")]))
    err = caught.value
    assert (err.kind, err.http_status, err.retry_after) == ("rate_limit", 429, 7.0), \
        "BUG: Retry-After lost on the way to the caller"
    assert len(fake.requests) == 1, "BUG: retried although Retry-After passes the deadline"


def test_retries_are_counted(fake) -> None:
    fake.reset()
    with pytest.raises(LLMError) as caught:
        drivers.complete(live(fake, "openai"), ChatRequest("m-1", [Message("user", "[[fail:503]] always")]), retries=2)
    assert caught.value.kind == "server" and len(fake.requests) == 3, "BUG: retries=2 is not 3 attempts"
    fake.reset()
    r = drivers.complete(live(fake, "gemini"), ChatRequest("m-1", [Message("user", "[[fail:429 times=1]] once")]),
                         retries=1)
    assert r.text == "echo: once" and len(fake.requests) == 2
    fake.reset()
    with pytest.raises(LLMError):
        drivers.complete(live(fake, "openai"), ChatRequest("m-1", [Message("user", "[[fail:503]] zero")]), retries=0)
    assert len(fake.requests) == 1


def test_cancelled_or_expired_calls_send_nothing(fake) -> None:
    fake.reset()
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LLMError) as caught:
        drivers.complete(live(fake, "openai"), minimal(), cancel=cancel)
    assert (caught.value.kind, caught.value.message) == ("cancelled", "p-openai model m-1: call cancelled")
    assert (caught.value.provider, caught.value.model) == ("p-openai", "m-1")
    with pytest.raises(LLMError) as caught:
        drivers.complete(live(fake, "openai"), minimal(), deadline=time.monotonic() - 0.001)
    assert caught.value.kind == "timeout"
    assert fake.requests == [], "BUG: a cancelled or expired call still reached the provider"


def test_a_json_answer_to_a_stream_request_is_replayed_as_events() -> None:
    """Some servers ignore `stream: true`: the whole answer still comes out as stream events."""
    answer = json.dumps({"choices": [{"message": {"content": "whole", "tool_calls": [
        {"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}}]}}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 3}}).encode()

    with upstream(stub_answer(answer)) as base:
        seen: list = []
        ep = ProviderEndpoint("local", "openai", base, key_required=False)
        r = drivers.complete(ep, minimal(), on_event=seen.append)
        assert seen == [TextDelta("whole"), ToolCallStart(0, "c1", "f"), ToolCallDelta(0, '{"a": 1}'),
                        ToolCallEnd(0, "c1", "f", {"a": 1})], "BUG: a non-streamed answer to a stream is not replayed"
        assert (r.text, r.usage, r.finish_reason) == ("whole", Usage(2, 3), "tool_calls")


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_a_broken_stream_event_names_provider_and_model(kind) -> None:
    body = b"event: message_start\ndata: {not json\n\n"
    with pytest.raises(LLMError) as caught:
        streamed(FORMAT[kind], body, kind)
    assert (caught.value.kind, caught.value.message, caught.value.provider, caught.value.model) == (
        "bad_response", "acme model m1: unusable response: a stream event is not valid JSON", "acme", "m1")


def test_a_stalled_stream_times_out_on_the_idle_limit(fake) -> None:
    ep = live(fake, "openai", stream_idle=0.3, timeout=10.0)
    with pytest.raises(LLMError) as caught:
        drivers.complete(ep, ChatRequest("m-1", [Message("user", "[[pace:3000]] [[chunks:3]]")]),
                         on_event=lambda e: None, retries=0)
    assert (caught.value.kind, caught.value.message) == (
        "timeout", f"p-openai model m-1: timed out: the stream stalled, no data for 0.3s from {fake.openai_base} "
                   "(stream_idle_secs)"), "BUG: a stalled stream is not ended by the idle limit"
    # Without a stream the idle limit does not apply: a slow whole answer within the deadline is fine.
    r = drivers.complete(live(fake, "openai", stream_idle=0.2), ChatRequest("m-1", [Message("user", "[[slow:0.5]] ok")]))
    assert r.text == "echo: ok"


def test_a_retry_is_made_when_the_wait_fits_before_the_deadline(fake) -> None:
    fake.reset()
    # The 1 s wait fits the 3 s deadline even when the first answer took a loaded host 2 s.
    r = drivers.complete(live(fake, "openai", timeout=3.0), ChatRequest("m-1", [Message(
        "user", "[[fail:429 times=1 retry_after=1]] fits")]), retries=3)
    assert r.text == "echo: fits" and len(fake.requests) == 2, "BUG: a retry that fits the deadline was not made"


def test_cancel_during_the_backoff_ends_the_call(fake) -> None:
    fake.reset()
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(LLMError) as caught:
        drivers.complete(live(fake, "anthropic", timeout=20.0), ChatRequest("m-1", [Message(
            "user", "[[fail:429 retry_after=10]] wait")]), cancel=cancel, retries=3)
    assert (caught.value.kind, caught.value.message) == ("cancelled", "p-anthropic model m-1: call cancelled")
    assert len(fake.requests) == 1 and time.monotonic() - started < 8, "BUG: the backoff ignores a cancel"


def test_a_stream_without_a_content_type_is_read_as_a_stream() -> None:
    body = b'data: {"choices": [{"delta": {"content": "streamed"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'

    with upstream(stub_answer(body, content_type=None)) as base:
        seen: list = []
        ep = ProviderEndpoint("local", "openai", base, key_required=False)
        r = drivers.complete(ep, minimal(), on_event=seen.append)
        assert seen == [TextDelta("streamed")] and r.text == "streamed"


def test_base_urls_lose_only_their_trailing_slashes() -> None:
    for kind, path in (("openai", "/X/chat/completions"), ("anthropic", "/X/v1/messages"),
                       ("gemini", "/X/v1beta/models/m-1:generateContent")):
        ep = ProviderEndpoint("acme", kind, "http://up.example/X//", api_key="k")
        assert FORMAT[kind].prepare(ep, minimal(), False)[0] == "http://up.example" + path


def test_anthropic_stream_of_data_lines_only() -> None:
    """Events whose `event:` lines a gateway dropped are told apart by their `type`."""
    body = sse({"type": "message_start", "message": {"usage": {"input_tokens": 3, "output_tokens": 1}}},
               {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "plain"}},
               {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
               {"type": "message_stop"})
    r, seen = streamed(anthropic, body, "anthropic")
    assert seen == [TextDelta("plain")]
    assert (r.text, r.finish_reason, r.usage) == ("plain", "stop", Usage(3, 2)), \
        "BUG: an Anthropic stream without event names is misread"


def test_gemini_stream_call_without_a_name_is_not_returned() -> None:
    body = sse({"candidates": [{"content": {"parts": [{"functionCall": {"args": {"b": 2}}}]},
                                "finishReason": "STOP"}]})
    r, seen = streamed(gemini, body, "gemini")
    assert [type(e) for e in seen] == [ToolCallStart, ToolCallDelta, ToolCallEnd]
    assert (seen[0].name, seen[2].name, seen[2].arguments) == ("", "", {"b": 2})
    assert (r.tool_calls, r.finish_reason) == ([], "stop")


def test_a_cancel_seen_by_the_listener_stops_the_stream_at_once(fake) -> None:
    cancel = threading.Event()
    seen: list = []

    def listener(event) -> None:
        seen.append(event)
        cancel.set()   # e.g. the client went away while this delta was delivered

    with pytest.raises(LLMError) as caught:
        drivers.complete(live(fake, "gemini"), ChatRequest("m-1", [Message("user", "[[chunks:40]]")]),
                         on_event=listener, cancel=cancel)
    assert caught.value.kind == "cancelled" and seen == [TextDelta("w1")], \
        "BUG: deltas were delivered after the call was cancelled"
    err = caught.value
    assert (err.message, err.provider, err.model) == ("p-gemini model m-1: call cancelled", "p-gemini", "m-1")


def test_a_body_cut_short_by_the_deadline_is_a_timeout_not_garbage() -> None:
    with upstream(stalled(b'{"choices": [', "application/json")) as base:
        ep = ProviderEndpoint("local", "openai", base, key_required=False, timeout=0.5)
        with pytest.raises(LLMError) as caught:
            drivers.complete(ep, minimal(), retries=0)
        assert (caught.value.kind, caught.value.message) == (
            "timeout", f"local model m-1: timed out after 0.5s waiting for {base} (timeout_secs)"), \
            "BUG: a body cut short by the deadline is reported as a bad answer"


def test_anthropic_stream_tool_use_without_a_name_is_not_returned() -> None:
    body = named(("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "tool_use", "id": "t9"}}),
                 ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                 ("message_stop", {"type": "message_stop"}))
    r, seen = streamed(anthropic, body, "anthropic")
    assert seen == [ToolCallStart(0, "t9", ""), ToolCallEnd(0, "t9", "", {})]
    assert (r.tool_calls, r.finish_reason) == ([], "stop")


def test_a_close_delimited_stream_that_stalls_ends_on_the_idle_limit() -> None:
    """No chunked framing: the interrupted read ends like a clean end of body, and the guard's
    reason (not a truncation) is what the caller hears."""
    first = b'data: {"choices": [{"delta": {"content": "first"}}]}\n\n'
    with upstream(stalled(first, "text/event-stream")) as base:
        ep = ProviderEndpoint("local", "openai", base, key_required=False, timeout=10.0, stream_idle=0.3)
        seen: list = []
        with pytest.raises(LLMError) as caught:
            drivers.complete(ep, minimal(), on_event=seen.append, retries=0)
        err = caught.value
        assert (err.kind, err.message, err.provider, err.model) == (
            "timeout", f"local model m-1: timed out: the stream stalled, no data for 0.3s from {base} "
                       "(stream_idle_secs)", "local", "m-1")
        assert seen == [TextDelta("first")]


def test_gemini_a_call_without_text_has_no_empty_text_part() -> None:
    msgs = [Message("user", "go"), Message("assistant", "", tool_calls=[ToolCall("c1", "f", {})]),
            Message("user", "", images=[ImagePart("image/png", "AAA")])]
    _, _, body = gemini.prepare(EP["gemini"], ChatRequest(model="m", messages=msgs), False)
    assert body["contents"] == [{"role": "user", "parts": [{"text": "go"}]},
                                {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]},
                                {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": "AAA"}}]}], \
        "BUG: Gemini gets an empty text part (it rejects those)"


def test_a_call_cancelled_while_its_whole_answer_is_replayed_reports_cancelled() -> None:
    """The watchdog trips the guard while the listener holds the only event: the answer that
    was read anyway is not returned as a success."""
    answer = json.dumps({"choices": [{"message": {"content": "only"}}]}).encode()

    with upstream(stub_answer(answer)) as base:
        cancel = threading.Event()

        def listener(event) -> None:
            cancel.set()
            time.sleep(1.0)   # many watchdog passes (0.05 s apart): the guard trips meanwhile

        ep = ProviderEndpoint("local", "openai", base, key_required=False)
        with pytest.raises(LLMError) as caught:
            drivers.complete(ep, minimal(), on_event=listener, cancel=cancel)
        err = caught.value
        assert (err.kind, err.message, err.provider, err.model) == (
            "cancelled", "local model m-1: call cancelled", "local", "m-1"), "BUG: a cancelled call returned its answer"



@pytest.mark.parametrize("stream", [False, True])
def test_unusable_answers_name_provider_and_model(fake, stream) -> None:
    with pytest.raises(LLMError) as caught:
        drivers.complete(live(fake, "openai"), ChatRequest("m-1", [Message("user", "[[garbage]]")]),
                         on_event=(lambda e: None) if stream else None, retries=0)
    err = caught.value
    assert (err.kind, err.message, err.model) == (
        "bad_response", "p-openai model m-1: unusable response: the answer is not valid JSON", "m-1")
    answer = json.dumps({"choices": []}).encode()

    with upstream(stub_answer(answer)) as base:
        ep = ProviderEndpoint("local", "openai", base, key_required=False)
        with pytest.raises(LLMError) as caught:
            drivers.complete(ep, minimal(), on_event=(lambda e: None) if stream else None, retries=0)
        err = caught.value
        assert (err.kind, err.message, err.provider, err.model) == (
            "bad_response", "local model m-1: unusable response: no choices in the answer", "local", "m-1")


def test_the_default_is_three_retries(fake) -> None:
    """`complete()` without `retries=` makes 1 + 3 attempts (Retry-After: 0 keeps it instant)."""
    fake.reset()
    with pytest.raises(LLMError) as caught:
        drivers.complete(live(fake, "openai"), ChatRequest("m-1", [Message("user", "[[fail:429 retry_after=0]] dflt")]))
    assert (caught.value.kind, caught.value.retry_after) == ("rate_limit", 0.0)
    assert len(fake.requests) == 4, f"BUG: the default is not 3 retries ({len(fake.requests)} attempts)"


@pytest.mark.parametrize("stream", [False, True])
def test_an_already_cancelled_call_never_reaches_the_provider(fake, stream) -> None:
    """Refused before any connection is used: nothing arrives, however long the provider waits."""
    fake.reset()
    drivers.complete(live(fake, "openai"), minimal())   # a kept-alive connection this thread could reuse
    fake.reset()
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LLMError) as caught:
        drivers.complete(live(fake, "openai"), ChatRequest("m-1", [Message("user", "[[slow:0.3]] late")]),
                         on_event=(lambda e: None) if stream else None, cancel=cancel)
    err = caught.value
    assert (err.kind, err.message, err.provider, err.model) == (
        "cancelled", "p-openai model m-1: call cancelled", "p-openai", "m-1")
    assert not fake.wait_requests(1, timeout=0.5), "BUG: a call cancelled before it started was still sent"


def test_no_retry_without_a_minimal_attempt_window_before_the_deadline() -> None:
    """A Retry-After that ends 20 ms before the deadline leaves less than MIN_ATTEMPT_SECS
    (50 ms) for the next attempt: the 429 is reported at once instead of a doomed retry."""
    deadline = time.monotonic() + 1.0
    seen: list[float] = []

    def throttle(handler) -> None:
        seen.append(time.monotonic())
        body = json.dumps({"error": {"message": "slow down"}}).encode()
        handler.send_response(429)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Retry-After", f"{max(0.0, deadline - time.monotonic() - 0.02):.6f}")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    with upstream(throttle) as base:
        ep = ProviderEndpoint("local", "openai", base, key_required=False, timeout=5.0)
        with pytest.raises(LLMError) as caught:
            drivers.complete(ep, minimal(), retries=3, deadline=deadline)
    assert (caught.value.kind, caught.value.http_status) == ("rate_limit", 429)
    assert len(seen) == 1, "BUG: retried with less than MIN_ATTEMPT_SECS left before the deadline"
    assert drivers.MIN_ATTEMPT_SECS == 0.05


def test_a_whole_answer_cut_after_its_headers_is_a_broken_read_not_a_reset() -> None:
    def short(handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "100")
        handler.end_headers()
        handler.wfile.write(b'{"choices": [')
        handler.wfile.flush()
        handler.close_connection = True

    with upstream(short) as base:
        ep = ProviderEndpoint("local", "openai", base, key_required=False)
        with pytest.raises(LLMError) as caught:
            drivers.complete(ep, minimal(), retries=0)
    assert caught.value.message.startswith("local model m-1: the connection broke while reading the answer: "), \
        f"BUG: a body cut after the headers is reported as {caught.value.message!r}"
