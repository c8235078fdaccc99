"""The agent loop, value by value, with the real OpenAI driver against the fake LLM server.

What is checked exactly: the messages a run appends to the session, the events a client
sees (order, names, details), the texts the model reads for every refused or failed tool
call, the iteration limit's answer, and usage summed over model calls.
"""

from __future__ import annotations

import json
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
from support import children_named, in_forked_child
from tests.agents.tools.test_tools import make_ctx

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
    spec, events, usages = spec_for(fake, tmp_path, '[[tool:file_read {"path": "x"} x100]]', max_iterations=2)
    result = run_loop(spec)
    assert result.response == "[stopped after 2 iterations: the agent was still calling tools]"
    assert (result.iterations, result.finish_reason, len(result.tool_calls)) == (2, "tool_calls", 2)
    assert [m.role for m in result.new_messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert result.new_messages[-1].content == result.response, "BUG: the stored last turn lost its text"
    assert kinds(events)[-1] == "phase:done:max_iterations"
    assert len(usages) == 2 and result.usage == usages[0].usage + usages[1].usage, \
        "BUG: a run stopped at the iteration limit lost its usage"


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
    with pytest.raises(RunCancelled, match="^run cancelled$"):
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


def test_each_turns_text_is_set_apart_streamed_and_in_what_the_run_said(fake, tmp_path) -> None:
    spec, events, _ = spec_for(fake, tmp_path, '[[think:calls]] [[tool:file_read {"path": "x"} x2]]',
                               max_iterations=2)
    result = run_loop(spec)
    said = "calling a tool\n\ncalling a tool\n\n[stopped after 2 iterations: the agent was still calling tools]"
    deltas = [e.data["content"] for e in events if e.type == "text_delta"]
    assert "".join(deltas) == said == result.said
    # The break opens a turn's first delta, never a later one of the same turn.
    assert deltas == ["calling", " a", " tool", "\n\ncalling", " a", " tool",
                      "\n\n[stopped after 2 iterations: the agent was still calling tools]"]
    # A turn that said nothing is no break: the plain answer after a silent tool call.
    spec, events, _ = spec_for(fake, tmp_path, '[[tool:file_read {"path": "x"}]]')
    result = run_loop(spec)
    assert "".join(e.data["content"] for e in events if e.type == "text_delta") == result.said == result.response


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


# -- what each model call carries ------------------------------------------------------------------

def test_each_call_carries_the_model_system_tools_and_sampling(fake, tmp_path) -> None:
    from agentd.llm.types import GenerationParams

    spec, _, _ = spec_for(fake, tmp_path, "[[echo_params]]", max_tokens=77, temperature=0.25,
                          params=GenerationParams(seed=7))
    result = run_loop(spec)
    assert json.loads(result.response) == {"max_tokens": 77, "temperature": 0.25, "model": "m", "n_images": 0,
                                           "n_tools": 2, "system": "sys"}, "BUG: a run drops its sampling settings"
    sent = fake.requests[-1]["json"]
    assert sent["seed"] == 7, "BUG: generation params not passed to the model"
    assert [(t["function"]["name"], t["function"]["description"], t["function"]["parameters"]) for t in sent["tools"]] \
        == [(t.name, t.description, t.parameters) for t in (get_tool("file_write"), get_tool("file_read"))], \
        "BUG: the tools offered to the model are not the agent's tools"


def test_the_system_prompt_is_refreshed_before_every_later_call(fake, tmp_path) -> None:
    refreshed: list[int] = []

    def refresh() -> str:
        refreshed.append(1)
        return f"fresh {len(refreshed)}"

    spec, events, _ = spec_for(fake, tmp_path, '[[tool:file_read {"path": "x"} x2]]', refresh_system=refresh)
    before = len(fake.requests)
    run_loop(spec)
    systems = [r["json"]["messages"][0]["content"] for r in fake.requests[before:]]
    assert systems == ["sys", "fresh 1", "fresh 2"], "BUG: a fact stored mid-run does not reach the next call"
    assert kinds(events).count("phase:thinking:iteration 2") == 1 and "phase:thinking:iteration 3" in kinds(events)


def test_streamed_tool_call_events_carry_exact_data(fake, tmp_path) -> None:
    spec, events, _ = spec_for(fake, tmp_path, '[[tool:file_write {"path": "e.txt", "content": "ev"}]]')
    result = run_loop(spec)
    call = result.new_messages[1].tool_calls[0]
    assert [e.data for e in events if e.type == "tool_use"] == [{"id": call.id, "tool": "file_write", "index": 0}]
    assert [e.data for e in events if e.type == "tool_input"] == \
        [{"id": call.id, "tool": "file_write", "input": {"path": "e.txt", "content": "ev"}, "index": 0}]
    deltas = [e.data for e in events if e.type == "tool_args_delta"]
    assert {d["index"] for d in deltas} == {0} and len(deltas) >= 2
    assert json.loads("".join(d["arguments"] for d in deltas)) == {"path": "e.txt", "content": "ev"}


def test_a_held_back_tag_prefix_is_flushed_at_the_end_of_the_stream(fake, tmp_path) -> None:
    spec, events, _ = spec_for(fake, tmp_path, "[[reply:see <th]]")
    assert run_loop(spec).response == "see <th"
    assert "".join(e.data["content"] for e in events if e.type == "text_delta") == "see <th", \
        "BUG: the end of a streamed answer that looks like a tag is lost"
    assert all(e.data["content"] for e in events if e.type == "text_delta"), "an empty text_delta was emitted"


def test_think_text_is_stripped_from_a_final_answer(fake, tmp_path) -> None:
    spec, events, _ = spec_for(fake, tmp_path, "[[think]] plain")
    result = run_loop(spec)
    assert result.response == "echo: plain" and result.new_messages[-1].content == "echo: plain", \
        "BUG: <think> text kept in the final answer"


def test_without_on_usage_the_run_still_sums_usage(fake, tmp_path) -> None:
    spec, _, _ = spec_for(fake, tmp_path, "two words", on_usage=None)
    result = run_loop(spec)
    assert result.response == "echo: two words" and result.usage.output_tokens == 3


# -- cancellation and model errors ---------------------------------------------------------------------

def test_cancel_during_a_model_call_is_a_cancelled_run(fake, tmp_path) -> None:
    spec, _, _ = spec_for(fake, tmp_path, "[[hang]]")
    cancel = threading.Event()
    loop = AgentLoop(spec, cancel)
    threading.Timer(0.3, cancel.set).start()
    with pytest.raises(RunCancelled, match="^run cancelled$"):
        loop.run()
    assert [m.content for m in loop.new_messages] == ["[[hang]]"], "the user's message is kept for the session"


def test_a_failing_model_call_is_raised_as_is(fake, tmp_path) -> None:
    from agentd.llm.types import LLMError

    spec, _, usages = spec_for(fake, tmp_path, "[[fail:400]] no")
    with pytest.raises(LLMError) as caught:
        run_loop(spec)
    assert caught.value.kind != "cancelled" and caught.value.http_status == 400 and usages == []


def test_cancel_between_tool_calls_stops_the_rest(fake, tmp_path) -> None:
    cancel = threading.Event()
    ran: list[str] = []

    def first() -> str:
        ran.append("first")
        cancel.set()
        return "one"

    tools = [custom_tool("first", first), custom_tool("second", lambda: ran.append("second") or "two")]
    spec, _, _ = spec_for(fake, tmp_path, "[[tools:first {} | second {}]]", tools=tools)
    loop = AgentLoop(spec, cancel)
    with pytest.raises(RunCancelled):
        loop.run()
    assert ran == ["first"], "BUG: a stopped run went on calling tools"
    assert [m.role for m in loop.new_messages] == ["user", "assistant", "tool"]


# -- the loop guard, message by message --------------------------------------------------------------

def test_loop_guard_texts_as_the_model_reads_them(fake, tmp_path) -> None:
    from agentd.agents.loop_guard import BLOCK_AT, STOP_AFTER_BLOCKED, WARN_AT

    spec, events, _ = spec_for(fake, tmp_path, '[[tool:file_read {"path": "x"} x100]]', max_iterations=100)
    loop = AgentLoop(spec, threading.Event())
    with pytest.raises(LoopStopped) as caught:
        loop.run()
    assert str(caught.value) == (f"loop guard stopped the run: {STOP_AFTER_BLOCKED} tool calls were blocked "
                                 "for repeating identical arguments"), "BUG: the loop guard's stop message is wrong"
    tools = [(m.content, m.is_error) for m in loop.new_messages if m.role == "tool"]
    assert len(tools) == BLOCK_AT - 1 + STOP_AFTER_BLOCKED
    plain = ("error: no such file: x", True)
    assert tools[:WARN_AT - 1] == [plain] * (WARN_AT - 1)
    for n in range(WARN_AT, BLOCK_AT):
        assert tools[n - 1] == (f"error: no such file: x\n\n[loop guard] warning: tool 'file_read' has been called "
                                f"{n} times with identical arguments; it will be blocked from call {BLOCK_AT} on.",
                                True), "BUG: the loop guard's warning does not reach the model"
    assert tools[BLOCK_AT - 1] == (f"blocked by loop guard: tool 'file_read' was called {BLOCK_AT} times with "
                                   "identical arguments; it was not run. Try a different approach.", True)
    results = [e.data for e in events if e.type == "tool_result"]
    assert [(r["result"], r["is_error"]) for r in results] == tools
    assert [e.data["detail"] for e in events if e.type == "phase" and e.data["phase"] == "tool_use"] == \
        ["file_read"] * len(tools)


def test_a_warned_call_that_succeeds_is_not_an_error(fake, tmp_path) -> None:
    ok = custom_tool("ok", lambda: "fine")
    spec, _, _ = spec_for(fake, tmp_path, "[[tool:ok {} x3]]", tools=[ok])
    tools = [(m.content, m.is_error) for m in run_loop(spec).new_messages if m.role == "tool"]
    assert tools[2] == ("fine\n\n[loop guard] warning: tool 'ok' has been called 3 times with identical "
                        "arguments; it will be blocked from call 5 on.", False)


def test_a_crashing_tool_is_logged_with_its_traceback(fake, tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    def crash():
        raise KeyError("k")

    caplog.set_level("WARNING", logger="agentd.loop")
    assert refused_text(fake, tmp_path, "[[tool:crash]]", tools=[custom_tool("crash", crash)]) == \
        ("error: tool 'crash' failed: KeyError: 'k'", True)
    records = [r for r in caplog.records if r.name == "agentd.loop"]
    assert [(r.levelname, r.getMessage()) for r in records] == [("WARNING", "tool crash raised")]
    assert records[0].exc_info and records[0].exc_info[0] is KeyError


def test_a_forked_child_runs_tools_on_a_pool_of_its_own() -> None:
    from agentd.agents import loop as loop_mod

    parent_pool = loop_mod._TOOL_POOL
    assert parent_pool.submit(lambda: 1).result(timeout=5) == 1   # the parent's threads exist now

    def child_has_its_own() -> bool:
        pool = loop_mod._TOOL_POOL
        return pool is not parent_pool and pool.submit(lambda: 2).result(timeout=5) == 2

    assert in_forked_child(child_has_its_own), \
        "BUG: a forked child submits tools to a pool whose threads it does not have"
    assert loop_mod._TOOL_POOL is parent_pool


def test_a_timed_out_tool_is_told_to_stop_and_sees_its_runs_cancel(fake, tmp_path) -> None:
    from agentd.agents.loop import CallStop

    seen: list = []
    stopped = threading.Event()

    def slow(ctx, args):
        seen.append(ctx.cancel)
        while not ctx.cancel.is_set():
            time.sleep(0.01)
        stopped.set()
        return "late"

    tool = Tool("slowpoke", "test tool", {"type": "object", "properties": {}}, slow)
    spec, _, _ = spec_for(fake, tmp_path, "[[tool:slowpoke]]", tools=[tool], tool_timeout=0.2)
    run_cancel = spec.tool_ctx.cancel
    result = run_loop(spec)
    assert "error: tool 'slowpoke' timed out after 0.2s" in result.response
    assert stopped.wait(5), "BUG: a timed-out tool is never told to stop (it runs on in the background)"
    assert isinstance(seen[0], CallStop) and seen[0] is not run_cancel
    assert run_cancel is None or not run_cancel.is_set(), "BUG: a tool's timeout cancelled the whole run"
    run = threading.Event()
    call = CallStop(run)
    assert not call.is_set()
    run.set()
    assert call.is_set(), "BUG: a tool call does not see its run's cancel"
    assert not CallStop(None).is_set() and not CallStop(threading.Event()).is_set()
    lone = CallStop(None)
    lone.set()
    assert lone.is_set()


def test_a_timed_out_shell_command_is_killed(fake, tmp_path) -> None:
    ctx = make_ctx(tmp_path, shell=["sleep"])
    ctx.tools_config.shell_timeout_secs = 30   # (the shell tool's own limit must not be what ends it)
    spec, _, _ = spec_for(fake, tmp_path, '[[tool:shell_exec {"command": "sleep 30"}]]', ctx=ctx,
                          tools=[get_tool("shell_exec")], tool_timeout=0.3)
    result = run_loop(spec)
    assert "timed out after 0.3s" in result.response
    for _ in range(40):   # the shell tool polls its stop every few ms, then kills and reaps
        if not children_named("sleep"):
            break
        time.sleep(0.05)
    assert not children_named("sleep"), \
        "BUG: a timed-out shell command runs on after the loop gave up on it"


def test_a_tool_call_sees_its_run_cancelled(fake, tmp_path) -> None:
    started, stopped = threading.Event(), threading.Event()

    def waits(ctx, args):
        started.set()
        while not ctx.cancel.is_set():
            time.sleep(0.01)
        stopped.set()
        return "stopped"

    tool = Tool("waiter", "test tool", {"type": "object", "properties": {}}, waits)
    ctx = make_ctx(tmp_path)
    ctx.cancel = threading.Event()
    spec, _, _ = spec_for(fake, tmp_path, "[[tool:waiter]]", tools=[tool], ctx=ctx, tool_timeout=30)
    outcome: list = []

    def go() -> None:
        try:
            outcome.append(run_loop(spec, ctx.cancel))
        except RunCancelled as exc:
            outcome.append(exc)

    runner = threading.Thread(target=go, daemon=True)
    runner.start()
    # Cancelled once the tool runs (a run cancelled before its tool call never calls it),
    # well before the 30 s tool timeout, which would tell the tool to stop anyway.
    assert started.wait(10), "the model's tool call never reached the tool"
    ctx.cancel.set()
    assert stopped.wait(5), "BUG: a tool call does not see its run's cancel through its own stop signal"
    runner.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], RunCancelled)


def test_the_tool_pool_a_forked_child_makes() -> None:
    from agentd.agents import loop as loop_mod

    parent = loop_mod._TOOL_POOL
    try:
        loop_mod._new_tool_pool()
        pool = loop_mod._TOOL_POOL
        assert pool is not parent and pool._max_workers == 32
        assert pool.submit(lambda: threading.current_thread().name).result(timeout=5).startswith("agentd-tool_")
        pool.shutdown()
    finally:
        loop_mod._TOOL_POOL = parent


def test_a_run_nobody_listens_to_is_not_streamed(fake, tmp_path) -> None:
    spec, _, usages = spec_for(fake, tmp_path, "quiet", emit=None)
    assert run_loop(spec).response == "echo: quiet" and len(usages) == 1
    assert not fake.requests[-1]["json"].get("stream"), "BUG: a call without a listener was streamed"


def test_the_loop_guard_tells_calls_apart_by_their_arguments(fake, tmp_path) -> None:
    from agentd.agents.loop_guard import BLOCK_AT

    calls = " | ".join(f'file_read {{"path": "f{n}"}}' for n in range(BLOCK_AT + 2))
    spec, _, _ = spec_for(fake, tmp_path, f"[[tools:{calls}]]")
    result = run_loop(spec)
    tools = [m.content for m in result.new_messages if m.role == "tool"]
    assert tools == [f"error: no such file: f{n}" for n in range(BLOCK_AT + 2)], \
        "BUG: calls with different arguments were counted as repeats"
