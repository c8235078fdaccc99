"""POST /api/agents/{id}/message/stream: the agent's events as Server-Sent Events."""

from __future__ import annotations

from typing import Iterator

from flask import Blueprint

from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api import body
from agentd.api.routes_agents import agent, message_text
from agentd.api.routes_system import kernel
from agentd.api.runs import acquire_stream_slot, start_live_run
from agentd.api.schemas import MESSAGE_SCHEMA, MessageSchema
from agentd.api.sse import comment, format_event, sse_response

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
        k.agents.build_user_message(handle, text, data["attachments"])
    acquire_stream_slot(k)
    try:
        run = start_live_run(k, handle, text, data["attachments"])
    except BaseException:
        k.stream_slots.release()
        raise

    def events() -> Iterator[str]:
        for event in run.events():
            if event is None:
                yield comment("keep-alive")
                continue
            kind, d = event.type, event.data
            if kind == "text_delta":
                yield format_event("chunk", {"content": d["content"], "done": False})
            elif kind == "tool_use":
                yield format_event("tool_use", {"tool": d["tool"], "id": d["id"]})
            elif kind == "tool_result":
                yield format_event("tool_result", {"tool": d["tool"], "input": d["input"], "id": d["id"],
                                                   "result": d["result"], "is_error": d["is_error"]})
            elif kind == "phase":
                yield format_event("phase", {"phase": d["phase"], "detail": d.get("detail") or ""})
            elif kind == "done":
                yield format_event("done", {"done": True, "usage": {"input_tokens": d["input_tokens"],
                                                                     "output_tokens": d["output_tokens"]},
                                            "iterations": d["iterations"], "cost_usd": d["cost_usd"]})
                return
            elif kind == "stopped":
                yield format_event("phase", {"phase": "cancelled", "detail": "run stopped"})
                yield format_event("done", {"done": True, "stopped": True,
                                            "usage": {"input_tokens": 0, "output_tokens": 0}})
                return
            elif kind == "error":
                error = {"error": d["message"], "status": d["status"]}
                if d.get("retry_after") is not None:  # an upstream 429/503 said when to come back
                    error["retry_after"] = d["retry_after"]
                yield format_event("error", error)
                return

    def closed() -> None:
        run.close()
        k.stream_slots.release()

    return sse_response(events(), on_close=closed, ready=run.sink.pending)
