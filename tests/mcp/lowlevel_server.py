"""An MCP server on the SDK's low-level `Server`, for what MCPServer does not let a server do.
Over stdio; the first argument says what it offers:

    tools NAME...   the tools NAME... (names that collide once made agent tool names);
                    each answers `NAME called`
    badout          `badout`, whose structured content does not match its output schema,
                    and `pid`, the server's process id
    prompts         prompts only: no tools capability at all
"""

from __future__ import annotations

import os
import sys

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

MODE, NAMES = sys.argv[1], sys.argv[2:]

if MODE == "tools":
    TOOLS = [types.Tool(name=n, description=f"the tool {n}", input_schema={"type": "object"}) for n in NAMES]
elif MODE == "badout":
    TOOLS = [types.Tool(name="badout", description="answers a string where its schema says integer",
                        input_schema={"type": "object"},
                        output_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
             types.Tool(name="pid", description="the server's process id", input_schema={"type": "object"})]


def text(value: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=value)])


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params) -> types.CallToolResult:
    if params.name == "badout":
        return types.CallToolResult(content=[types.TextContent(type="text", text="n is many")],
                                    structured_content={"n": "many"})
    if params.name == "pid":
        return text(str(os.getpid()))
    return text(f"{params.name} called")


async def list_prompts(ctx, params) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[types.Prompt(name="greet", description="Say hello")])


if MODE == "prompts":
    server = Server("prompts-only", on_list_prompts=list_prompts)
else:
    server = Server(MODE, on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


anyio.run(main)
