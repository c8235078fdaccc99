"""`[[mcp_servers]]` parsing, tool names and result rendering (in process)."""

from __future__ import annotations

from pathlib import Path

import mcp_types as t
import pytest

from agentd.agents.tools.base import ToolError
from agentd.config import ConfigError, parse_config
from agentd.mcp.config import McpServerSpec, parse_mcp_servers
from agentd.mcp.names import tool_name, tool_names
from agentd.mcp.results import render


def test_servers_parse_into_specs(tmp_path: Path) -> None:
    cfg = parse_config({"mcp_servers": [
        {"name": "gh", "command": "github-mcp", "args": ["stdio"], "env": ["GITHUB_TOKEN"]},
        {"name": "web", "url": "https://mcp.example.com/mcp", "headers_env": {"Authorization": "WEB_AUTH"},
         "timeout_secs": 5}]}, tmp_path)
    assert cfg.mcp_servers == [
        McpServerSpec(name="gh", command="github-mcp", args=("stdio",), env=("GITHUB_TOKEN",)),
        McpServerSpec(name="web", url="https://mcp.example.com/mcp", headers_env=(("Authorization", "WEB_AUTH"),),
                      timeout_secs=5.0)]
    assert [s.transport for s in cfg.mcp_servers] == ["stdio", "streamable_http"]
    assert parse_config({}, tmp_path).mcp_servers == []


@pytest.mark.parametrize("tables, message", [
    ({"name": "x"}, "mcp_servers[0].command: give command (stdio) or url (Streamable HTTP)"),
    ({"name": "x", "command": " ", "url": ""},
     "mcp_servers[0].command: give command (stdio) or url (Streamable HTTP)"),
    ({"name": "x", "command": "a", "url": "http://h/mcp"},
     "mcp_servers[0].command: give either command (stdio) or url (Streamable HTTP), not both"),
    ({"name": "x", "command": "a", "env": {"TOKEN": "secret"}}, "mcp_servers[0].env: values are not allowed here"),
    ({"name": "x", "url": "http://h/mcp", "headers": {"Authorization": "Bearer s"}},
     "mcp_servers[0].headers: literal header values are not allowed"),
    ({"name": "x", "url": "http://h/mcp", "headers_env": {"Authorization": "Bearer s3cret"}},
     "mcp_servers[0].headers_env.Authorization: expected the name of an environment variable"),
    ({"name": "x", "url": "ftp://h/mcp"}, "mcp_servers[0].url: expected an http:// or https:// URL"),
    ({"name": "bad name", "command": "a"}, "mcp_servers[0].name: expected a name"),
    ({"name": "x", "command": "a", "timeout_secs": 0}, "mcp_servers[0].timeout_secs: expected a number"),
    ({"name": "x", "command": "a", "colour": "red"}, "mcp_servers[0].colour: unknown key"),
])
def test_bad_tables_are_refused_naming_the_key(tables: dict, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_mcp_servers({"mcp_servers": [tables]})
    assert refused.value.message.startswith(f"config key {message}")


def test_a_name_used_twice_and_a_table_instead_of_an_array_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"mcp_servers\[1\].name: 'a' is configured twice"):
        parse_mcp_servers({"mcp_servers": [{"name": "a", "command": "x"}, {"name": "a", "command": "y"}]})
    with pytest.raises(ConfigError, match="expected an array of tables"):
        parse_mcp_servers({"mcp_servers": {"name": "a"}})


def test_tool_names_follow_the_providers_rules() -> None:
    assert tool_name("time", "get_current_time") == "mcp_time_get_current_time"
    assert tool_name("my.server", "do it/now") == "mcp_my_server_do_it_now"
    long_a, long_b = tool_name("s", "x" * 80 + "a"), tool_name("s", "x" * 80 + "b")
    assert len(long_a) == 64 and long_a != long_b and long_a.startswith("mcp_s_xxx")
    # Tools that would share a name: the first keeps it, the later ones get a hash of their own.
    pairs = [("a", "b_c"), ("a", "x.y"), ("a", "x_y"), ("a_b", "c"), ("a", "b_c")]
    names = tool_names(pairs)
    assert list(names) == pairs[:4] and len(set(names.values())) == 4
    assert names[("a", "b_c")] == "mcp_a_b_c" and names[("a", "x.y")] == "mcp_a_x_y"
    assert names[("a_b", "c")].startswith("mcp_a_b_c_") and len(names[("a_b", "c")]) == len("mcp_a_b_c_") + 8
    assert tool_names(pairs) == names  # the same every time


def test_results_render_every_kind_of_content() -> None:
    result = t.CallToolResult(content=[
        t.TextContent(type="text", text="caption"),
        t.ImageContent(type="image", data="AAAA", mime_type="image/png"),
        t.EmbeddedResource(type="resource", resource=t.TextResourceContents(uri="file:///a.txt", text="body")),
        t.ResourceLink(type="resource_link", uri="file:///b.bin", name="b")],
        structured_content={"n": 1})
    assert render(result) == ('caption\n[image: image/png, 3 bytes]\n[resource file:///a.txt]\nbody\n'
                              '[resource link: file:///b.bin (b)]\n{"n": 1}')
    wrapped = t.CallToolResult(content=[t.TextContent(type="text", text="7")], structured_content={"result": 7})
    assert render(wrapped) == "7"
    with pytest.raises(ToolError, match="^boom$"):
        render(t.CallToolResult(content=[t.TextContent(type="text", text="boom")], is_error=True))
