"""Session history: stored as plain dicts, converted to LLM messages for each run.

Stored message: {"role": "user"|"assistant"|"tool", "content": str,
                 "tool_calls"?: [{id, name, arguments}], "tool_call_id"?, "tool_name"?,
                 "is_error"?, "images"?: [{file_id, filename, content_type}],
                 "source"?: "cron" (a user message nobody typed: a cron job's)}
Image bytes are sent to the model with the turn that carried them and are not
replayed afterwards (the history keeps a reference and an `[Image]` marker).
"""

from __future__ import annotations

from typing import Any

from agentd.llm.types import Message, ToolCall


def to_stored(message: Message) -> dict[str, Any]:
    """An LLM message as a JSON-able dict for the session row."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments}
                             for c in message.tool_calls]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
        out["tool_name"] = message.tool_name
        out["is_error"] = message.is_error
    return out


def to_llm(stored: dict[str, Any]) -> Message:
    """A stored dict back to an LLM message (without image bytes)."""
    content = stored.get("content", "")
    if stored.get("images"):
        content = (content + "\n" if content else "") + "[Image]" * len(stored["images"])
    return Message(role=stored["role"], content=content,
                   tool_calls=[ToolCall(c["id"], c["name"], c.get("arguments") or {})
                               for c in stored.get("tool_calls", [])],
                   tool_call_id=stored.get("tool_call_id"), tool_name=stored.get("tool_name"),
                   is_error=bool(stored.get("is_error")))


def clean_history(messages: list[Message]) -> list[Message]:
    """Messages to send, dropping a dangling tool call whose result never arrived
    (a run killed mid-tool) so providers do not reject the history."""
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    cleaned: list[Message] = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls and not all(c.id in answered for c in m.tool_calls):
            if m.content:
                cleaned.append(Message(role="assistant", content=m.content))
            continue
        cleaned.append(m)
    return cleaned


def api_view(stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as GET /api/agents/{id}/session shows them: User and Assistant turns,
    with the tools an assistant turn used attached to it."""
    view: list[dict[str, Any]] = []
    results = {m.get("tool_call_id"): m for m in stored if m["role"] == "tool"}
    for m in stored:
        if m["role"] == "user":
            entry: dict[str, Any] = {"role": "User", "content": m.get("content", "")}
            if m.get("images"):
                entry["images"] = m["images"]
            if m.get("source"):
                entry["source"] = m["source"]
            view.append(entry)
        elif m["role"] == "assistant":
            entry = {"role": "Assistant", "content": m.get("content", "")}
            if m.get("tool_calls"):
                entry["tools"] = [{"name": c["name"], "input": c.get("arguments") or {},
                                   "result": results.get(c["id"], {}).get("content"),
                                   "is_error": results.get(c["id"], {}).get("is_error", False)}
                                  for c in m["tool_calls"]]
            view.append(entry)
    return view


def estimate_tokens(stored: list[dict[str, Any]], system_prompt: str) -> int:
    """Rough token count (4 characters a token) of what the next run would send."""
    chars = len(system_prompt) + sum(len(m.get("content", "")) + 16 for m in stored)
    return chars // 4
