"""LLM drivers against the fake provider over real HTTP, in all three wire formats."""

from __future__ import annotations

import json
import threading
import time
import pytest
from agentd.llm import drivers
from agentd.llm.think import ThinkFilter, strip_think
from agentd.llm.types import (ChatRequest, ImagePart, LLMError, Message, ProviderEndpoint, TextDelta,
                              ToolCallDelta, ToolCallEnd, ToolCallStart, ToolSpec)
from support import free_port
import gzip
import io
import os
import socket
import requests
import urllib3.exceptions
from urllib3 import HTTPResponse
from agentd.llm.drivers import reading
from agentd.llm.drivers import transport
from agentd.llm.drivers.guard import CallGuard
from agentd.llm.types import LLMError, Message, ProviderEndpoint, Usage


KINDS = ["openai", "anthropic", "gemini"]
KEY = "sk-driver"
PNG_B64 = "iVBORw0KGgo="


@pytest.fixture(scope="module")
def fake():
    from fakellm import FakeLLM

    server = FakeLLM(required_key=KEY).start()
    yield server
    server.stop()


def endpoint(fake, kind: str, **kw) -> ProviderEndpoint:
    base = {"openai": fake.openai_base, "anthropic": fake.anthropic_base, "gemini": fake.gemini_base}[kind]
    fields = {"provider": f"p-{kind}", "kind": kind, "base_url": base, "api_key": KEY,
              "api_key_env": "P_KEY", "timeout": 5.0}
    fields.update(kw)
    return ProviderEndpoint(**fields)


def ask(text: str, **kw) -> ChatRequest:
    return ChatRequest(model="m-1", messages=[Message("user", text)], **kw)


READ = ToolSpec("file_read", "read a file", {"type": "object", "properties": {"path": {"type": "string"}},
                                             "required": ["path"], "additionalProperties": False})


@pytest.mark.parametrize("kind", KINDS)
def test_plain_answer_with_usage(fake, kind) -> None:
    r = drivers.complete(endpoint(fake, kind), ask("hello there"))
    assert r.text == "echo: hello there" and r.finish_reason == "stop" and not r.tool_calls
    assert r.usage.input_tokens == 2 and r.usage.output_tokens == 3


@pytest.mark.parametrize("kind", KINDS)
def test_stream_emits_deltas_and_usage(fake, kind) -> None:
    events: list = []
    r = drivers.complete(endpoint(fake, kind), ask("[[chunks:5]]"), on_event=events.append)
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) == 5 and "".join(deltas) == r.text == "w1 w2 w3 w4 w5"
    assert r.usage.output_tokens == 5 and r.usage.input_tokens == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip(fake, kind, stream) -> None:
    events: list = []
    request = ask('[[tool:file_read {"path": "a b.txt"}]]', tools=[READ])
    r = drivers.complete(endpoint(fake, kind), request, on_event=events.append if stream else None)
    assert r.finish_reason == "tool_calls" and len(r.tool_calls) == 1
    call = r.tool_calls[0]
    assert call.name == "file_read" and call.arguments == {"path": "a b.txt"} and call.id
    if stream:
        kinds = [type(e) for e in events]
        assert kinds[0] is ToolCallStart and kinds[-1] is ToolCallEnd and ToolCallDelta in kinds
        assert events[-1].arguments == {"path": "a b.txt"} and events[-1].id == call.id
    # Feed the result back: the fake answers with what the tool said.
    request.messages += [Message("assistant", tool_calls=[call]),
                         Message("tool", "contents!", tool_call_id=call.id, tool_name="file_read")]
    r2 = drivers.complete(endpoint(fake, kind), request)
    assert r2.text == "tool said: contents!" and r2.finish_reason == "stop"


@pytest.mark.parametrize("kind", KINDS)
def test_parameters_images_and_system_reach_the_provider(fake, kind) -> None:
    msg = Message("user", "[[echo_params]]", images=[ImagePart("image/png", PNG_B64)])
    r = drivers.complete(endpoint(fake, kind), ChatRequest(model="m-9", messages=[msg], system="be brief",
                                                           tools=[READ], max_tokens=77, temperature=0.5))
    params = json.loads(r.text)
    assert params == {"max_tokens": 77, "temperature": 0.5, "model": "m-9", "n_images": 1, "n_tools": 1,
                      "system": "be brief"}
    if kind == "gemini":
        schema = fake.requests[-1]["json"]["tools"][0]["functionDeclarations"][0]["parameters"]
        assert "additionalProperties" not in schema and schema["required"] == ["path"]


@pytest.mark.parametrize("kind", KINDS)
def test_length_finish(fake, kind) -> None:
    assert drivers.complete(endpoint(fake, kind), ask("[[length]] one two three four")).finish_reason == "length"


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_key_is_an_auth_error(fake, kind) -> None:
    with pytest.raises(LLMError) as err:
        drivers.complete(endpoint(fake, kind, api_key="nope"), ask("hi"))
    assert err.value.kind == "auth" and err.value.http_status == 401
    assert f"p-{kind}" in err.value.message and "m-1" in err.value.message


def test_missing_key_names_the_variable(fake) -> None:
    before = len(fake.requests)
    with pytest.raises(LLMError) as err:
        drivers.complete(endpoint(fake, "openai", api_key=""), ask("hi"))
    assert err.value.kind == "missing_key" and "P_KEY" in err.value.message
    assert len(fake.requests) == before  # never sent
    # A keyless local runner is called without a key.
    fake_open = endpoint(fake, "openai", api_key="", key_required=False)
    with pytest.raises(LLMError) as err:
        drivers.complete(fake_open, ask("hi"))
    assert err.value.kind == "auth"  # this fake wants a key, but the call was made


@pytest.mark.parametrize("kind", KINDS)
def test_server_errors_are_retried(fake, kind) -> None:
    r = drivers.complete(endpoint(fake, kind), ask(f"[[fail:503 times=2]] retry {kind}"), retries=2)
    assert r.text == f"echo: retry {kind}"
    with pytest.raises(LLMError) as err:
        drivers.complete(endpoint(fake, kind), ask(f"[[fail:500 times=3]] give up {kind}"), retries=1)
    assert err.value.kind == "server" and "HTTP 500" in err.value.message


def test_rate_limit_honours_retry_after(fake) -> None:
    started = time.monotonic()
    r = drivers.complete(endpoint(fake, "openai"), ask("[[fail:429 times=1 retry_after=1]] patient"))
    assert r.text == "echo: patient" and time.monotonic() - started >= 0.9


def test_rate_limit_honours_retry_after_as_an_http_date(fake) -> None:
    started = time.monotonic()
    r = drivers.complete(endpoint(fake, "openai"), ask("[[fail:429 times=1 retry_after=date:3]] dated"))
    # An HTTP date has whole seconds: 3 s ahead is 2-3 s of waiting, far above the 0.25 s backoff.
    assert r.text == "echo: dated" and 1.9 <= time.monotonic() - started < 4


@pytest.mark.parametrize("given", ["soon", "-5", "inf", "date:-60"])
def test_an_unusable_or_past_retry_after_falls_back_to_the_backoff(fake, given) -> None:
    started = time.monotonic()
    r = drivers.complete(endpoint(fake, "openai"), ask(f"[[fail:429 times=1 retry_after={given}]] {given}"))
    assert r.text == f"echo: {given}" and time.monotonic() - started < 0.9


def test_a_retry_after_beyond_the_deadline_is_reported_with_the_providers_wait(fake) -> None:
    with pytest.raises(LLMError) as err:
        drivers.complete(endpoint(fake, "openai", timeout=2.0), ask("[[fail:429 retry_after=date:120]] later"))
    assert err.value.kind == "rate_limit" and 100 <= err.value.retry_after <= 120


def test_backoff_between_retries_is_jittered_and_doubles(fake) -> None:
    waits: list[float] = []

    class Recorded(threading.Event):
        """The call's cancel event: its waits are the backoff (not slept here)."""

        def wait(self, timeout=None) -> bool:
            waits.append(timeout)
            return False

    for n in range(8):
        drivers.complete(endpoint(fake, "openai"), ask(f"[[fail:503 times=3]] jitter {n}"), retries=3,
                         cancel=Recorded())
    assert len(waits) == 24
    for n in range(3):
        nth = waits[n::3]
        assert all(0.8 * 0.25 * 2 ** n <= w <= 1.2 * 0.25 * 2 ** n for w in nth), nth
        assert len(set(nth)) > 1, f"BUG: retry {n + 1} waits the same time on every call: {nth}"


def test_client_errors_are_not_retried(fake) -> None:
    fake.reset()
    with pytest.raises(LLMError) as err:
        drivers.complete(endpoint(fake, "anthropic"), ask("[[fail:400]] nope"), retries=3)
    assert err.value.kind == "bad_request" and len(fake.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_garbage_is_a_bad_response(fake, stream) -> None:
    with pytest.raises(LLMError) as err:
        drivers.complete(endpoint(fake, "openai"), ask("[[garbage]]"), on_event=(lambda e: None) if stream else None)
    assert err.value.kind == "bad_response" and "p-openai" in err.value.message


def test_timeout_and_unreachable(fake) -> None:
    fake.reset()
    started = time.monotonic()
    with pytest.raises(LLMError) as err:
        drivers.complete(endpoint(fake, "openai", timeout=0.3), ask("[[hang]]"), retries=1)
    assert err.value.kind == "timeout" and "timed out" in err.value.message
    # timeout bounds the whole call, retries included: no second attempt fits in 0.3 s.
    assert time.monotonic() - started < 0.3 + 1
    assert fake.wait_requests(1) and len(fake.requests) == 1
    dead = endpoint(fake, "openai", base_url=f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(LLMError) as err:
        drivers.complete(dead, ask("hi"), retries=0)
    assert err.value.kind == "unreachable" and "cannot reach" in err.value.message


def test_no_retry_once_the_stream_started(fake) -> None:
    """A failure mid-stream must not be retried: the caller already showed text."""
    seen: list = []

    def boom(event) -> None:
        seen.append(event)
        raise RuntimeError("listener broke")

    fake.reset()
    with pytest.raises(RuntimeError):
        drivers.complete(endpoint(fake, "openai"), ask("[[chunks:3]]"), on_event=boom, retries=3)
    assert len(seen) == 1 and len(fake.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_cancel_returns_promptly(fake, stream) -> None:
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(LLMError) as err:
        drivers.complete(endpoint(fake, "anthropic"), ask("[[slow:3]] later [[pace:200]] [[chunks:20]]"),
                         on_event=(lambda e: None) if stream else None, cancel=cancel)
    assert err.value.kind == "cancelled" and time.monotonic() - started < 2.5


def test_unknown_format_is_refused(fake) -> None:
    with pytest.raises(LLMError) as err:
        drivers.complete(ProviderEndpoint("aws", "bedrock", fake.url, api_key=KEY), ask("hi"))
    assert "unsupported" in err.value.message


def test_strip_think() -> None:
    assert strip_think("<think>plan</think>\n\nAnswer") == "Answer"
    assert strip_think("Answer <think>never closed") == "Answer"
    assert strip_think("no tags") == "no tags"


@pytest.mark.parametrize("pieces", [["<thi", "nk>secret</thi", "nk> visible"],
                                    ["<think>sec", "ret</think>", " visible"],
                                    list("<think>secret</think> visible")])
def test_think_filter_across_chunks(pieces) -> None:
    f = ThinkFilter()
    out = "".join(f.feed(p) for p in pieces) + f.flush()
    assert out == "visible"


def test_think_filter_keeps_lookalikes() -> None:
    f = ThinkFilter()
    assert "".join(f.feed(p) for p in ["a <th", "ing> b", " <"]) + f.flush() == "a <thing> b <"
    f = ThinkFilter()
    assert f.feed("shown <think>hidden") + f.flush() == "shown "


EP = ProviderEndpoint("acme", "openai", "http://up.example/v1", timeout=7.5)


def answer(status: int, body: object = None, *, text: str | None = None, raw: bytes | None = None,
           **headers: str) -> requests.Response:
    """A response as the adapter builds it: its body still unread, in a urllib3 response."""
    data = raw if raw is not None else (text if text is not None else json.dumps(body)).encode()
    r = requests.Response()
    r.status_code = status
    r.raw = HTTPResponse(body=io.BytesIO(data), headers=headers, status=status, preload_content=False)
    r.headers.update(headers)
    r.encoding = requests.utils.get_encoding_from_headers(r.headers)
    return r


@pytest.mark.parametrize("status,kind", [(400, "bad_request"), (401, "auth"), (403, "auth"), (404, "not_found"),
                                         (408, "server"), (409, "server"), (413, "bad_request"),
                                         (418, "bad_request"), (422, "bad_request"), (429, "rate_limit"),
                                         (499, "bad_request"), (500, "server"), (503, "server"), (599, "server")])
def test_http_status_kinds(status, kind) -> None:
    err = transport.http_error(EP, "m1", answer(status, {}))
    assert (err.kind, err.http_status) == (kind, status), f"BUG: HTTP {status} mapped to {err.kind}"
    assert err.message == f"acme model m1: HTTP {status}" + (": the provider rejected the API key" if kind == "auth" else "")


def test_provider_messages_of_each_wire_format() -> None:
    openai = answer(500, {"error": {"message": "boom", "type": "server_error"}})
    assert transport.http_error(EP, "m1", openai).message == "acme model m1: HTTP 500: boom"
    typed = answer(500, {"error": {"type": "overloaded_error"}})
    assert transport.provider_message(typed) == "overloaded_error"
    plain = answer(502, {"error": "bad gateway"})
    assert transport.provider_message(plain) == "bad gateway"
    assert transport.provider_message(answer(500, ["error"])) == ""
    assert transport.provider_message(answer(500, {"detail": "x"})) == ""
    html = answer(502, text="  <html>proxy down</html>\n")
    assert transport.provider_message(html) == "<html>proxy down</html>"
    long = "x" * 500
    assert transport.provider_message(answer(500, {"error": {"message": long}})) == "x" * 300
    assert transport.provider_message(answer(500, {"error": long})) == "x" * 300
    assert transport.provider_message(answer(500, text=long)) == "x" * 300, "BUG: error text not capped at 300"


def test_auth_errors_keep_the_providers_reason() -> None:
    err = transport.http_error(EP, "m1", answer(401, {"error": {"message": "Incorrect API key"}}))
    assert err.message == "acme model m1: HTTP 401: the provider rejected the API key (Incorrect API key)"


@pytest.mark.parametrize("raw,expected", [("2", 2.0), ("0.5", 0.5), ("-3", None), ("0", 0.0),
                                          ("soon", None), ("", None), ("inf", None),
                                          ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0)])
def test_retry_after_parsing(raw, expected) -> None:
    err = transport.http_error(EP, "m1", answer(429, {}, **{"Retry-After": raw}))
    assert err.retry_after == expected, f"BUG: Retry-After {raw!r} read as {err.retry_after!r}"


def test_read_json_and_event_json_refuse_non_objects() -> None:
    assert transport.read_json(EP, "m1", answer(200, {"a": 1})) == {"a": 1}
    for bad, why in ((answer(200, text="{nope"), "the answer is not valid JSON"),
                     (answer(200, [1, 2]), "the answer is not a JSON object")):
        with pytest.raises(LLMError) as caught:
            transport.read_json(EP, "m1", bad)
        assert (caught.value.kind, caught.value.message) == ("bad_response", f"acme model m1: unusable response: {why}")
    assert transport.parse_event_json(EP, "m1", '{"x": 2}') == {"x": 2}
    for data, why in (("nope", "a stream event is not valid JSON"), ("[1]", "a stream event is not a JSON object")):
        with pytest.raises(LLMError) as caught:
            transport.parse_event_json(EP, "m1", data)
        assert caught.value.message == f"acme model m1: unusable response: {why}"


@pytest.mark.parametrize("raw,headers,expected", [
    ('{"t": "\u00e9"}'.encode(), {"Content-Type": "application/json"}, "\u00e9"),
    # Not UTF-8: read in the charset the answer declares, as `response.json()` did.
    ('{"t": "\u00e9"}'.encode("latin-1"), {"Content-Type": "application/json; charset=iso-8859-1"}, "\u00e9"),
    # Not UTF-8 and none declared: the bad byte becomes U+FFFD, the rest is kept.
    (b'{"t": "a\xffb"}', {"Content-Type": "application/json"}, "a\ufffdb"),
    # ... and with no Content-Type at all (no encoding known): read as UTF-8 all the same.
    (b'{"t": "a\xffb"}', {}, "a\ufffdb"),
    ('{"t": "x"}'.encode("utf-16"), {"Content-Type": "application/json"}, "x"),
    (gzip.compress(b'{"t": "zipped"}', mtime=0), {"Content-Type": "application/json", "Content-Encoding": "gzip"}, "zipped"),
], ids=["utf-8", "declared-latin-1", "bad-utf-8", "bad-utf-8-untyped", "utf-16", "gzip"])  # (ids: the same in every xdist worker)
def test_read_json_decodes_the_body_as_sent(raw, headers, expected) -> None:
    assert transport.read_json(EP, "m1", answer(200, raw=raw, **headers)) == {"t": expected}


def test_read_json_unknown_charset_is_a_bad_response() -> None:
    bad = answer(200, raw=b'{"t": "\xe9"}', **{"Content-Type": "application/json; charset=no-such-codec"})
    with pytest.raises(LLMError) as caught:
        transport.read_json(EP, "m1", bad)
    assert caught.value.kind == "bad_response"


def _one_answer(head_and_body: bytes) -> str:
    """A server on 127.0.0.1 that answers one request with these bytes, then closes; its URL."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(head_and_body)
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/v1/chat/completions"


def test_read_body_maps_urllib3_errors_as_requests_does() -> None:
    # A body shorter than its Content-Length: requests' `content` raises ChunkedEncodingError.
    url = _one_answer(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{\"t\": 1")
    response = transport.send_json(url, {}, {"x": 1}, timeout=(5, 5))
    with pytest.raises(requests.exceptions.ChunkedEncodingError) as caught:
        reading.read_body(response)
    guard = CallGuard(time.monotonic() + 5, None, threading.Event())
    guard.received = True
    assert transport.network_error(EP, "m1", caught.value, guard).message == (
        "acme model m1: the connection broke while reading the answer: ChunkedEncodingError")
    broken = answer(200, raw=b"not gzip at all", **{"Content-Encoding": "gzip"})
    with pytest.raises(requests.exceptions.ContentDecodingError) as decoding:
        reading.read_body(broken)
    # requests' own exceptions, each wrapping urllib3's (as `response.content` raises them).
    assert isinstance(caught.value.args[0], urllib3.exceptions.ProtocolError)
    assert isinstance(decoding.value.args[0], urllib3.exceptions.DecodeError)


def test_truncated_message() -> None:
    err = transport.truncated(EP, "m1", "[DONE]")
    assert (err.kind, err.message) == (
        "truncated", "acme model m1: the stream was cut off before the answer was complete (no [DONE])")


@pytest.mark.parametrize("raw,expected", [({"a": 1}, {"a": 1}), ('{"a": 1}', {"a": 1}), ("", {}), (None, {}),
                                          ("{broken", {}), ("[1, 2]", {}), ('"text"', {}), (7, {})])
def test_parse_arguments(raw, expected) -> None:
    assert transport.parse_arguments(raw) == expected


def test_usage_from() -> None:
    assert transport.usage_from({"in": 5, "out": 7}, "in", "out") == Usage(5, 7)
    assert transport.usage_from({"in": None}, "in", "out") == Usage(0, 0)
    assert transport.usage_from({"in": "12", "out": 3.0}, "in", "out") == Usage(12, 3)
    assert transport.usage_from(None, "in", "out") is None and transport.usage_from([1], "in", "out") is None


def test_merge_turns_joins_consecutive_sides_and_drops_empty_ones() -> None:
    msgs = [Message("system", "sys"), Message("user", "a"), Message("tool", "r1"), Message("assistant", "b"),
            Message("assistant", ""), Message("assistant", "c"), Message("user", "d")]
    merged = transport.merge_turns(msgs, "model", "parts", lambda m: [m.content] if m.content else [])
    assert merged == [{"role": "user", "parts": ["sys", "a", "r1"]}, {"role": "model", "parts": ["b", "c"]},
                      {"role": "user", "parts": ["d"]}]


class _Raw:
    """What `response.raw` offers the SSE reader: successive reads of the given pieces."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    def read1(self, size: int, decode_content: bool = True) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


def events(pieces: list[bytes]) -> list[tuple[str, str]]:
    r = requests.Response()
    r.raw = _Raw(pieces)
    guard = CallGuard(time.monotonic() + 5, None, threading.Event())
    return [(e.event, e.data) for e in reading.iter_sse(r, guard)]


def test_sse_parsing_edge_cases() -> None:
    body = (b": keep-alive\n\nevent: delta\r\ndata: {\"a\":\r\ndata:1}\r\n\r\n"
            b"data:no space\nid: 3\nretry: 10\n\n\n\ndata:  two spaces\n\nevent: only-name\n\n")
    assert events([body]) == [("delta", '{"a":\n1}'), ("", "no space"), ("", " two spaces")], \
        "BUG: SSE fields, comments or line endings are parsed wrongly"


def test_sse_events_split_across_reads_and_a_final_unterminated_line() -> None:
    assert events([b"da", b"ta: he", b"llo\n", b"\ndata: tail"]) == [("", "hello"), ("", "tail")]
    assert events([b"event: e\ndata: x\r\n"]) == [("e", "x")], "BUG: the last event without a blank line is lost"
    assert events([b"data:   padded\r"]) == [("", "  padded")], "one space after the colon is dropped, as on any line"
    assert events([b"event: lonely"]) == [] and events([]) == []


def test_sse_reader_stops_when_the_guard_trips() -> None:
    r = requests.Response()
    r.raw = _Raw([b"data: a\n\n", b"data: b\n\n"])
    guard = CallGuard(time.monotonic() + 5, None, threading.Event())
    reader = reading.iter_sse(r, guard)
    assert next(reader).data == "a"
    guard.reason = "cancelled"
    with pytest.raises(reading.Interrupted, match="cancelled"):
        next(reader)


def guard(**state) -> CallGuard:
    g = CallGuard(time.monotonic() + 5, 2.0, threading.Event())
    for key, value in state.items():
        setattr(g, key, value)
    return g


def test_network_error_messages_per_phase() -> None:
    conn = requests.ConnectionError("boom")
    cases = [
        (None, conn, "unreachable", "acme model m1: cannot reach http://up.example/v1: connection failed"),
        (guard(), OSError("x"), "unreachable", "acme model m1: cannot reach http://up.example/v1: connection failed"),
        (None, requests.Timeout("t"), "timeout", "acme model m1: timed out after 7.5s waiting for http://up.example/v1"),
        (None, ValueError("Read timed out."), "timeout",
         "acme model m1: timed out after 7.5s waiting for http://up.example/v1"),
        (guard(sent=True), conn, "reset", "acme model m1: connection reset by http://up.example/v1 after the "
                                          "request was sent (the provider may have received it; not retried)"),
        (guard(sent=True, reused=True), conn, "unreachable",
         "acme model m1: the kept-alive connection to http://up.example/v1 was closed"),
        (guard(sent=True, received=True), conn, "server",
         "acme model m1: the connection broke while reading the answer: ConnectionError"),
        (guard(sent=True, received=True, last_byte=1.0), conn, "truncated",
         "acme model m1: the stream was cut off before the answer was complete "
         "(no end of stream: the connection broke (ConnectionError))"),
        (None, requests.exceptions.ChunkedEncodingError("c"), "server",
         "acme model m1: the connection broke: ChunkedEncodingError"),
        (None, ValueError("odd"), "server", "acme model m1: the connection broke: ValueError"),
    ]
    for g, exc, kind, message in cases:
        err = transport.network_error(EP, "m1", exc, g)
        assert (err.kind, err.message) == (kind, message), f"BUG: {exc!r} with {vars(g) if g else None}"
        assert (err.provider, err.model) == ("acme", "m1")


def test_guard_reasons_win_over_the_exception() -> None:
    expected = {
        "cancelled": ("cancelled", "acme model m1: call cancelled"),
        "idle": ("timeout", "acme model m1: timed out: the stream stalled, no data for 2s from "
                            "http://up.example/v1 (stream_idle_secs)"),
        "timeout": ("timeout", "acme model m1: timed out after 7.5s waiting for http://up.example/v1 (timeout_secs)"),
    }
    for reason, (kind, message) in expected.items():
        err = transport.network_error(EP, "m1", requests.ConnectionError("x"), guard(reason=reason, sent=True))
        assert (err.kind, err.message) == (kind, message), f"BUG: guard reason {reason} reported wrongly"


def test_post_refuses_when_no_time_is_left() -> None:
    spent = CallGuard(time.monotonic() - 0.01, None, threading.Event())
    with pytest.raises(reading.Interrupted, match="timeout"):
        transport.post(EP, "m1", "http://127.0.0.1:9/x", {}, {}, spent)


def test_errors_name_provider_and_model() -> None:
    for err in (transport.http_error(EP, "m1", answer(500, {})), transport.bad_response(EP, "m1", "why")):
        assert (err.provider, err.model) == ("acme", "m1"), "BUG: an LLM error lost its provider or model"
    assert transport.provider_message(answer(500, {"error": {"code": 5}})) == ""


def test_sse_lines_keep_their_spaces_and_replace_bad_bytes() -> None:
    assert events([b"data: x  \r\n\r\n"]) == [("", "x  ")], "BUG: SSE values lose trailing spaces"
    assert events([b"data: caf\xe9\n\n"]) == [("", "caf\ufffd")]
    assert events([b"data: a\ndata: b\ndata:xyz"]) == [("", "a\nb\nxyz")], "BUG: an unterminated last line is misread"
    assert events([b"data:\tx  \r\n"]) == [("", "\tx  ")]
    assert events([b"data: caf\xe9"]) == [("", "caf\ufffd")]


def test_sse_bodies_are_decompressed() -> None:
    """A gzip-encoded stream (some gateways compress SSE) is decoded as it is read."""
    import gzip

    from upstream_stub import answer, upstream

    body = gzip.compress(b"data: {\"n\": 1}\n\ndata: [DONE]\n\n")
    with upstream(answer(body, "text/event-stream", Content_Encoding="gzip")) as base:
        g = CallGuard(time.monotonic() + 5, None, threading.Event())
        response = transport.post(EP, "m1", f"{base}/chat", {}, {"stream": True}, g)
        assert [(e.event, e.data) for e in reading.iter_sse(response, g)] == [("", '{"n": 1}'), ("", "[DONE]")], \
            "BUG: a gzip-encoded stream is not decompressed"


def test_guard_errors_name_provider_and_model() -> None:
    for reason in ("cancelled", "idle", "timeout"):
        err = transport.guard_error(EP, "m1", guard(reason=reason))
        assert (err.provider, err.model) == ("acme", "m1"), f"BUG: a {reason} error does not name provider and model"


def test_sse_line_ends_and_an_unterminated_last_line_keep_their_text() -> None:
    assert events([b"data: endsX\r\n\n"]) == [("", "endsX")], "BUG: more than the CR is stripped from a line"
    assert events([b"data: tailX"]) == [("", "tailX")]
    assert events([b"data: cr\r"]) == [("", "cr")], "BUG: a CR at the end of the last line is kept"
    assert events([b"data:\ttabbed  "]) == [("", "\ttabbed  ")], "BUG: the last line loses more than the spaces after 'data:'"
    assert events([b"data: Xmark"]) == [("", "Xmark")]


def test_sessions_use_the_guarded_adapter_and_the_environment(monkeypatch) -> None:
    from agentd.llm.drivers.guard import GuardedAdapter

    def fresh_session():
        out: list = []
        t = threading.Thread(target=lambda: out.append(transport.session()))   # one session per thread
        t.start()
        t.join()
        return out[0]

    for name in list(os.environ):
        if name.lower() in ("http_proxy", "https_proxy", "all_proxy", "requests_ca_bundle", "curl_ca_bundle"):
            monkeypatch.delenv(name)
    plain = fresh_session()
    assert isinstance(plain.get_adapter("https://api.example/v1"), GuardedAdapter), \
        "BUG: https calls bypass the call guard"
    assert isinstance(plain.get_adapter("http://api.example/v1"), GuardedAdapter)
    assert plain.trust_env is False and plain.verify is True
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("CURL_CA_BUNDLE", "/etc/ssl/curl.pem")
    proxied = fresh_session()
    assert proxied.trust_env is True, "BUG: a configured proxy is ignored"
    assert proxied.verify == "/etc/ssl/curl.pem"
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/requests.pem")
    assert fresh_session().verify == "/etc/ssl/requests.pem", "BUG: REQUESTS_CA_BUNDLE does not win"


def test_a_connect_that_hangs_ends_at_the_connect_timeout() -> None:
    # A listener whose accept queue is full: the kernel drops further SYNs, so a connect
    # hangs as it would to a host that drops packets. No socket exists yet for the guard to
    # shut down; only the connect timeout (0.1 s here, well inside the 0.9 s deadline) ends it.
    import socket

    from agentd.llm import drivers
    from agentd.llm.types import ChatRequest

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=5)
    base = f"http://127.0.0.1:{port}/v1"
    ep = ProviderEndpoint("acme", "openai", base, api_key="k", timeout=0.9, connect_timeout=0.1)
    try:
        with pytest.raises(LLMError) as err:
            drivers.complete(ep, ChatRequest(model="m1", messages=[Message("user", "hi")]), retries=0)
    finally:
        filler.close()
        listener.close()
    assert (err.value.kind, err.value.message) == ("timeout", f"acme model m1: timed out after 0.9s waiting for {base}"), \
        "BUG: the connect was not ended by its own timeout"
