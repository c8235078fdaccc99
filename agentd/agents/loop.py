"""The agent loop: model turns with tool execution between them.

One run = iterations of (LLM call -> tool calls) until the model answers without
tool calls or a limit is hit. The loop knows nothing of HTTP; it emits events
to a sink and returns a `RunResult`.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable

from agentd import tracing
from agentd.agents.events import Event, Sink
from agentd.agents.loop_guard import LoopGuard
from agentd.agents.tools import Tool, ToolContext, ToolError, validate_args
from agentd.errors import AgentdError
from agentd.llm.think import ThinkFilter, strip_think
from agentd.llm.types import (ChatRequest, ChatResponse, GenerationParams, LLMError, Message, ToolCallDelta,
                              ToolCallEnd, ToolCallStart, ToolSpec, TextDelta, Usage)

log = logging.getLogger("agentd.loop")

# What sets the text of one turn apart from an earlier turn's, streamed and in `said`.
TURN_BREAK = "\n\n"

# Tools run on their own pool so a slow tool cannot starve agent runs.
_TOOL_POOL = ThreadPoolExecutor(max_workers=32, thread_name_prefix="agentd-tool")


def _new_tool_pool() -> None:
    # A forked child inherits the pool's state but not its threads: work submitted there
    # would never run, so the child gets a pool of its own.
    global _TOOL_POOL
    _TOOL_POOL = ThreadPoolExecutor(max_workers=32, thread_name_prefix="agentd-tool")


os.register_at_fork(after_in_child=_new_tool_pool)

class CallStop(threading.Event):
    """One tool call's stop signal (its `ToolContext.cancel`): set when the call timed out,
    and set whenever its run is cancelled. A timed-out call is abandoned by the loop; this
    lets the tool end its work too (the shell tool kills its command) instead of running on."""

    def __init__(self, run: threading.Event | None) -> None:
        super().__init__()
        self._run = run

    def is_set(self) -> bool:
        return super().is_set() or (self._run is not None and self._run.is_set())


LlmCall = Callable[[ChatRequest, Callable[[Any], None] | None, threading.Event], ChatResponse]
Approver = Callable[[str, dict[str, Any]], str]   # (tool, input) -> "approved" | other


class RunCancelled(AgentdError):
    """The run was stopped (POST /stop, kill or shutdown)."""

    status = 409
    retryable = False  # a stopped run is not sent again (x-should-retry: false on /v1)


class LoopStopped(AgentdError):
    """The loop guard's circuit breaker ended the run."""

    status = 500


@dataclass
class RunResult:
    """What a run produced, and the messages to append to the session."""

    response: str
    usage: Usage
    iterations: int
    finish_reason: str
    new_messages: list[Message]
    cost_usd: float | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def said(self) -> str:
        """Everything the agent said in the run, as its stream showed it: the text of the
        turns that called tools too, then the answer (`response` is the answer alone)."""
        return TURN_BREAK.join(m.content for m in self.new_messages if m.role == "assistant" and m.content)


@dataclass
class RunSpec:
    """Everything one run needs, assembled by the agent manager."""

    model: str
    system: str
    history: list[Message]
    user: Message
    tools: list[Tool]
    tool_ctx: ToolContext | Callable[[], ToolContext]  # (or what makes it, at the first tool call)
    llm: LlmCall
    max_iterations: int
    tool_timeout: float
    max_tokens: int | None = None
    temperature: float | None = None
    emit: Sink | None = None
    approver: Approver | None = None
    on_usage: Callable[[ChatResponse], None] | None = None
    mode_note: str = ""
    params: GenerationParams = field(default_factory=GenerationParams)
    # Called before every model call after the first: the system prompt for that call (the
    # manager passes semantic memory's recall, so a fact stored mid-run reaches the model).
    refresh_system: Callable[[], str] | None = None


class AgentLoop:
    """Runs one message through the model and tools."""

    def __init__(self, spec: RunSpec, cancel: threading.Event) -> None:
        self.spec = spec
        self.cancel = cancel
        self.guard = LoopGuard()
        self.usage = Usage()
        self.offered = {t.name: t for t in spec.tools}
        self.tool_specs = [ToolSpec(t.name, t.description, t.parameters) for t in spec.tools]
        # Kept on the object so a run that fails or is cancelled can still save its progress.
        self.new_messages: list[Message] = [spec.user]
        self.system = spec.system
        # Tool calls the model began in this run: a call's `index` in the run's events is its
        # place among them, not its place in its model call (a stream's client assembles calls
        # by index and would merge the calls of different turns).
        self.calls_begun = 0
        self._spoke = False  # an earlier turn streamed text
        self._turn_spoke = False  # this turn did

    def _emit(self, type_: str, **data: Any) -> None:
        if self.spec.emit is not None:
            self.spec.emit(Event(type_, data))

    def _new_turn(self) -> None:
        self._spoke = self._spoke or self._turn_spoke
        self._turn_spoke = False

    def _say(self, text: str) -> None:
        """Stream `text`; a turn's first words after an earlier turn's begin with TURN_BREAK."""
        if not self._turn_spoke:
            self._turn_spoke = True
            if self._spoke:
                text = TURN_BREAK + text
        self._emit("text_delta", content=text)

    def _check_cancel(self) -> None:
        if self.cancel.is_set():
            raise RunCancelled("run cancelled")

    def _call_model(self, messages: list[Message]) -> ChatResponse:
        spec = self.spec
        request = ChatRequest(model=spec.model, messages=messages, system=self.system,
                              tools=self.tool_specs, max_tokens=spec.max_tokens,
                              temperature=spec.temperature, params=spec.params)
        on_event = None
        think = ThinkFilter()
        self._new_turn()
        if spec.emit is not None:
            indexes: dict[int, int] = {}  # the model's index of a call -> its index in the run

            def on_event(event: Any) -> None:
                if isinstance(event, TextDelta):
                    visible = think.feed(event.text)
                    if visible:
                        self._say(visible)
                elif isinstance(event, ToolCallStart):
                    indexes[event.index] = self.calls_begun
                    self.calls_begun += 1
                    self._emit("tool_use", id=event.id, tool=event.name, index=indexes[event.index])
                elif isinstance(event, ToolCallDelta):
                    self._emit("tool_args_delta", index=indexes[event.index], arguments=event.arguments)
                elif isinstance(event, ToolCallEnd):
                    self._emit("tool_input", id=event.id, tool=event.name, input=event.arguments,
                               index=indexes[event.index])
        try:
            response = spec.llm(request, on_event, self.cancel)
        except LLMError as exc:
            if exc.kind == "cancelled":
                raise RunCancelled("run cancelled") from None
            raise
        if spec.emit is not None:
            tail = think.flush()
            if tail:
                self._say(tail)
        self.usage = self.usage + response.usage
        if spec.on_usage is not None:
            spec.on_usage(response)
        return response

    def run(self) -> RunResult:
        """Iterate until a final answer, a limit, cancellation or a fatal error."""
        spec = self.spec
        messages = list(spec.history) + [spec.user]
        new_messages = self.new_messages
        all_calls: list[dict[str, Any]] = []
        self._emit("phase", phase="streaming", detail=spec.mode_note)
        for iteration in range(1, spec.max_iterations + 1):
            self._check_cancel()
            if iteration > 1:
                self._emit("phase", phase="thinking", detail=f"iteration {iteration}")
                if spec.refresh_system is not None:
                    self.system = spec.refresh_system()
            response = self._call_model(messages)
            if not response.tool_calls:
                text = strip_think(response.text)
                final = Message(role="assistant", content=text)
                new_messages.append(final)
                self._emit("phase", phase="done", detail="")
                return RunResult(text, self.usage, iteration, response.finish_reason,
                                 new_messages, tool_calls=all_calls)
            assistant = Message(role="assistant", content=strip_think(response.text),
                                tool_calls=response.tool_calls)
            messages.append(assistant)
            new_messages.append(assistant)
            for call in response.tool_calls:
                self._check_cancel()
                all_calls.append({"id": call.id, "name": call.name, "arguments": call.arguments})
                result, is_error = self._run_tool(call.id, call.name, call.arguments)
                tool_msg = Message(role="tool", content=result, tool_call_id=call.id,
                                   tool_name=call.name, is_error=is_error)
                messages.append(tool_msg)
                new_messages.append(tool_msg)
                if self.guard.tripped:
                    raise LoopStopped(
                        f"loop guard stopped the run: {self.guard.blocked} tool calls were blocked "
                        "for repeating identical arguments")
        # The model was still calling tools when the iteration budget ran out.
        text = f"[stopped after {spec.max_iterations} iterations: the agent was still calling tools]"
        new_messages.append(Message(role="assistant", content=text))
        self._new_turn()
        self._say(text)  # a stream's client reads the answer from its text
        self._emit("phase", phase="done", detail="max_iterations")
        return RunResult(text, self.usage, spec.max_iterations, "tool_calls", new_messages,
                         tool_calls=all_calls)

    def _run_tool(self, call_id: str, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        """Gate, guard, approve, execute; always returns a result for the model."""
        if self.spec.emit is not None:
            self._emit("phase", phase="tool_use", detail=name)
        verdict = self.guard.check(name, args)
        if verdict.action == "block":
            result, is_error = verdict.message, True
        else:
            with tracing.span("tool.call", {"agentd.tool": name}) as current:
                result, is_error = self._execute(name, args)
                if current is not None:
                    current.set_attribute("agentd.tool.is_error", is_error)
            if verdict.action == "warn":
                result = f"{result}\n\n{verdict.message}"
        self._emit("tool_result", id=call_id, tool=name, input=args, result=result, is_error=is_error)
        return result, is_error

    def _execute(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        tool = self.offered.get(name)
        if tool is None:
            return (f"permission denied: tool '{name}' is not available to this agent"
                    f"{' (' + self.spec.mode_note + ')' if self.spec.mode_note else ''}"), True
        if not isinstance(args, dict):
            return f"invalid arguments for '{name}': expected a JSON object", True
        try:
            validate_args(tool, args)
        except ToolError as exc:
            return f"error: {exc}", True
        if self.spec.approver is not None:
            self._emit("phase", phase="awaiting_approval", detail=name)
            decision = self.spec.approver(name, args)
            if decision != "approved":
                reason = {"rejected": "a human rejected it", "timeout": "approval timed out",
                          "cancelled": "the run was cancelled"}.get(decision, decision)
                return f"denied: the call to '{name}' was not performed because {reason}.", True
        ctx = self.spec.tool_ctx
        if not isinstance(ctx, ToolContext):
            ctx = self.spec.tool_ctx = ctx()
        stop = CallStop(ctx.cancel)
        # The tool's thread keeps the run's context: its log lines name the run's request and
        # agent, and its HTTP calls and the runs it starts stay in the run's trace.
        future = _TOOL_POOL.submit(contextvars.copy_context().run, tool.run,
                                   dataclasses.replace(ctx, cancel=stop), args)
        try:
            output = future.result(timeout=self.spec.tool_timeout)
            return (output if isinstance(output, str) else json.dumps(output)), False
        except FutureTimeout:
            stop.set()
            return f"error: tool '{name}' timed out after {self.spec.tool_timeout:g}s", True
        except ToolError as exc:
            return f"error: {exc}", True
        except Exception as exc:  # noqa: BLE001 - a crashing tool is the model's problem to route around
            log.warning("tool %s raised", name, exc_info=True)
            return f"error: tool '{name}' failed: {type(exc).__name__}: {exc}", True
