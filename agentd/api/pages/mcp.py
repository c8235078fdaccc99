"""`/mcp-servers`: the MCP servers agents use, with their state and tools."""

from __future__ import annotations

from flask import render_template

from agentd.api.pages import bp, kernel


@bp.get("/mcp-servers")
def mcp_servers():
    return render_template("mcp.html", servers=kernel().mcp.servers())
