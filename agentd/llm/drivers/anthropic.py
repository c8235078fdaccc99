"""Anthropic Messages API wire format."""

from __future__ import annotations

from typing import Any

import requests

from agentd.llm.drivers.assemble import Assembler, Listener
from agentd.llm.drivers.guard import CallGuard
from agentd.llm.drivers.reading import iter_sse
from agentd.llm.drivers.transport import bad_response, truncated, merge_turns, parse_event_json, usage_from
from agentd.llm.params import json_instruction, log_dropped
from agentd.llm.types import ChatRequest, ChatResponse, Message, ProviderEndpoint, ToolCall, Usage

API_VERSION = "2023-06-01"
# The Messages API requires max_tokens; used when neither manifest nor request sets one.
DEFAULT_MAX_TOKENS = 4096
# No equivalent in the Messages API; JSON output is asked for in the system prompt instead.
UNSUPPORTED_PARAMS = frozenset({"seed", "presence_penalty", "frequency_penalty"})
FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


def _blocks(m: Message) -> list[dict[str, Any]]:
    if m.role == "tool":
        return [{"type": "tool_result", "tool_use_id": m.tool_call_id or "", "content": m.content,
                 "is_error": m.is_error}]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    blocks += [{"type": "image", "source": {"type": "base64", "media_type": i.media_type, "data": i.data_b64}}
               for i in m.images]
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.tool_calls]
    return blocks


def prepare(endpoint: ProviderEndpoint, request: ChatRequest, stream: bool) -> tuple[str, dict[str, str], dict[str, Any]]:
    """URL, headers and body of one call."""
    body: dict[str, Any] = {"model": request.model, "messages": merge_turns(request.messages, "assistant", "content", _blocks),
                            "max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS}
    system = "\n\n".join(s for s in (request.system, json_instruction(request.params)) if s)
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.parameters}
                         for t in request.tools]
    if request.temperature is not None:
        body["temperature"] = request.temperature
    p = request.params
    if p.top_p is not None:
        body["top_p"] = p.top_p
    if p.stop:
        body["stop_sequences"] = list(p.stop)
    if p.user:
        body["metadata"] = {"user_id": p.user}
    log_dropped(endpoint.provider, request.model, "anthropic", p)
    if stream:
        body["stream"] = True
    headers = {"anthropic-version": API_VERSION}
    if endpoint.api_key:
        headers["x-api-key"] = endpoint.api_key
    return f"{endpoint.base_url.rstrip('/')}/v1/messages", headers, body


def _usage(data: Any) -> Usage:
    return usage_from(data, "input_tokens", "output_tokens") or Usage()


def parse(endpoint: ProviderEndpoint, model: str, data: dict[str, Any]) -> ChatResponse:
    """A non-streamed answer."""
    content = data.get("content")
    if not isinstance(content, list):
        raise bad_response(endpoint, model, "no content in the answer")
    text = "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    calls = [ToolCall(b.get("id", ""), b.get("name", ""), b.get("input") if isinstance(b.get("input"), dict) else {})
             for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    finish = "tool_calls" if calls else FINISH.get(data.get("stop_reason"), "stop")
    return ChatResponse(text=text, tool_calls=calls, finish_reason=finish, usage=_usage(data.get("usage")),
                        model=str(data.get("model") or model))


def parse_stream(endpoint: ProviderEndpoint, model: str, response: requests.Response,
                 on_event: Listener, guard: CallGuard) -> ChatResponse:
    """A streamed answer, event by event."""
    out = Assembler(on_event)
    for event in iter_sse(response, guard):
        data = parse_event_json(endpoint, model, event.data)
        kind = data.get("type") or event.event
        if kind == "message_start":
            usage = _usage((data.get("message") or {}).get("usage"))
            out.input_tokens, out.output_tokens = usage.input_tokens, usage.output_tokens
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                out.start_call(int(data.get("index", 0)), block.get("id"), block.get("name") or "")
            elif block.get("text"):
                out.add_text(block["text"])
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                out.add_text(delta.get("text") or "")
            elif delta.get("type") == "input_json_delta":
                out.add_arguments(int(data.get("index", 0)), delta.get("partial_json") or "")
        elif kind == "content_block_stop":
            out.end_call(int(data.get("index", 0)))
        elif kind == "message_delta":
            stop = (data.get("delta") or {}).get("stop_reason")
            if stop:
                out.finish = FINISH.get(stop, "stop")
            if isinstance(data.get("usage"), dict) and "output_tokens" in data["usage"]:
                out.output_tokens = int(data["usage"]["output_tokens"] or 0)
        elif kind == "error":
            detail = (data.get("error") or {}).get("message", "unknown error")
            raise bad_response(endpoint, model, f"the stream reported an error: {detail}")
        elif kind == "message_stop":
            return out.response(model)
    # message_stop ends an answer; a body that stops before it was cut off.
    raise truncated(endpoint, model, "message_stop")
