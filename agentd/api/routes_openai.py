"""The OpenAI-compatible API: /v1/chat/completions and /v1/models.

The `model` names an agent; the agent's own session supplies the history, so
only the last user message is the run's input and `system` messages become
extra instructions for that run.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import time
from typing import Any, Callable

from flask import Blueprint, Response, jsonify

from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.agents.events import Event
from agentd.agents.loop import RunCancelled
from agentd.agents.manager import AgentHandle, AgentRunError, RunOptions
from agentd.api import body
from agentd.agents.run_request import check_message
from agentd.api.errors import OPENAI_TYPES, error_response
from agentd.api.principal import principal, run_fields
from agentd.api.routes_system import kernel
from agentd.api.runs import run_blocking
from agentd.api.sse import encode_compact, format_event
from agentd.api.streaming import StreamShape, stream_run
from agentd.errors import AgentdError, BadRequest, NotFound, TooManyRequests
from agentd.ids import random_uuid_str
from agentd.api.schemas import CHAT_REQUEST_SCHEMA, ChatRequestSchema
from agentd.llm import params as llm_params
from agentd.llm.types import GenerationParams, ImagePart
from agentd.schema_fields import is_blank
from agentd.store.outage import DatabaseUnavailable

log = logging.getLogger("agentd.api")

bp = Blueprint("openai", __name__)

PREFIX = "agentd:"
DATA_URI = re.compile(r"^data:(image/[A-Za-z0-9.+-]+);base64,(.*)$", re.S)
# Parameters that would change the answer but that an agent run cannot honour: the agent
# owns its tools, and a run yields no log probabilities. `n` is not among them: the spec
# answers always one choice, so `n` > 1 is dropped and named like an unmapped option.
REFUSED = {
    "tools": lambda v: bool(v), "functions": lambda v: bool(v), "tool_choice": lambda v: v not in (None, "none", "auto"),
    "function_call": lambda v: v not in (None, "none", "auto"), "logprobs": lambda v: bool(v),
    "top_logprobs": lambda v: v is not None, "logit_bias": lambda v: bool(v),
}
DROPPED_HEADER = "x-agentd-dropped-params"


class ModelNotFound(NotFound):
    def __init__(self, model: str) -> None:
        super().__init__(f"no agent found for model '{model}'", code="model_not_found")


def resolve_agent(model: str) -> AgentHandle:
    """`agentd:<name>`, then an agent UUID, then a plain agent name."""
    agents = kernel().agents
    handle = agents.by_name(model[len(PREFIX):]) if model.startswith(PREFIX) else agents.find(model)
    if handle is None or handle.killed:
        raise ModelNotFound(model)
    try:
        return principal().reach(handle)  # (an agent outside a key's list is audited as refused)
    except NotFound:
        raise ModelNotFound(model) from None


def _parts(content: Any, index: int) -> tuple[str, list[ImagePart]]:
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise BadRequest(f"messages[{index}].content must be a string or an array of parts")
    texts: list[str] = []
    images: list[ImagePart] = []
    for j, part in enumerate(content):
        where = f"messages[{index}].content[{j}]"
        if not isinstance(part, dict):
            raise BadRequest(f"{where} must be an object")
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part.get("type") == "image_url":
            url = (part.get("image_url") or {}).get("url") if isinstance(part.get("image_url"), dict) else None
            if not isinstance(url, str):
                raise BadRequest(f"{where}.image_url.url must be a string")
            images.append(image_part(url, where))
        else:
            raise BadRequest(f"{where}: unsupported part type {part.get('type')!r}")
    return "\n".join(texts), images


def image_part(url: str, where: str) -> ImagePart:
    """An image given as a base64 data URI (agentd fetches no URLs)."""
    match = DATA_URI.match(url)
    if match is None:
        raise BadRequest(f"{where}: only base64 data URIs (data:image/<type>;base64,...) are "
                         "supported; image URLs are not fetched")
    try:
        base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{where}: image data is not valid base64") from None
    return ImagePart(match.group(1), match.group(2))


# The request fields `generation_params` reads, and its answer when none is there (the usual
# request): one shared value (frozen), which `dropped_params` knows drops nothing.
_PARAM_FIELDS = frozenset({"top_p", "stop", "seed", "presence_penalty", "frequency_penalty",
                           "response_format", "user"})
_NO_PARAMS = GenerationParams()


def generation_params(data: dict[str, Any]) -> GenerationParams:
    """The client's sampling and output options; defaults (penalty 0, format text) count as not given."""
    if _PARAM_FIELDS.isdisjoint(data):
        return _NO_PARAMS
    fmt = data.get("response_format")
    penalties = {k: data.get(k) or None for k in ("presence_penalty", "frequency_penalty")}
    return GenerationParams(top_p=data.get("top_p"), stop=data.get("stop") or (), seed=data.get("seed"),
                            response_format=fmt if fmt and fmt["type"] != "text" else None,
                            user=data.get("user") or None, **penalties)


def refuse_unsupported(data: Any) -> None:
    """400 naming the first parameter an agent run cannot honour (checked before the schema,
    so the message says why rather than which values the schema allows)."""
    if not isinstance(data, dict) or REFUSED.keys().isdisjoint(data):
        return
    for key, rejects in REFUSED.items():
        if key in data and rejects(data[key]):
            raise BadRequest(f"unsupported parameter '{key}': agentd agents choose their own tools and "
                             "answer with one choice; remove it from the request")


def parse_request(data: dict[str, Any]) -> tuple[AgentHandle, str, RunOptions, bool, bool]:
    """Check a validated chat completion request: (agent, input text, options, stream, include_usage)."""
    model, messages = data["model"], data["messages"]
    stream = bool(data.get("stream"))
    options = RunOptions(max_tokens=data.get("max_tokens") or data.get("max_completion_tokens"),
                         temperature=data.get("temperature"), params=generation_params(data))
    stream_options = data.get("stream_options") or {}
    include_usage = bool(isinstance(stream_options, dict) and stream_options.get("include_usage"))
    handle = resolve_agent(model)
    systems: list[str] = []
    user: tuple[str, list[ImagePart]] | None = None
    for i, message in enumerate(messages):
        text, images = _parts(message.get("content"), i)
        if message["role"] in ("system", "developer"):
            systems.append(text)
        elif message["role"] == "user":
            user = text, images
    if user is None or (is_blank(user[0]) and not user[1]):
        raise BadRequest("no user message found in request", code="missing_message")
    user_text, user_images = user
    check_message(user_text)
    options.extra_system = "\n\n".join(s for s in systems if s.strip())
    options.images = user_images
    return handle, user_text or "(image)", options, stream, include_usage


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens}


# How a failed run maps onto OpenAI's conventions: kind -> (status, code); the error
# `type` follows from the status (4xx invalid_request_error, 429 rate_limit_error, 5xx
# server_error). The spec answers an agent that failed with 500 server_error and no code;
# only what a client can act on differs (Retry-After, an outage, a timeout, a provider key
# the daemon lacks, whose message names the setting, as the native API's 424 does). A
# provider that refused its key is the agent's failure: a 401 would tell the client its own
# key to agentd is wrong. Each
# answer is final for this request (agentd already retried the provider), so it says
# `x-should-retry: false`: without it the official SDKs retry 409/429/5xx twice,
# multiplying upstream calls and undoing a user's stop.
_RUN_FAILURES: dict[str, tuple[int, str | None]] = {
    "missing_key": (424, "provider_key_missing"),
    "auth": (500, None),
    "rate_limit": (429, "upstream_rate_limited"),
    "server": (503, "upstream_unavailable"),
    "unreachable": (503, "upstream_unavailable"),
    "timeout": (504, "upstream_timeout"),
    "bad_request": (500, None),
    "not_found": (500, None),
    "bad_response": (500, None),
    "loop_guard": (500, None),
    "reset": (500, None),
    "truncated": (500, None),
}


def final_error(status: int, message: str, code: str | None, retry_after: float | None = None) -> Response:
    response = error_response(status, message, code=code, retry_after=retry_after)
    response.headers["x-should-retry"] = "false"
    return response


STOPPED_MESSAGE = "the run was stopped before the agent answered"


def failure_code(kind: str | None, status: int, code: str | None, message: str) -> tuple[int, str | None]:
    """OpenAI status and code of a failed run: from the run error's kind, else the refusal's."""
    if kind is not None:
        return _RUN_FAILURES.get(kind, (500, None))
    if status == 429:
        # Budget or token quota: retrying before Retry-After cannot succeed.
        return 429, code or ("budget_exceeded" if "budget" in message else "quota_exceeded")
    return status, code


def run_failure(exc: AgentdError) -> Response:
    """The /v1 answer for an error raised while checking or running an agent."""
    if isinstance(exc, RunCancelled):
        return final_error(409, STOPPED_MESSAGE, "run_cancelled")
    kind = exc.kind if isinstance(exc, AgentRunError) else None  # always a string on a run error
    status, code = failure_code(kind, exc.status, exc.code, exc.message)
    if code == "agent_busy" or isinstance(exc, DatabaseUnavailable):
        # Passing states the run never reached: the same request after Retry-After may well
        # succeed, and the SDKs wait for it before their own retry.
        return error_response(status, exc.message, code=code, retry_after=exc.retry_after)
    return final_error(status, exc.message, code, exc.retry_after)


def _stream_error(message: str, status: int, code: str | None) -> str:
    """A stream's closing error line: the same type and code the answer would carry unstreamed
    (its status line was sent long ago)."""
    error = {"message": message, "type": OPENAI_TYPES.get(status, "server_error")}
    if code is not None:
        error["code"] = code
    return format_event(None, {"error": error})


@bp.post("/v1/chat/completions")
@doc("OpenAI-compatible chat completion with an agent", tags="openai", body=ChatRequestSchema,
     response=out.ChatCompletionSchema, ok_headers=("x-agentd-dropped-params",), sse_alt=True,
     body_example={"model": "agentd:helper", "messages": [{"role": "user", "content": "hello"}]},
     description="`model` names the agent. The last user message is the run's input (the agent's session "
                 "supplies history); system/developer messages are extra instructions for this run. "
                 "`top_p`, `stop`, `seed`, `presence_penalty`, `frequency_penalty`, `max_completion_tokens`, "
                 "`user` and `response_format` go to the agent's model; what its provider has no "
                 "equivalent for is dropped and named in `x-agentd-dropped-params`, as is `n` > 1 (the "
                 "answer always has one choice). `tools`, `functions`, `tool_choice` (other than "
                 "none/auto), `logprobs` and `logit_bias` are refused with 400. With `stream: true` the "
                 "answer is `text/event-stream`: `data: {chat.completion.chunk}` lines, then `data: [DONE]`.",
     errors={404: "No agent for `model` (`model_not_found`)",
             409: "The run was stopped (`run_cancelled`)",
             413: "Message over 64 KB",
             424: "The agent's provider has no API key; the message names the setting "
                  "(`provider_key_missing`)",
             429: "Budget or quota exhausted (`budget_exceeded`, `quota_exceeded`), the agent's queue is "
                  "full (`agent_busy`), or the provider still throttled (`upstream_rate_limited`)",
             500: "The agent failed (no `code`): the provider rejected its key, refused the request, "
                  "answered something unusable, reset the connection or cut the stream off, or the "
                  "loop guard stopped the run",
             503: "The provider failed or was unreachable after retries (`upstream_unavailable`), or "
                  "too many streams",
             504: "The provider timed out (`upstream_timeout`)"})
def chat_completions():
    try:
        return _chat_completions()
    except (RunCancelled, AgentRunError, TooManyRequests) as exc:
        return run_failure(exc)


def _chat_completions():
    raw = body.json_body()
    refuse_unsupported(raw)
    data = body.validate(CHAT_REQUEST_SCHEMA, raw)
    handle, text, options, stream, include_usage = parse_request(data)
    # The OpenAI `user` (else a scoped key itself) talks in a session of its own.
    run = run_fields(principal(), handle, user=data.get("user") or None, own_session=True)
    completion_id = f"chatcmpl-{random_uuid_str()}"
    created = int(time.time())
    dropped = dropped_params(handle, options.params) + (["n"] if (data.get("n") or 1) > 1 else [])
    if stream:
        return with_dropped(_stream(handle, text, options, completion_id, created, include_usage, run), dropped)
    result = run_blocking(kernel(), handle, text, [], options, origin="v1", run=run)
    # What the stream of the same run would have sent, as OpenAI's clients expect of a content.
    message: dict[str, Any] = {"role": "assistant", "content": result.said}
    if result.finish_reason == "tool_calls" and result.tool_calls:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                                 for c in result.tool_calls]
    return with_dropped(jsonify({"id": completion_id, "object": "chat.completion", "created": created,
                                  "model": handle.name,
                                  "choices": [{"index": 0, "message": message,
                                               "finish_reason": result.finish_reason}],
                                  "usage": _usage(result.usage.input_tokens, result.usage.output_tokens)}),
                         dropped)


def dropped_params(handle: AgentHandle, params: GenerationParams) -> list[str]:
    """What the agent's provider has no equivalent for (dropped, not refused), logged once."""
    if params is _NO_PARAMS:
        return []
    info = kernel().catalog.get_provider(handle.provider)
    if info is None:   # a provider the catalog does not know speaks the OpenAI format, which drops nothing
        return []
    names = llm_params.dropped(info.kind, params)
    if names:
        log.info("agent %s: %s has no equivalent for %s; dropped", handle.name, handle.provider,
                 ", ".join(names))
    return names


def with_dropped(response: Response, dropped: list[str]) -> Response:
    if dropped:
        response.headers[DROPPED_HEADER] = ", ".join(dropped)
    return response


def chunk_format(completion_id: str, created: int, model: str) -> Callable[..., str]:
    """`chunk(delta, finish=None)`: one `chat.completion.chunk` event of a stream, the same
    text as `format_event(None, {...})` gives, with the part every chunk of the stream
    shares (id, time, model) encoded once."""
    shared = encode_compact({"id": completion_id, "object": "chat.completion.chunk", "created": created,
                             "model": model})
    head = f'data: {shared[:-1]},"choices":[{{"index":0,"delta":'

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return f'{head}{encode_compact(delta)},"finish_reason":{encode_compact(finish)}}}]}}\n\n'

    return chunk


def _stream(handle: AgentHandle, text: str, options: RunOptions, completion_id: str, created: int,
            include_usage: bool, run: dict[str, str] | None = None) -> Response:
    chunk = chunk_format(completion_id, created, handle.name)

    def render(event: Event) -> tuple[list[str], bool]:
        d = event.data
        if event.type == "text_delta":
            return [chunk({"content": d["content"]})], False
        if event.type == "tool_use":
            return [chunk({"tool_calls": [{"index": d["index"], "id": d["id"], "type": "function",
                                           "function": {"name": d["tool"], "arguments": ""}}]})], False
        if event.type == "tool_args_delta":
            return [chunk({"tool_calls": [{"index": d["index"], "function": {"arguments": d["arguments"]}}]})], False
        if event.type == "done":
            chunks = [chunk({}, d["finish_reason"])]
            if include_usage:
                chunks.append(format_event(None, {"id": completion_id, "object": "chat.completion.chunk",
                                                  "created": created, "model": handle.name, "choices": [],
                                                  "usage": _usage(d["input_tokens"], d["output_tokens"])}))
            return chunks, True
        if event.type == "stopped":
            # Not a finished answer (an unstreamed one is a 409): say so, never `finish_reason: stop`.
            return [_stream_error(STOPPED_MESSAGE, 409, "run_cancelled")], True
        if event.type == "error":
            status, code = failure_code(d["kind"], d["status"], d["code"], d["message"])
            return [_stream_error(d["message"], status, code)], True
        return [], False

    shape = StreamShape(opening=(chunk({"role": "assistant"}),), render=render, keep_alive=": keep-alive\n\n",
                        closing=("data: [DONE]\n\n",))
    return stream_run(kernel(), handle, text, [], options, shape, origin="v1", run=run)


def _model_card(handle: AgentHandle) -> dict[str, Any]:
    return {"id": f"{PREFIX}{handle.name}", "object": "model", "created": int(handle.created_at.timestamp()),
            "owned_by": "agentd"}


@bp.get("/v1/models")
@doc("The agents as OpenAI models (agentd:<name>)", tags="openai", response=out.ModelListSchema)
def models():
    agents = kernel().agents
    return jsonify({"object": "list", "data": [_model_card(h) for h in principal().visible(agents.handles())]})


@bp.get("/v1/models/<model>")
@doc("One agent as an OpenAI model", tags="openai", response=out.ModelCardSchema,
     description="`model` is resolved as in chat completions: `agentd:<name>`, an agent id or a plain name.",
     errors={404: "No agent for `model` (`model_not_found`)"})
def model(model: str):
    return jsonify(_model_card(resolve_agent(model)))
