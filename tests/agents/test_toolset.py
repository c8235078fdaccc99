"""Which tools an agent is offered (agentd/agents/toolset.py), called directly on handles
built from manifests: the MCP servers' tools beside the built-in ones, filtered by the
agent's tool list and left out in Observe mode. (The built-in tools a profile, a list or a
mode grants are checked through a real manager in tests/agents/test_registry.py.)"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from agentd.agents.handle import AgentHandle
from agentd.agents.manifest import parse_manifest
from agentd.agents.tools import Tool
from agentd.agents.toolset import builtin_tools, effective_tools


def handle(extra: str = "", mode: str = "Auto") -> AgentHandle:
    now = datetime.now(timezone.utc)
    return AgentHandle(id=str(uuid.uuid4()), name="t", manifest=parse_manifest(f'name = "t"\n{extra}'), mode=mode,
                       state="Running", created_at=now, last_active=now, session_id=str(uuid.uuid4()),
                       provider="openai", model="gpt-4o", api_key_env="", base_url="")


def remote_tool(name: str) -> Tool:
    return Tool(name=name, description=name, parameters={"type": "object", "properties": {}},
                run=lambda ctx, args: "", origin="mcp:srv")


class Hub:
    """Stands in for the MCP hub: records which servers each lookup named."""

    def __init__(self, *names: str) -> None:
        self.asked: list[list[str]] = []
        self.names = names

    def __call__(self, servers: list[str]) -> list[Tool]:
        self.asked.append(servers)
        return [remote_tool(n) for n in self.names]


def names(tools: list[Tool]) -> list[str]:
    return [t.name for t in tools]


def test_mcp_tools_follow_the_built_in_ones_for_the_servers_the_agent_names() -> None:
    h = handle('mcp_servers = ["time", "fs"]\n')
    hub = Hub("mcp_time_now", "mcp_fs_read")
    tools, caps = effective_tools(h, "Auto", hub)
    built_in = names(builtin_tools(h, "Auto")[0])
    assert names(tools) == built_in + ["mcp_time_now", "mcp_fs_read"]
    assert hub.asked == [["time", "fs"]]
    assert caps["tools"] == []


def test_every_mcp_tool_with_a_wildcard_list_and_only_the_listed_ones_otherwise() -> None:
    hub = Hub("mcp_time_now", "mcp_fs_read")
    tools, _ = effective_tools(handle('[capabilities]\ntools = ["*"]\n'), "Auto", hub)
    assert names(tools)[-2:] == ["mcp_time_now", "mcp_fs_read"]
    tools, _ = effective_tools(handle('[capabilities]\ntools = ["file_read", "mcp_fs_read"]\n'), "Manual", hub)
    assert names(tools) == ["file_read", "mcp_fs_read"]
    tools, _ = effective_tools(handle('[capabilities]\ntools = ["file_read"]\n'), "Auto", hub)
    assert names(tools) == ["file_read"]


def test_observe_mode_and_a_daemon_without_mcp_offer_no_mcp_tool() -> None:
    h = handle('mcp_servers = ["time"]\n')
    hub = Hub("mcp_time_now")
    tools, caps = effective_tools(h, "Observe", hub)
    assert hub.asked == [], "the servers are not even asked in Observe mode"
    assert all(t.read_only for t in tools) and "mcp_time_now" not in names(tools)
    assert caps["read_only_mode"] is True
    assert names(effective_tools(h, "Auto", None)[0]) == names(builtin_tools(h, "Auto")[0])


def test_the_mcp_tools_are_not_kept_in_the_built_in_answer() -> None:
    h = handle()
    hub = Hub("mcp_time_now")
    first, _ = effective_tools(h, "Auto", hub)
    second, _ = effective_tools(h, "Auto", hub)
    assert names(first) == names(second) and names(second).count("mcp_time_now") == 1
    assert len(hub.asked) == 2, "MCP servers come and go: asked on every run"
    assert "mcp_time_now" not in names(builtin_tools(h, "Auto")[0])


def test_an_mcp_tool_in_the_list_is_no_unknown_tool() -> None:
    from agentd.agents.toolset import unknown_tools

    # (MCP servers' tools are named mcp_<server>_<tool> and come and go with the config)
    assert unknown_tools(["mcp_time_now", "file_read"]) == []
    assert [w.split(" ignored")[0] for w in unknown_tools(["mcp_time_now", "time_now", "xmcp_time"])] == [
        "capabilities.tools: unknown tool 'time_now'", "capabilities.tools: unknown tool 'xmcp_time'"]
