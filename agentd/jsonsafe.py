"""JSON decoding with a bound on nesting depth.

Python's decoder recurses once per level, so a body of 100,000 `[` raises
RecursionError (a 500) and a few thousand levels already cost real stack. Every
untrusted JSON text (request bodies, WebSocket frames, webhook payloads) goes
through `loads`, which refuses anything nested deeper than `MAX_DEPTH` before
the decoder sees it.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64
TOO_DEEP_MESSAGE = "JSON nested too deeply"

# A JSON string literal (escapes included); brackets inside strings do not nest.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(rb"[\[\]{}]")


class JsonTooDeep(ValueError):
    """The document nests arrays/objects deeper than allowed."""


def depth_exceeds(data: bytes, limit: int = MAX_DEPTH) -> bool:
    """True when `data` opens more than `limit` arrays/objects at once."""
    # Cheap exit for the usual body: it cannot nest deeper than it has brackets.
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    depth = 0
    for match in _BRACKETS.finditer(_STRING.sub(b"", data)):
        if match.group() in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def loads(data: bytes | str, limit: int = MAX_DEPTH) -> Any:
    """`json.loads` that raises JsonTooDeep past `limit` levels (ValueError subclasses otherwise)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if depth_exceeds(raw, limit):
        raise JsonTooDeep(TOO_DEEP_MESSAGE)
    return json.loads(data)
