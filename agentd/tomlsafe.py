"""TOML decoding with a bound on nesting depth.

tomllib recurses once per nested array or inline table, so a 10 KB text of a few hundred
`[` raises RecursionError (a 500), and how deep it gets before that depends on the caller's
stack. `loads` refuses anything nested deeper than JSON may be (`MAX_DEPTH`) as a syntax
error, which every caller already answers: the same text is refused wherever it is read.
"""

from __future__ import annotations

import tomllib
from typing import Any

from agentd.jsonsafe import MAX_DEPTH

TOO_DEEP_MESSAGE = f"nested too deeply (more than {MAX_DEPTH} levels)"


def loads(text: str) -> dict[str, Any]:
    """`tomllib.loads` that raises TOMLDecodeError past `MAX_DEPTH` levels of tables and arrays."""
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise tomllib.TOMLDecodeError(TOO_DEEP_MESSAGE) from None
    if _depth_exceeds(data, MAX_DEPTH):
        raise tomllib.TOMLDecodeError(TOO_DEEP_MESSAGE)
    return data


def _depth_exceeds(data: dict[str, Any], limit: int) -> bool:
    # Level by level, not recursively: dotted keys (`a.a.a... = 1`) nest without the parser recursing.
    level: list[Any] = [data]
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [item for value in level for item in (value.values() if isinstance(value, dict) else value)
                 if isinstance(item, (dict, list))]
    return False
