"""Tools that reach other agents: list, find, send, spawn, kill."""

from __future__ import annotations

import json
from typing import Any

from agentd.agents.tools.base import ToolContext, tool

_AGENT = {"type": "string", "description": "Agent id or name"}


@tool("agent_list", "List the agents running in this daemon.", {}, read_only=True)
def agent_list(ctx: ToolContext, args: dict[str, Any]) -> str:
    return json.dumps(ctx.require_ops().list_agents())


@tool("agent_find", "Find agents whose name, description or tags contain the query.",
      {"query": {"type": "string", "description": "Text to look for"}}, ("query",), read_only=True)
def agent_find(ctx: ToolContext, args: dict[str, Any]) -> str:
    return json.dumps(ctx.require_ops().find_agents(args["query"]))


@tool("agent_send", "Send a message to another agent and return its reply.",
      {"agent_id": _AGENT, "message": {"type": "string", "description": "The message"}}, ("agent_id", "message"))
def agent_send(ctx: ToolContext, args: dict[str, Any]) -> str:
    return ctx.require_ops().send_to_agent(ctx.agent_id, args["agent_id"], args["message"])


@tool("agent_spawn", "Start a new agent from a TOML manifest; returns its id and name.",
      {"manifest_toml": {"type": "string", "description": "The agent manifest"}}, ("manifest_toml",),
      capability="agent_spawn")
def agent_spawn(ctx: ToolContext, args: dict[str, Any]) -> str:
    return json.dumps(ctx.require_ops().spawn_agent(ctx.agent_id, args["manifest_toml"]))


@tool("agent_kill", "Stop and remove another agent.", {"agent_id": _AGENT}, ("agent_id",))
def agent_kill(ctx: ToolContext, args: dict[str, Any]) -> str:
    ctx.require_ops().kill_agent(ctx.agent_id, args["agent_id"])
    return f"killed agent {args['agent_id']}"
