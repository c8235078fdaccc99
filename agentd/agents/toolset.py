"""Which tools an agent is offered: its profile or tool list, its capabilities, its mode and
the MCP servers it may use."""

from __future__ import annotations

from typing import Any, Callable

from agentd.agents.handle import CAPABILITY_TOOLS, AgentHandle
from agentd.agents.manifest import PROFILES
from agentd.agents.tools import Tool, all_tools

# The tools of the MCP servers an allow-list names (empty: all), agentd/mcp/hub.py.
McpTools = Callable[[list[str]], list[Tool]]


def effective_tools(handle: AgentHandle, mode: str, mcp_tools: McpTools | None) -> tuple[list[Tool], dict[str, Any]]:
    """The tools offered to the model in `mode`, and the capabilities that gate them.

    A named profile grants the capabilities its tools need; with no profile or
    an explicit list, shell, network and spawning must be granted explicitly.
    """
    tools, caps = builtin_tools(handle, mode)
    # MCP servers come and go with the config, so their tools are looked up on every run;
    # none in Observe mode (they may change anything).
    if mcp_tools is not None and mode != "Observe":
        declared = caps["tools"]
        remote = mcp_tools(handle.manifest.data["mcp_servers"])
        if declared and "*" not in declared:
            remote = [t for t in remote if t.name in declared]
        tools.extend(remote)
    return tools, caps


def builtin_tools(handle: AgentHandle, mode: str) -> tuple[list[Tool], dict[str, Any]]:
    """The agent's built-in tools in `mode` and its capabilities (copies: callers may change them)."""
    cached = handle.tools_cache
    # Every run asks; the answer changes only with the manifest (never edited in place) or mode.
    if cached is not None and cached[0] is handle.manifest and cached[1] == mode:
        return list(cached[2]), dict(cached[3])
    caps = dict(handle.manifest.capabilities)
    declared = caps["tools"]
    profile = handle.manifest.profile
    available = {t.name: t for t in all_tools()}
    if declared and "*" not in declared:
        names = [n for n in declared if n in available]
    elif profile and profile not in ("full", "custom"):
        names = list(PROFILES[profile])
        _imply(caps, names)
    else:
        names = list(available)
        if profile == "full":
            _imply(caps, names)
    tools = [available[n] for n in names if n in available]
    tools = [t for t in tools if t.capability is None or caps.get(t.capability)]
    if mode == "Observe":
        tools = [t for t in tools if t.read_only]
        caps["read_only_mode"] = True
    handle.tools_cache = (handle.manifest, mode, tools, caps)
    return list(tools), dict(caps)


def _imply(caps: dict[str, Any], names: list[str]) -> None:
    for capability, tool_names in CAPABILITY_TOOLS.items():
        if tool_names & set(names) and not caps.get(capability):
            caps[capability] = True if capability == "agent_spawn" else ["*"]


def unknown_tools(declared: list[str]) -> list[str]:
    """Warnings for tool names in `capabilities.tools` that no tool has (a typo drops the tool)."""
    known = {t.name for t in all_tools()}
    return [f"capabilities.tools: unknown tool '{name}' ignored (known: {', '.join(sorted(known))})"
            for name in declared if name != "*" and name not in known and not name.startswith("mcp_")]
