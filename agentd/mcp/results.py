"""An MCP tool result as the model reads it: the text of every content block in order,
what other blocks are, the structured content when no text block carries it, and
`isError` as a tool error."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from agentd.agents.tools.base import ToolError


def _size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)


def _block(block: Any) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {_size(block.data)} bytes]"
    if kind == "resource":
        res = block.resource
        text = getattr(res, "text", None)
        if text is not None:
            return f"[resource {res.uri}]\n{text}"
        return f"[resource {res.uri}: {getattr(res, 'mime_type', None) or 'binary'}, " \
               f"{_size(getattr(res, 'blob', ''))} bytes]"
    if kind == "resource_link":
        return f"[resource link: {block.uri}{' (' + block.name + ')' if getattr(block, 'name', '') else ''}]"
    return json.dumps(block.model_dump(mode="json", by_alias=True, exclude_none=True))


def _carries(text: str, structured: Any) -> bool:
    """Whether a text block already says what the structured content holds (servers send
    both; a plain value comes wrapped as {"result": value})."""
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    wrapped = isinstance(structured, dict) and list(structured) == ["result"]
    return value == structured or (wrapped and (value == structured["result"] or text == structured["result"]))


def render(result: Any) -> str:
    """The text for the model; raises ToolError (with that text) when the server says isError."""
    parts = [_block(b) for b in (result.content or [])]
    structured = getattr(result, "structured_content", None)
    if structured is not None and not any(_carries(part, structured) for part in parts):
        parts.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(parts)
    if getattr(result, "is_error", False):
        raise ToolError(text or "the MCP server reported an error")
    return text
