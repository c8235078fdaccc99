"""OpenAI chat-completions wire format (OpenAI and every compatible provider)."""

from __future__ import annotations

import json
from typing import Any

import requests

from agentd.llm.drivers.assemble import Assembler, Listener
from agentd.llm.drivers.guard import CallGuard
from agentd.llm.drivers.reading import iter_sse
from agentd.llm.drivers.transport import bad_response, truncated, parse_arguments, parse_event_json, usage_from
from agentd.llm.types import ChatRequest, ChatResponse, GenerationParams, Message, ProviderEndpoint, ToolCall, Usage

# Every OpenAI-style parameter goes through as it came; compatible servers ignore or refuse what they lack.
UNSUPPORTED_PARAMS: frozenset[str] = frozenset()

FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls",
          "content_filter": "stop"}


def _message(m: Message) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content}
    if m.role == "assistant" and m.tool_calls:
        return {"role": "assistant", "content": m.content or None,
                "tool_calls": [{"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                               for c in m.tool_calls]}
    if m.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
        parts += [{"type": "image_url", "image_url": {"url": f"data:{i.media_type};base64,{i.data_b64}"}}
                  for i in m.images]
        return {"role": m.role, "content": parts}
    return {"role": m.role, "content": m.content}


def prepare(endpoint: ProviderEndpoint, request: ChatRequest, stream: bool) -> tuple[str, dict[str, str], dict[str, Any]]:
    """URL, headers and body of one call."""
    messages = [{"role": "system", "content": request.system}] if request.system else []
    messages += [_message(m) for m in request.messages]
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    if request.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": t.parameters}} for t in request.tools]
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    body.update(_params(request.params))
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    return f"{endpoint.base_url.rstrip('/')}/chat/completions", headers, body


def _params(p: GenerationParams) -> dict[str, Any]:
    """The client's generation parameters under their own (OpenAI) names."""
    out: dict[str, Any] = {}
    for name in ("top_p", "seed", "presence_penalty", "frequency_penalty", "response_format", "user"):
        value = getattr(p, name)
        if value is not None:
            out[name] = value
    if p.stop:
        out["stop"] = list(p.stop)
    return out


def _usage(data: Any) -> Usage:
    return usage_from(data, "prompt_tokens", "completion_tokens") or Usage()


def parse(endpoint: ProviderEndpoint, model: str, data: dict[str, Any]) -> ChatResponse:
    """A non-streamed answer."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise bad_response(endpoint, model, "no choices in the answer")
    message = choices[0].get("message") or {}
    calls = [ToolCall(c.get("id") or f"call_{i}", (c.get("function") or {}).get("name", ""),
                      parse_arguments((c.get("function") or {}).get("arguments")))
             for i, c in enumerate(message.get("tool_calls") or []) if isinstance(c, dict)]
    finish = "tool_calls" if calls else FINISH.get(choices[0].get("finish_reason"), "stop")
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    return ChatResponse(text=text, tool_calls=calls, finish_reason=finish, usage=_usage(data.get("usage")),
                        model=str(data.get("model") or model))


def parse_stream(endpoint: ProviderEndpoint, model: str, response: requests.Response,
                 on_event: Listener, guard: CallGuard) -> ChatResponse:
    """A streamed answer: text and tool-call fragments as they come, usage from the final chunk."""
    out = Assembler(on_event)
    # [DONE] or a finish_reason ends an answer; a body that stops before either was cut off.
    finished = False
    for event in iter_sse(response, guard):
        if event.data.strip() == "[DONE]":
            finished = True
            break
        chunk = parse_event_json(endpoint, model, event.data)
        if "error" in chunk:
            raise bad_response(endpoint, model, f"the stream reported an error: {chunk['error']}")
        if chunk.get("usage"):
            usage = _usage(chunk["usage"])
            out.input_tokens, out.output_tokens = usage.input_tokens, usage.output_tokens
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                out.add_text(delta["content"])
            for call in delta.get("tool_calls") or []:
                index = int(call.get("index", 0))
                function = call.get("function") or {}
                if index not in out.calls:
                    out.start_call(index, call.get("id"), function.get("name") or "")
                out.add_arguments(index, function.get("arguments") or "")
            if choice.get("finish_reason"):
                finished = True
                out.finish = FINISH.get(choice["finish_reason"], "stop")
    if not finished:
        raise truncated(endpoint, model, "[DONE] or finish_reason")
    return out.response(model)
