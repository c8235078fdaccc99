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
