"""Tool names the model providers accept: `^[A-Za-z0-9_-]{1,64}$` (OpenAI, Anthropic) and a
letter or `_` first (Gemini)."""

from __future__ import annotations

import hashlib
import re

MAX_LEN = 64
_BAD = re.compile(r"[^A-Za-z0-9_-]+")


def tool_name(server: str, tool: str) -> str:
    """`mcp_<server>_<tool>` with every other character replaced by `_`; a name too long is
    cut and given a short hash of the original, so two long names stay apart."""
    name = _BAD.sub("_", f"mcp_{server}_{tool}")
    if len(name) <= MAX_LEN:
        return name
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return f"{name[:MAX_LEN - 9]}_{digest}"
