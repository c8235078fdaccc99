"""Google Gemini generateContent wire format."""

from __future__ import annotations

from typing import Any

import requests

from agentd.llm.drivers.assemble import Assembler, Listener, new_call_id
from agentd.llm.drivers.guard import CallGuard
from agentd.llm.drivers.reading import iter_sse
from agentd.llm.drivers.transport import bad_response, truncated, merge_turns, parse_event_json, usage_from
from agentd.llm.params import json_schema_of, log_dropped, wants_json
from agentd.llm.types import ChatRequest, ChatResponse, GenerationParams, Message, ProviderEndpoint, ToolCall, Usage

# generationConfig has no per-request end-user field.
UNSUPPORTED_PARAMS = frozenset({"user"})
FINISH = {"STOP": "stop", "MAX_TOKENS": "length"}
# Gemini's function schemas are an OpenAPI subset; other JSON-schema keys are rejected by the API.
SCHEMA_KEYS = {"type", "description", "properties", "required", "items", "enum", "format", "nullable"}


def gemini_schema(schema: Any) -> Any:
    """Drop JSON-schema keywords Gemini does not accept, recursively."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in SCHEMA_KEYS:
            continue
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: gemini_schema(v) for name, v in value.items()}
        elif key == "items":
            out[key] = gemini_schema(value)
        else:
            out[key] = value
    return out


def _parts(m: Message) -> list[dict[str, Any]]:
    if m.role == "tool":
        return [{"functionResponse": {"name": m.tool_name or "", "response": {"content": m.content}}}]
    parts: list[dict[str, Any]] = [{"text": m.content}] if m.content else []
    parts += [{"inlineData": {"mimeType": i.media_type, "data": i.data_b64}} for i in m.images]
    parts += [{"functionCall": {"name": c.name, "args": c.arguments}} for c in m.tool_calls]
    return parts


def _generation_params(p: GenerationParams) -> dict[str, Any]:
    """The client's generation parameters as generationConfig fields."""
    out: dict[str, Any] = {}
    for name, key in (("top_p", "topP"), ("seed", "seed"), ("presence_penalty", "presencePenalty"),
                      ("frequency_penalty", "frequencyPenalty")):
        if getattr(p, name) is not None:
            out[key] = getattr(p, name)
    if p.stop:
        out["stopSequences"] = list(p.stop)
    if wants_json(p):
        out["responseMimeType"] = "application/json"
        schema = json_schema_of(p)
        if schema is not None:
            out["responseSchema"] = gemini_schema(schema)
    return out


def prepare(endpoint: ProviderEndpoint, request: ChatRequest, stream: bool) -> tuple[str, dict[str, str], dict[str, Any]]:
    """URL, headers and body of one call."""
    body: dict[str, Any] = {"contents": merge_turns(request.messages, "model", "parts", _parts)}
    if request.system:
        body["systemInstruction"] = {"parts": [{"text": request.system}]}
    if request.tools:
        body["tools"] = [{"functionDeclarations": [
            {"name": t.name, "description": t.description, "parameters": gemini_schema(t.parameters)}
            for t in request.tools]}]
    config: dict[str, Any] = {}
    if request.max_tokens is not None:
        config["maxOutputTokens"] = request.max_tokens
    if request.temperature is not None:
        config["temperature"] = request.temperature
    config.update(_generation_params(request.params))
    log_dropped(endpoint.provider, request.model, "gemini", request.params)
    if config:
        body["generationConfig"] = config
    base = endpoint.base_url.rstrip("/")
    action = "streamGenerateContent?alt=sse" if stream else "generateContent"
    headers = {"x-goog-api-key": endpoint.api_key} if endpoint.api_key else {}
    return f"{base}/v1beta/models/{request.model}:{action}", headers, body


def _usage(data: Any) -> Usage | None:
    return usage_from(data, "promptTokenCount", "candidatesTokenCount")


def _candidate(data: dict[str, Any]) -> dict[str, Any]:
    candidates = data.get("candidates")
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
        return candidates[0]
    return {}


def parse(endpoint: ProviderEndpoint, model: str, data: dict[str, Any]) -> ChatResponse:
    """A non-streamed answer."""
    candidate = _candidate(data)
    if not candidate:
        reason = (data.get("promptFeedback") or {}).get("blockReason")
        raise bad_response(endpoint, model, f"no candidates (blocked: {reason})" if reason else "no candidates")
    parts = (candidate.get("content") or {}).get("parts") or []
    text = "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    calls = [ToolCall(new_call_id(), p["functionCall"].get("name", ""), p["functionCall"].get("args") or {})
             for p in parts if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)]
    finish = "tool_calls" if calls else FINISH.get(candidate.get("finishReason"), "stop")
    return ChatResponse(text=text, tool_calls=calls, finish_reason=finish,
                        usage=_usage(data.get("usageMetadata")) or Usage(), model=model)


def parse_stream(endpoint: ProviderEndpoint, model: str, response: requests.Response,
                 on_event: Listener, guard: CallGuard) -> ChatResponse:
    """A streamed answer: each SSE event is a partial generateContent response."""
    out = Assembler(on_event)
    finished = False  # Gemini has no end event: the last chunk carries finishReason
    for event in iter_sse(response, guard):
        data = parse_event_json(endpoint, model, event.data)
        if "error" in data:
            raise bad_response(endpoint, model, f"the stream reported an error: {data['error']}")
        candidate = _candidate(data)
        for part in (candidate.get("content") or {}).get("parts") or []:
            if isinstance(part, dict) and isinstance(part.get("functionCall"), dict):
                call = part["functionCall"]
                out.whole_call(None, call.get("name", ""), call.get("args") or {})
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                out.add_text(part["text"])
        if candidate.get("finishReason"):
            finished = True
            out.finish = FINISH.get(candidate["finishReason"], "stop")
        usage = _usage(data.get("usageMetadata"))
        if usage is not None:
            out.input_tokens, out.output_tokens = usage.input_tokens, usage.output_tokens
    if not finished:
        raise truncated(endpoint, model, "finishReason")
    return out.response(model)
