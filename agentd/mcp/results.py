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


def render(result: Any) -> str:
    """The text for the model; raises ToolError (with that text) when the server says isError."""
    parts = [_block(b) for b in (result.content or [])]
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        # A tool returning a plain value has it wrapped as {"result": value} beside its text.
        said = isinstance(structured, dict) and list(structured) == ["result"] and \
            json.dumps(structured["result"]) in (json.dumps(p) for p in parts)
        for part in parts:
            try:
                said = said or json.loads(part) == structured
            except ValueError:
                continue
        if not said:
            parts.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(parts)
    if getattr(result, "is_error", False):
        raise ToolError(text or "the MCP server reported an error")
    return text
