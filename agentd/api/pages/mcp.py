"""`/mcp-servers`: the MCP servers agents use, with their state and tools."""

from __future__ import annotations

from flask import render_template

from agentd.api.pages import bp, form_post, kernel
from agentd.api.pages.notes import see_other_with
from agentd.errors import ConfigError


@bp.get("/mcp-servers")
def mcp_servers():
    return render_template("mcp.html", servers=kernel().mcp.servers())


@form_post("/mcp-servers/reload", "pages.mcp_servers")
def mcp_reload():
    """Re-read [[mcp_servers]] from config.toml as POST /api/mcp/reload does."""
    try:
        changes = kernel().mcp_watch.reload_now()
    except ConfigError as exc:
        return see_other_with("pages.mcp_servers", [f"config.toml not applied: {exc.message}"], ok=False)
    said = [f"{what}: {', '.join(names)}" for what, names in changes.items() if names]
    return see_other_with("pages.mcp_servers", ["MCP servers reloaded" + ("; " + "; ".join(said) if said else
                                                                          ": nothing changed")])
