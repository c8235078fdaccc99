"""An MCP server built with the SDK's MCPServer, for the client tests: over stdio by default,
over Streamable HTTP with `--http PORT`. Its tools answer text, an image with text,
structured content and an error, and misbehave on request (hang, crash)."""

from __future__ import annotations

import os
import signal
import sys
import time

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from pydantic import BaseModel

server = MCPServer("toolbox")

# 1x1 PNG
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")


class Weather(BaseModel):
    city: str
    celsius: int


@server.tool(description="Echo the text back.")
def echo(text: str) -> str:
    return f"echo:{text}"


@server.tool(description="A picture and its caption.")
def picture() -> list:
    return ["a red dot", Image(data=PNG, format="png")]


@server.tool(description="The weather in a city.")
def weather(city: str) -> Weather:
    return Weather(city=city, celsius=21)


@server.tool(description="Always fails.")
def broken() -> str:
    raise ToolError("the gauge is broken")


@server.tool(description="Never answers.")
async def hang() -> str:
    await anyio.sleep(3600)
    return "never"


@server.tool(description="The server process dies.")
def crash() -> str:
    os._exit(3)


@server.tool(description="An environment variable of the server's process ('' when unset).")
def env(name: str) -> str:
    return os.environ.get(name, "")


@server.tool(description="A header of the HTTP request that called this tool ('' over stdio).")
def header(name: str, ctx: Context) -> str:
    request = ctx.request_context.request
    return request.headers.get(name, "") if request is not None else ""


@server.tool(description="The whole server process stops (SIGSTOP): it answers nothing more.")
def freeze() -> str:
    os.kill(os.getpid(), signal.SIGSTOP)
    return "thawed"


@server.tool(description="The server's process id.")
def pid() -> str:
    return str(os.getpid())


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--start-delay":  # a server slow to start (npx, uvx)
        time.sleep(float(sys.argv[2]))
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
