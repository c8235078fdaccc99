"""The Model Context Protocol, both ways: agents use the tools of the MCP servers named in
config.toml (`McpHub`), and MCP clients reach agentd's agents at `/mcp` (server.py).

Only config.py, names.py, hub.py and watch.py load with the daemon; every module that
imports the `mcp` SDK (the optional `mcp` extra) loads when a server is configured or
`/mcp` is first called.
"""
