"""Tool names the model providers accept: `^[A-Za-z0-9_-]{1,64}$` (OpenAI, Anthropic) and a
letter or `_` first (Gemini)."""

from __future__ import annotations

import hashlib
import re
from typing import Iterable

MAX_LEN = 64
_BAD = re.compile(r"[^A-Za-z0-9_-]+")


def tool_name(server: str, tool: str) -> str:
    """`mcp_<server>_<tool>` with every other character replaced by `_`; a name too long is
    cut and given a short hash of the original, so two long names stay apart."""
    name = _BAD.sub("_", f"mcp_{server}_{tool}")
    return name if len(name) <= MAX_LEN else _hashed(name, server, tool)


def tool_names(tools: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The agent tool name of each (server, tool), taken in the order given. Different tools
    can make the same name (server `a`'s `b_c` and server `a_b`'s `c`; `x.y` and `x_y`), and
    a provider refuses a request offering one name twice: a name an earlier tool has is
    given a short hash of the server and tool, which stays the same from call to call."""
    names: dict[tuple[str, str], str] = {}
    taken: set[str] = set()
    for server, tool in tools:
        if (server, tool) in names:
            continue
        name = tool_name(server, tool)
        if name in taken:
            name = _hashed(name, server, tool)
        taken.add(name)
        names[(server, tool)] = name
    return names


def _hashed(name: str, server: str, tool: str) -> str:
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return f"{name[:MAX_LEN - 9]}_{digest}"
