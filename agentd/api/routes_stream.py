"""POST /api/agents/{id}/message/stream: the agent's events as Server-Sent Events."""

from __future__ import annotations

from flask import Blueprint

from agentd.agents.events import Event
from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api import body
from agentd.api.principal import principal, run_fields
from agentd.api.routes_agents import agent, message_text
from agentd.api.routes_system import kernel
from agentd.api.schemas import MESSAGE_SCHEMA, MessageSchema
from agentd.api.sse import comment, format_event
from agentd.api.streaming import StreamShape, stream_run

bp = Blueprint("stream", __name__)


@bp.post("/api/agents/<agent_id>/message/stream")
@doc("Send a message and stream the run as Server-Sent Events", tags="agents", body=MessageSchema,
     response=out.SSE, response_media="text/event-stream", body_example={"message": "hello"},
     description="Events: `chunk` `{content, done: false}`; `tool_use` `{tool, id}`; `tool_result` "
                 "`{tool, id, input, result, is_error}`; `phase` `{phase, detail}`; `done` `{done: true, "
                 "usage: {input_tokens, output_tokens}, iterations, cost_usd}` (`stopped: true` when stopped); "
                 "`error` `{error, status}`. Comment lines are keep-alives. Refusals before the stream "
                 "starts (quota, budget, stream cap) are plain JSON errors.",
     errors={413: "Message over 64 KB",
             429: "Budget or the agent's token quota exhausted, or the agent's queue is full",
             503: "Too many concurrent streams (`Retry-After`), or the daemon is shutting down"})
def message_stream(agent_id: str):
    handle = agent(agent_id)
    data = body.load(MESSAGE_SCHEMA)
    text = message_text(data)
    k = kernel()
    if data["attachments"]:
        # A bad attachment is a 400 now, not an `error` event after a 200 stream has begun.
        k.runs.build_user_message(handle, text, data["attachments"])
    return stream_run(k, handle, text, data["attachments"], None,
                      StreamShape(opening=(), render=_render, keep_alive=comment("keep-alive")),
                      run=run_fields(principal(), handle, data.get("user"), data.get("session"), own_session=True))


def _render(event: Event) -> tuple[list[str], bool]:
    """One run event as this route's SSE events, and whether it ends the stream."""
    kind, d = event.type, event.data
    if kind == "text_delta":
        return [format_event("chunk", {"content": d["content"], "done": False})], False
    if kind == "tool_use":
        return [format_event("tool_use", {"tool": d["tool"], "id": d["id"]})], False
    if kind == "tool_result":
        return [format_event("tool_result", {"tool": d["tool"], "input": d["input"], "id": d["id"],
                                             "result": d["result"], "is_error": d["is_error"]})], False
    if kind == "phase":
        return [format_event("phase", {"phase": d["phase"], "detail": d.get("detail") or ""})], False
    if kind == "done":
        return [format_event("done", {"done": True, "usage": {"input_tokens": d["input_tokens"],
                                                               "output_tokens": d["output_tokens"]},
                                      "iterations": d["iterations"], "cost_usd": d["cost_usd"]})], True
    if kind == "stopped":
        return [format_event("phase", {"phase": "cancelled", "detail": "run stopped"}),
                format_event("done", {"done": True, "stopped": True,
                                      "usage": {"input_tokens": 0, "output_tokens": 0}})], True
    if kind == "error":
        error = {"error": d["message"], "status": d["status"]}
        if d.get("retry_after") is not None:  # an upstream 429/503 said when to come back
            error["retry_after"] = d["retry_after"]
        return [format_event("error", error)], True
    return [], False
