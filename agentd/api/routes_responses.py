"""The OpenAI Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

The same agent runs as on /v1/chat/completions (agentd/api/routes_openai.py supplies the
agent lookup, parameter handling, refusals and failure answers): the agent's session
supplies history, so the last user message of `input` is the run's input and
`instructions` plus system/developer items are extra instructions for that run.
"""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, Response, jsonify

from agentd.agents.events import Event
from agentd.agents.loop import RunCancelled
from agentd.agents.manager import AgentHandle, AgentRunError, RunOptions
from agentd.agents.run_request import check_message
from agentd.api import body
from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api.principal import principal, run_fields
from agentd.principals import session_fields
from agentd.api.routes_openai import (STOPPED_MESSAGE, dropped_params, failure_code, generation_params,
                                      image_part, refuse_unsupported, resolve_agent, run_failure,
                                      with_dropped)
from agentd.api.routes_system import kernel
from agentd.api.runs import run_blocking
from agentd.api.sse import encode_compact
from agentd.api.streaming import StreamShape, stream_run
from agentd.api.schemas_openai import RESPONSES_REQUEST_SCHEMA, ResponsesRequestSchema, as_chat_format
from agentd.errors import BadRequest, NotFound, TooManyRequests
from agentd.ids import random_uuid_hex
from agentd.llm.types import ImagePart
from agentd.schema_fields import is_blank

bp = Blueprint("responses", __name__)

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")


class ResponseNotFound(NotFound):
    def __init__(self, response_id: str, code: str = "response_not_found") -> None:
        super().__init__(f"no stored response with id '{response_id}'", code=code)


def _content(content: Any, where: str) -> tuple[str, list[ImagePart]]:
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or an array of parts")
    texts: list[str] = []
    images: list[ImagePart] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            raise BadRequest(f"{at} must be an object")
        kind = part.get("type")
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise BadRequest(f"{at}.image_url must be a data URI string (file ids are not supported)")
            images.append(image_part(url, at))
        else:
            raise BadRequest(f"{at}: unsupported part type {kind!r}")
    return "\n".join(texts), images


def parse_input(value: Any) -> tuple[str, list[ImagePart], list[str]]:
    """`input` -> (the last user message's text, its images, system/developer texts)."""
    if isinstance(value, str):
        return value, [], []
    systems: list[str] = []
    user: tuple[str, list[ImagePart]] | None = None
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind != "message":
            raise BadRequest(f"{where}: item type {kind!r} is not supported: agentd agents run their own "
                             "tools; send message items")
        role = item.get("role")
        if role not in ROLES:
            raise BadRequest(f"{where}.role must be one of {', '.join(ROLES)}")
        if role == "assistant":
            continue  # earlier answers: the agent's session already holds them
        text, images = _content(item.get("content"), where)
        if role in ("system", "developer"):
            systems.append(text)
        elif role == "user":
            user = text, images
    if user is None:
        raise BadRequest("no user message found in input", code="missing_message")
    return user[0], user[1], systems


def parse_request(data: dict[str, Any]) -> tuple[AgentHandle, str, RunOptions, dict[str, str]]:
    """The agent, the run's input, its options and its RunRequest fields (the key that pays,
    the person's session) from a validated request."""
    handle = resolve_agent(data["model"])
    previous = data.get("previous_response_id")
    user = data.get("user") or None
    continued: str | None = None  # the label of the session the previous response was answered in
    if previous:
        stored = _visible(previous)
        if stored is None:
            raise ResponseNotFound(previous, "previous_response_not_found")
        if stored[0] != handle.id:
            raise BadRequest(f"previous response '{previous}' was answered by another agent; continue it "
                             "with the same model", code="previous_response_mismatch")
        # Continuing a response continues its session (a person's, a key's), whoever asks,
        # unless the request names its own `user`.
        user = user or stored[1].get("user") or None
        continued = stored[2]
    text, images, systems = parse_input(data["input"])
    if is_blank(text) and not images:
        raise BadRequest("no user message found in input", code="missing_message")
    check_message(text)
    params = {k: data[k] for k in ("top_p", "user") if data.get(k) is not None}
    fmt = as_chat_format(((data.get("text") or {}).get("format")))
    if fmt is not None:
        params["response_format"] = fmt
    options = RunOptions(max_tokens=data.get("max_output_tokens"), temperature=data.get("temperature"),
                         params=generation_params(params))
    options.extra_system = "\n\n".join(s for s in [data.get("instructions") or "", *systems] if s.strip())
    options.images = images
    # The OpenAI `user` (else a scoped key itself) talks in a session of its own.
    run = run_fields(principal(), handle, user=user, own_session=True)
    if continued is not None and not data.get("user"):
        run.update(session_fields(handle, continued))
    return handle, text or "(image)", options, run


class Shape:
    """The response object of one request, in each state it passes through."""

    def __init__(self, handle: AgentHandle, data: dict[str, Any], session: str = "") -> None:
        self.id = f"resp_{random_uuid_hex()}"
        self.message_id = f"msg_{random_uuid_hex()}"
        self.created_at = int(time.time())
        self.handle = handle
        self.data = data
        self.store = data.get("store") is not False
        # Read while the request is current: a stream ends later, on a thread without it.
        self.key_id = principal().key_id
        self.session = session  # the label of the session it is answered in
        self.responses = kernel().responses

    def message(self, text: str | None, status: str) -> dict[str, Any]:
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": [] if text is None else [self.part(text)]}

    @staticmethod
    def part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def response(self, status: str, output: list[dict[str, Any]], usage: tuple[int, int] | None = None,
                 error: dict[str, Any] | None = None, incomplete: str | None = None) -> dict[str, Any]:
        data = self.data
        fmt = (data.get("text") or {}).get("format") or {"type": "text"}
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": error, "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": data.get("instructions"), "max_output_tokens": data.get("max_output_tokens"),
            "model": self.handle.name, "output": output, "parallel_tool_calls": False,
            "previous_response_id": data.get("previous_response_id"), "reasoning": {"effort": None, "summary": None},
            "store": self.store, "temperature": data.get("temperature"), "top_p": data.get("top_p"),
            "text": {"format": fmt}, "tool_choice": "auto", "tools": [], "truncation": "disabled",
            "usage": None if usage is None else _usage(*usage), "user": data.get("user"),
            "metadata": data.get("metadata") or {},
        }

    def finished(self, text: str, finish_reason: str, usage: tuple[int, int]) -> dict[str, Any]:
        """The final object of a run that answered; kept when the request says `store`."""
        cut = finish_reason == "length"
        status = "incomplete" if cut else "completed"
        obj = self.response(status, [self.message(text, status)], usage,
                            incomplete="max_output_tokens" if cut else None)
        self.keep(obj)
        return obj

    def failed(self, message: str, code: str) -> dict[str, Any]:
        obj = self.response("failed", [], error={"code": code, "message": message})
        self.keep(obj)
        return obj

    def keep(self, obj: dict[str, Any]) -> None:
        if self.store:
            self.responses.save(self.handle.id, obj, self.key_id, self.session)


def _usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


@bp.post("/v1/responses")
@doc("OpenAI Responses API with an agent", tags="openai", body=ResponsesRequestSchema,
     response=out.ResponseObjectSchema, ok_headers=("x-agentd-dropped-params",), sse_alt=True,
     body_example={"model": "agentd:helper", "input": "hello"},
     description="`model` names the agent. `input` is a string or message items; the last user message "
                 "is the run's input (the agent's session supplies history) and `instructions` plus "
                 "system/developer items are extra instructions for this run. `previous_response_id` "
                 "names a stored response of the same agent. `store` (default true) keeps the response "
                 "for GET /v1/responses/{id}. `temperature`, `top_p`, `max_output_tokens`, `user` and "
                 "`text.format` (json_object, json_schema) go to the agent's model as on "
                 "/v1/chat/completions; non-empty `tools`, `tool_choice` other than none/auto and "
                 "`background: true` are refused with 400. With `stream: true` the answer is "
                 "`text/event-stream` of Responses events (`event: response.created` ... "
                 "`response.completed`, or `response.failed`), each with a `sequence_number`.",
     errors={404: "No agent for `model` (`model_not_found`), or `previous_response_id` names no stored "
                  "response (`previous_response_not_found`)",
             409: "The run was stopped (`run_cancelled`)",
             413: "Message over 64 KB",
             424: "The agent's provider has no API key; the message names the setting "
                  "(`provider_key_missing`)",
             429: "Budget or quota exhausted (`budget_exceeded`, `quota_exceeded`), the agent's queue is "
                  "full (`agent_busy`), or the provider still throttled (`upstream_rate_limited`)",
             500: "The agent failed (no `code`), its provider's key rejected included",
             503: "The provider failed or was unreachable after retries (`upstream_unavailable`), or "
                  "too many streams",
             504: "The provider timed out (`upstream_timeout`)"})
def create_response():
    try:
        return _create()
    except (RunCancelled, AgentRunError, TooManyRequests) as exc:
        return run_failure(exc)


def _create() -> Response:
    raw = body.json_body()
    refuse_unsupported(raw)
    if isinstance(raw, dict) and raw.get("background") is True:
        raise BadRequest("unsupported parameter 'background': a response is answered on its request; "
                         "remove it from the request")
    data = body.validate(RESPONSES_REQUEST_SCHEMA, raw)
    handle, text, options, run = parse_request(data)
    shape = Shape(handle, data, run.get("label", ""))
    dropped = dropped_params(handle, options.params)
    if data.get("stream"):
        return with_dropped(_stream(handle, text, options, shape, run), dropped)
    result = run_blocking(kernel(), handle, text, [], options, origin="v1", run=run)
    obj = shape.finished(result.said, result.finish_reason,
                         (result.usage.input_tokens, result.usage.output_tokens))
    return with_dropped(jsonify(obj), dropped)


def _stream(handle: AgentHandle, text: str, options: RunOptions, shape: Shape, run: dict[str, str]) -> Response:
    sequence = iter(range(1 << 62))
    where = {"item_id": shape.message_id, "output_index": 0, "content_index": 0}

    def event(kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": next(sequence), **fields}
        return f"event: {kind}\ndata: {encode_compact(payload)}\n\n"

    opening = (event("response.created", response=shape.response("in_progress", [])),
               event("response.in_progress", response=shape.response("in_progress", [])),
               event("response.output_item.added", output_index=0, item=shape.message(None, "in_progress")),
               event("response.content_part.added", **where, part=shape.part("")))

    said: list[str] = []  # the final text is the deltas', as OpenAI's clients assemble it

    def render(ev: Event) -> tuple[list[str], bool]:
        d = ev.data
        if ev.type == "text_delta":
            said.append(d["content"])
            return [event("response.output_text.delta", **where, delta=d["content"], logprobs=[])], False
        if ev.type == "done":
            obj = shape.finished("".join(said), d["finish_reason"], (d["input_tokens"], d["output_tokens"]))
            item = obj["output"][0]
            final = "response.incomplete" if obj["status"] == "incomplete" else "response.completed"
            return [event("response.output_text.done", **where, text=item["content"][0]["text"], logprobs=[]),
                    event("response.content_part.done", **where, part=item["content"][0]),
                    event("response.output_item.done", output_index=0, item=item),
                    event(final, response=obj)], True
        if ev.type == "stopped":
            return [event("response.failed", response=shape.failed(STOPPED_MESSAGE, "run_cancelled"))], True
        if ev.type == "error":
            status, code = failure_code(d["kind"], d["status"], d["code"], d["message"])
            code = code or ("rate_limit_exceeded" if status == 429 else "server_error")
            return [event("response.failed", response=shape.failed(d["message"], code))], True
        return [], False

    return stream_run(kernel(), handle, text, [], options,
                      StreamShape(opening=opening, render=render, keep_alive=": keep-alive\n\n"), origin="v1",
                      run=run)


def _visible(response_id: str) -> tuple[str, dict[str, Any], str | None] | None:
    """(agent id, response, its session's label or None) of a stored response the caller may
    see: a scoped key sees only its own answers, and none of an agent outside its list."""
    stored = kernel().responses.get(response_id)
    if stored is None:
        return None
    who = principal()
    if not who.is_admin and stored[2] != who.key_id:
        return None
    handle = kernel().agents.find(stored[0])
    if handle is not None:
        try:
            who.reach(handle)  # (a refusal is audited)
        except NotFound:
            return None
    return stored[0], stored[1], stored[3]


def _stored(response_id: str) -> dict[str, Any]:
    stored = _visible(response_id)
    if stored is None:
        raise ResponseNotFound(response_id)
    return stored[1]


@bp.get("/v1/responses/<response_id>")
@doc("A stored response", tags="openai", response=out.ResponseObjectSchema,
     errors={404: "No stored response with this id (never stored, created with `store: false`, or "
                  "deleted) (`response_not_found`)"})
def retrieve_response(response_id: str):
    return jsonify(_stored(response_id))


@bp.delete("/v1/responses/<response_id>")
@doc("Delete a stored response", tags="openai", response=out.ResponseDeletedSchema,
     errors={404: "No stored response with this id (`response_not_found`)"})
def delete_response(response_id: str):
    _stored(response_id)
    if not kernel().responses.delete(response_id):
        raise ResponseNotFound(response_id)
    return jsonify({"id": response_id, "object": "response.deleted", "deleted": True})
