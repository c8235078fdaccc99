"""JSON decoding with a bound on nesting depth, and only what JSON can hold.

Python's decoder recurses once per level, so a body of 100,000 `[` raises
RecursionError (a 500) and a few thousand levels already cost real stack. Every
untrusted JSON text (request bodies, WebSocket frames, webhook payloads) goes
through `loads`, which refuses anything nested deeper than `MAX_DEPTH` before
the decoder sees it.

Python's decoder also takes `NaN`, `Infinity`, `1e400` (infinite), an integer past 1.8e308 and `"\\ud800"`
(a lone surrogate, which no UTF-8 store or client can take): stored, they came back
as text no JSON parser reads, or failed the write with a 500. `loads` refuses them.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 64
TOO_DEEP_MESSAGE = "JSON nested too deeply"

# A JSON string literal (escapes included); brackets inside strings do not nest.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(rb"[\[\]{}]")


NOT_FINITE_MESSAGE = "numbers must be finite (no NaN, Infinity or values past 1.8e308)"
LONE_SURROGATE_MESSAGE = "a string holds a lone surrogate (\\ud800-\\udfff without its pair)"

# A surrogate escape, or (in text handed over as str) a surrogate already decoded.
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


class JsonTooDeep(ValueError):
    """The document nests arrays/objects deeper than allowed."""


class JsonNotPortable(ValueError):
    """Valid to Python's decoder, but not JSON any peer reads: NaN, Infinity, a lone surrogate."""


def _constant(name: str) -> Any:
    raise JsonNotPortable(NOT_FINITE_MESSAGE)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JsonNotPortable(NOT_FINITE_MESSAGE)
    return value


def _int(text: str) -> int:
    value = int(text)
    # Only an integer of 309 digits or more can be past the float limit (1.8e308), where
    # JavaScript reads Infinity and Python's float() raises: it is refused as 1e400 is.
    if len(text) > 308:
        try:
            float(value)
        except OverflowError:
            raise JsonNotPortable(NOT_FINITE_MESSAGE) from None
    return value


# `json.loads` with these hooks builds a decoder per call; one serves every call and thread
# (as `json.loads`' own default decoder does).
_DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_float, parse_int=_int)
_PLAIN = json.JSONDecoder()


def _decode(data: bytes | str, decoder: json.JSONDecoder = _DECODER) -> Any:
    """`json.loads(data, parse_constant=_constant, parse_float=_float, parse_int=_int)`, step for step."""
    if isinstance(data, str):
        if data.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)
        return decoder.decode(data)
    return decoder.decode(data.decode(json.detect_encoding(data), "surrogatepass"))


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
    """`json.loads` that raises JsonTooDeep past `limit` levels, JsonNotPortable for NaN,
    Infinity or a lone surrogate (ValueError subclasses otherwise)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if depth_exceeds(raw, limit):
        raise JsonTooDeep(TOO_DEEP_MESSAGE)
    try:
        value = _decode(data)
    except JsonNotPortable:
        # The hooks fire as the decoder meets a NaN: text that is no JSON at all ("NaN is a
        # word") fails as json.loads fails it.
        _decode(data, _PLAIN)
        raise
    if _SURROGATE.search(raw):
        # A well-formed pair decodes to one character and encodes; a lone half does not.
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise JsonNotPortable(LONE_SURROGATE_MESSAGE) from None
    return value


NUL_MESSAGE = "must not contain the NUL character (\\u0000), which PostgreSQL cannot store"


def holds_nul(value: Any) -> bool:
    """True when a string anywhere in `value` (an object's keys included) holds U+0000.
    PostgreSQL's text and jsonb cannot store it: what is kept in a column of either is
    refused with NUL_MESSAGE on every backend, so a daemon answers the same on both."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(holds_nul(k) or holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(holds_nul(v) for v in value)
    return False
