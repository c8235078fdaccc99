"""memory_store / memory_recall: the agent's own key-value memory."""

from __future__ import annotations

import json
from typing import Any

from agentd.agents.tools.base import ToolContext, tool


@tool("memory_store", "Remember a value under a key (persists across sessions and restarts).",
      {"key": {"type": "string", "description": "Key"}, "value": {"description": "Any JSON value"}},
      ("key", "value"))
def memory_store(ctx: ToolContext, args: dict[str, Any]) -> str:
    ctx.require_ops().kv_set(ctx.agent_id, args["key"], args["value"])
    return f"stored {args['key']}"


@tool("memory_recall", "Recall the value stored under a key.", {"key": {"type": "string", "description": "Key"}},
      ("key",), read_only=True)
def memory_recall(ctx: ToolContext, args: dict[str, Any]) -> str:
    found, value = ctx.require_ops().kv_get(ctx.agent_id, args["key"])
    if not found:
        return f"no value stored under {args['key']}"
    return value if isinstance(value, str) else json.dumps(value)
