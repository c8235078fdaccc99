"""A2A's JSON-RPC wire shapes: error codes, responses, messages and their parts, and the
A2A 1.0 spelling of tasks and events."""

from __future__ import annotations

import json
import uuid
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
PUSH_NOT_SUPPORTED = -32003
UNSUPPORTED_OPERATION = -32004
CONTENT_TYPE_NOT_SUPPORTED = -32005
VERSION_NOT_SUPPORTED = -32009


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def error_response(rpc_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": rpc_id, "error": error}


def result_response(rpc_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "result": result}


def text_part(text: str) -> dict[str, Any]:
    return {"kind": "text", "text": text}


def agent_message(text: str, context_id: str, task_id: str) -> dict[str, Any]:
    return {"kind": "message", "messageId": str(uuid.uuid4()), "role": "agent", "parts": [text_part(text)],
            "contextId": context_id, "taskId": task_id}


def message_text(message: Any) -> str:
    """The text of an A2A message's parts (text parts as they are, data parts as JSON)."""
    if not isinstance(message, dict):
        raise RpcError(INVALID_PARAMS, "params.message must be an object")
    role = message.get("role", "user")
    if role not in ("user", "ROLE_USER"):
        raise RpcError(INVALID_PARAMS, "params.message.role must be 'user'")
    parts = message.get("parts")
    if not isinstance(parts, list) or not parts:
        raise RpcError(INVALID_PARAMS, "params.message.parts must be a non-empty array")
    texts = []
    for part in parts:
        if not isinstance(part, dict):
            raise RpcError(INVALID_PARAMS, "each message part must be an object")
        kind = part.get("kind")
        if isinstance(part.get("text"), str) and kind in (None, "text"):
            texts.append(part["text"])
        elif "data" in part and kind in (None, "data"):
            texts.append(json.dumps(part["data"]))
        elif kind == "file" or "file" in part or "raw" in part or "url" in part:
            raise RpcError(CONTENT_TYPE_NOT_SUPPORTED, "file parts are not supported: send text or data parts")
        else:
            raise RpcError(INVALID_PARAMS, "a message part must be a text or data part")
    text = "\n".join(texts)
    if not text.strip():
        raise RpcError(INVALID_PARAMS, "the message has no text")
    return text


def to_v1(value: Any) -> Any:
    """An A2A 1.0 shape of a task, message or event: no `kind`, enum names for states and roles."""
    if isinstance(value, list):
        return [to_v1(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key == "kind":
            continue
        if key == "state" and isinstance(item, str):
            item = "TASK_STATE_" + item.upper().replace("-", "_")
        elif key == "role" and isinstance(item, str):
            item = "ROLE_" + item.upper()
        out[key] = to_v1(item)
    return out
