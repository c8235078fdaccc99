"""The agent loop, value by value, with the real OpenAI driver against the fake LLM server.

What is checked exactly: the messages a run appends to the session, the events a client
sees (order, names, details), the texts the model reads for every refused or failed tool
call, the iteration limit's answer, and usage summed over model calls.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agentd.agents.loop import AgentLoop, LoopStopped, RunCancelled, RunSpec
from agentd.agents.tools import ToolContext, ToolError, get_tool
from agentd.agents.tools.base import Tool
from agentd.llm import drivers
from agentd.llm.types import ChatResponse, Message, ProviderEndpoint, Usage
from tests.test_tools import make_ctx

KEY = "sk-loop"


@pytest.fixture(scope="module")
def fake():
    from fakellm import FakeLLM

    server = FakeLLM(required_key=KEY).start()
    yield server
    server.stop()


def spec_for(fake, tmp_path: Path, text: str, **kw: Any) -> tuple[RunSpec, list, list]:
    ep = ProviderEndpoint("p", "openai", fake.openai_base, api_key=KEY, timeout=10)
    events: list = []
    usages: list[ChatResponse] = []
    streaming = kw.pop("stream", True)

    def llm(request, on_event, cancel):
        return drivers.complete(ep, request, on_event=on_event if streaming else None, cancel=cancel, retries=0)

    ctx: ToolContext = kw.pop("ctx", None) or make_ctx(tmp_path)
    fields = dict(model="m", system="sys", history=[], user=Message("user", text),
                  tools=kw.pop("tools", [get_tool("file_write"), get_tool("file_read")]), tool_ctx=ctx, llm=llm,
                  max_iterations=5, tool_timeout=5.0, emit=events.append, on_usage=usages.append)
    fields.update(kw)
    return RunSpec(**fields), events, usages


def run_loop(spec: RunSpec, cancel: threading.Event | None = None):
    return AgentLoop(spec, cancel or threading.Event()).run()


def kinds(events) -> list[str]:
    return [e.type if e.type != "phase" else f"phase:{e.data['phase']}:{e.data['detail']}" for e in events
            if e.type not in ("text_delta", "tool_args_delta")]


def test_a_plain_answer(fake, tmp_path) -> None:
    spec, events, usages = spec_for(fake, tmp_path, "hello loop", mode_note="full")
    result = run_loop(spec)
    assert (result.response, result.iterations, result.finish_reason) == ("echo: hello loop", 1, "stop")
    assert [(m.role, m.content) for m in result.new_messages] == [("user", "hello loop"),
                                                                  ("assistant", "echo: hello loop")]
    assert kinds(events) == ["phase:streaming:full", "phase:done:"]
    assert "".join(e.data["content"] for e in events if e.type == "text_delta") == "echo: hello loop"
    assert len(usages) == 1 and result.usage == usages[0].usage and result.tool_calls == []


def test_a_tool_round_trip_records_everything_in_order(fake, tmp_path) -> None:
    spec, events, usages = spec_for(fake, tmp_path, '[[tool:file_write {"path": "a.txt", "content": "hi"}]]')
    result = run_loop(spec)
    assert (result.response, result.iterations, result.finish_reason) == \
        ("tool said: wrote 2 bytes to a.txt", 2, "stop")
    roles = [(m.role, m.tool_name, m.is_error) for m in result.new_messages]
    assert roles == [("user", None, False), ("assistant", None, False), ("tool", "file_write", False),
                     ("assistant", None, False)]
    call = result.new_messages[1].tool_calls[0]
    assert result.new_messages[2].tool_call_id == call.id and result.new_messages[2].content == "wrote 2 bytes to a.txt"
    assert result.tool_calls == [{"id": call.id, "name": "file_write", "arguments": {"path": "a.txt", "content": "hi"}}]
    assert kinds(events) == ["phase:streaming:", "tool_use", "tool_input", "phase:tool_use:file_write", "tool_result",
                             "phase:thinking:iteration 2", "phase:done:"]
    result_event = [e for e in events if e.type == "tool_result"][0].data
    assert result_event == {"id": call.id, "tool": "file_write", "input": {"path": "a.txt", "content": "hi"},
                            "result": "wrote 2 bytes to a.txt", "is_error": False}
    assert len(usages) == 2 and result.usage == usages[0].usage + usages[1].usage, "BUG: usage not summed over calls"
    assert (tmp_path / "ws" / "a.txt").read_text() == "hi"


def test_the_iteration_limit_answers_and_keeps_what_was_done(fake, tmp_path) -> None:
    spec, events, _ = spec_for(fake, tmp_path, '[[tool:file_read {"path": "x"} x100]]', max_iterations=2)
    result = run_loop(spec)
    assert result.response == "[stopped after 2 iterations: the agent was still calling tools]"
    assert (result.iterations, result.finish_reason, len(result.tool_calls)) == (2, "tool_calls", 2)
    assert [m.role for m in result.new_messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert kinds(events)[-1] == "phase:done:max_iterations"


def test_exactly_max_iterations_model_calls_are_made(fake, tmp_path) -> None:
    spec, _, usages = spec_for(fake, tmp_path, '[[tool:file_read {"path": "x"} x2]]', max_iterations=3)
    result = run_loop(spec)
    assert result.iterations == 3 and result.finish_reason == "stop" and len(usages) == 3, \
        "BUG: the last allowed iteration is not used"


def refused_text(fake, tmp_path, text: str, **kw: Any) -> tuple[str, bool]:
    spec, _, _ = spec_for(fake, tmp_path, text, **kw)
    msg = [m for m in run_loop(spec).new_messages if m.role == "tool"][0]
    return msg.content, msg.is_error


def test_texts_the_model_reads_for_refused_calls(fake, tmp_path) -> None:
    assert refused_text(fake, tmp_path, '[[tool:shell_exec {"command": "ls"}]]') == \
        ("permission denied: tool 'shell_exec' is not available to this agent", True)
    assert refused_text(fake, tmp_path, '[[tool:shell_exec {"command": "ls"}]]', mode_note="observe mode") == \
        ("permission denied: tool 'shell_exec' is not available to this agent (observe mode)", True)
    assert refused_text(fake, tmp_path, '[[tool:file_read {}]]') == \
        ("error: 'file_read' is missing required argument(s): path", True)
    assert refused_text(fake, tmp_path, '[[tool:file_read {"path": "nope"}]]') == ("error: no such file: nope", True)


@pytest.mark.parametrize("decision,reason", [("rejected", "a human rejected it"),
                                             ("timeout", "approval timed out"),
                                             ("cancelled", "the run was cancelled"),
                                             ("policy says no", "policy says no")])
def test_approval_decisions_as_the_model_reads_them(fake, tmp_path, decision, reason) -> None:
    asked: list = []
    text, is_error = refused_text(fake, tmp_path, '[[tool:file_write {"path": "f", "content": "x"}]]',
                                  approver=lambda name, args: asked.append((name, args)) or decision)
    assert (text, is_error) == (f"denied: the call to 'file_write' was not performed because {reason}.", True)
    assert asked == [("file_write", {"path": "f", "content": "x"})]
    assert not (tmp_path / "ws" / "f").exists(), "BUG: a denied call was performed"


def test_an_approved_call_runs(fake, tmp_path) -> None:
    spec, events, _ = spec_for(fake, tmp_path, '[[tool:file_write {"path": "f", "content": "x"}]]',
                               approver=lambda name, args: "approved")
    assert run_loop(spec).response == "tool said: wrote 1 bytes to f"
    assert "phase:awaiting_approval:file_write" in kinds(events)


def custom_tool(name: str, behaviour) -> Tool:
    return Tool(name, "test tool", {"type": "object", "properties": {}}, lambda ctx, args: behaviour())


def test_tool_failures_as_the_model_reads_them(fake, tmp_path) -> None:
    def crash():
        raise ValueError("bad input")

    def slow():
        time.sleep(2)
        return "late"

    def refuse():
        raise ToolError("nope")

    cases = [(custom_tool("crash", crash), "error: tool 'crash' failed: ValueError: bad input"),
             (custom_tool("slow", slow), "error: tool 'slow' timed out after 0.2s"),
             (custom_tool("refuse", refuse), "error: nope")]
    for tool, expected in cases:
        assert refused_text(fake, tmp_path, f"[[tool:{tool.name}]]", tools=[tool], tool_timeout=0.2) == (expected, True)
    structured = custom_tool("structured", lambda: {"n": 1})
    assert refused_text(fake, tmp_path, "[[tool:structured]]", tools=[structured]) == ('{"n": 1}', False), \
        "BUG: a tool's non-string output is not JSON-encoded"


def test_non_object_arguments_are_refused() -> None:
    loop = AgentLoop.__new__(AgentLoop)
    loop.offered = {"file_read": get_tool("file_read")}
    assert loop._execute("file_read", ["x"]) == ("invalid arguments for 'file_read': expected a JSON object", True)


def test_a_cancelled_run_stops_before_calling_the_model(fake, tmp_path) -> None:
    spec, _, usages = spec_for(fake, tmp_path, "never")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(RunCancelled, match="run cancelled"):
        run_loop(spec, cancel)
    assert usages == []


def test_the_loop_guard_ends_a_run_with_its_count(fake, tmp_path) -> None:
    spec, _, _ = spec_for(fake, tmp_path, '[[tool:file_read {"path": "x"} x100]]', max_iterations=50)
    with pytest.raises(LoopStopped) as caught:
        run_loop(spec)
    assert str(caught.value).startswith("loop guard stopped the run: ") and \
        str(caught.value).endswith(" tool calls were blocked for repeating identical arguments")


def test_think_text_never_reaches_the_history_or_the_stream(fake, tmp_path) -> None:
    spec, events, _ = spec_for(fake, tmp_path, '[[think:calls]] [[tool:file_read {"path": "x"}]]')
    result = run_loop(spec)
    stored = " ".join(m.content for m in result.new_messages)
    streamed = "".join(e.data["content"] for e in events if e.type == "text_delta")
    assert "secret reasoning" not in stored and "secret reasoning" not in streamed, "BUG: <think> text kept"
    assert result.new_messages[1].content == "calling a tool"


def test_without_a_sink_nothing_is_emitted_and_the_answer_is_the_same(fake, tmp_path) -> None:
    spec, events, _ = spec_for(fake, tmp_path, '[[tool:file_write {"path": "q", "content": "z"}]]',
                               emit=None, stream=False)
    assert run_loop(spec).response == "tool said: wrote 1 bytes to q" and events == []


def test_history_is_sent_before_the_new_message(fake, tmp_path) -> None:
    history = [Message("user", "earlier"), Message("assistant", "before")]
    spec, _, _ = spec_for(fake, tmp_path, "now", history=history)
    result = run_loop(spec)
    sent = fake.requests[-1]["json"]["messages"]
    assert [m["content"] for m in sent] == ["sys", "earlier", "before", "now"]
    assert [m.content for m in result.new_messages] == ["now", "echo: now"], "BUG: history re-appended to the session"
    assert result.usage == Usage(result.usage.input_tokens, result.usage.output_tokens)
