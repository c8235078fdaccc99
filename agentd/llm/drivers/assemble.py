"""Builds a `ChatResponse` from stream events while forwarding them to a listener."""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable

from agentd.llm.drivers.transport import parse_arguments
from agentd.llm.types import (ChatResponse, TextDelta, ToolCall, ToolCallDelta, ToolCallEnd,
                              ToolCallStart, Usage)

Listener = Callable[[Any], None] | None


def new_call_id() -> str:
    """An id for providers (Gemini) that do not name their tool calls."""
    return f"call_{uuid.uuid4().hex[:24]}"


class Assembler:
    """Accumulates text and tool calls by index; emits neutral stream events."""

    def __init__(self, on_event: Listener) -> None:
        self.on_event = on_event
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.ended: set[int] = set()
        self.input_tokens = 0
        self.output_tokens = 0
        self.finish = "stop"

    def _emit(self, event: Any) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def add_text(self, text: str) -> None:
        if text:
            self.text.append(text)
            self._emit(TextDelta(text))

    def start_call(self, index: int, call_id: str | None, name: str) -> None:
        call = self.calls.setdefault(index, {"id": call_id or new_call_id(), "name": name, "args": []})
        call["name"] = call["name"] or name
        self._emit(ToolCallStart(index, call["id"], call["name"]))

    def add_arguments(self, index: int, fragment: str) -> None:
        if fragment and index in self.calls:
            self.calls[index]["args"].append(fragment)
            self._emit(ToolCallDelta(index, fragment))

    def end_call(self, index: int) -> None:
        call = self.calls.get(index)
        if call is None or index in self.ended:
            return
        self.ended.add(index)
        self._emit(ToolCallEnd(index, call["id"], call["name"], parse_arguments("".join(call["args"]))))

    def whole_call(self, call_id: str | None, name: str, arguments: dict[str, Any]) -> None:
        """A tool call that arrives complete (Gemini) still produces start/delta/end events."""
        index = len(self.calls)
        self.start_call(index, call_id, name)
        self.add_arguments(index, json.dumps(arguments))
        self.end_call(index)

    def response(self, model: str) -> ChatResponse:
        """The finished response; any call still open is closed first."""
        for index in sorted(self.calls):
            self.end_call(index)
        calls = [ToolCall(c["id"], c["name"], parse_arguments("".join(c["args"])))
                 for _, c in sorted(self.calls.items()) if c["name"]]
        finish = "tool_calls" if calls else self.finish
        return ChatResponse(text="".join(self.text), tool_calls=calls, finish_reason=finish,
                            usage=Usage(self.input_tokens, self.output_tokens), model=model)
