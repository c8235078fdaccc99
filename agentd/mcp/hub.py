"""The MCP servers agents use: their connections, their tools as agent tools, and calls.

The hub owns one `Connection` (agentd/mcp/client.py) per `[[mcp_servers]]` table, each
supervised on the daemon's MCP loop. Nothing here imports the SDK: with no server
configured, the loop never starts and `mcp` is never imported.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import wait
from typing import Any, Callable

from agentd.agents.tools.base import Tool, ToolContext, ToolError
from agentd.mcp.config import McpServerSpec
from agentd.mcp.loop import LoopThread
from agentd.mcp.names import tool_names

log = logging.getLogger("agentd.mcp")

MISSING_EXTRA = "the MCP SDK is not installed: pip install 'agentd[mcp]'"

Audit = Callable[[str, str, dict[str, Any]], None]


def _schema(raw: Any) -> dict[str, Any]:
    """The server's input schema as a tool's parameters (an object schema, `properties` present)."""
    schema = dict(raw) if isinstance(raw, dict) else {}
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


class McpHub:
    """Configured MCP servers, their state and their tools."""

    def __init__(self, specs: list[McpServerSpec], loop: LoopThread, audit: Audit | None = None) -> None:
        self.loop = loop
        self.audit = audit
        self._specs: dict[str, McpServerSpec] = {}
        self._conns: dict[str, Any] = {}
        self._tasks: dict[str, Any] = {}
        self._tools: dict[tuple[str, int, tuple[str, ...]], list[Tool]] = {}
        self._lock = threading.RLock()
        self._closed = False
        self.apply(specs)

    # -- configuration -----------------------------------------------------
    def apply(self, specs: list[McpServerSpec]) -> dict[str, list[str]]:
        """Make the running servers match `specs`: start new ones, stop removed ones, restart
        changed ones; unchanged servers keep their connection."""
        wanted = {s.name: s for s in specs}
        changes: dict[str, list[str]] = {"added": [], "removed": [], "restarted": []}
        with self._lock:
            if self._closed:
                return changes
            for name in list(self._specs):
                if name not in wanted:
                    self._stop(name)
                    changes["removed"].append(name)
                elif wanted[name] != self._specs[name]:
                    self._stop(name)
                    changes["restarted"].append(name)
            for name, spec in wanted.items():
                if name not in self._specs:
                    self._start(spec)
                    if name not in changes["restarted"]:
                        changes["added"].append(name)
            # Listed in the file's order.
            self._conns = {name: self._conns[name] for name in wanted if name in self._conns}
        if any(changes.values()):
            log.info("MCP servers: %s", ", ".join(f"{k} {v}" for k, v in changes.items() if v))
            if self.audit is not None:
                self.audit("mcp.reload", "mcp", changes)
        return changes

    def _start(self, spec: McpServerSpec) -> None:
        self._specs[spec.name] = spec
        try:
            from agentd.mcp.client import Connection  # the SDK loads with the first configured server
        except ImportError:
            self._conns[spec.name] = _Unavailable(spec)
            return
        conn = Connection(spec)
        self._conns[spec.name] = conn
        self._tasks[spec.name] = self.loop.submit(conn.supervise())

    def _stop(self, name: str) -> None:
        conn = self._conns.pop(name, None)
        self._specs.pop(name, None)
        self._tasks.pop(name, None)
        if conn is not None and not isinstance(conn, _Unavailable):
            self.loop.loop.call_soon_threadsafe(conn.stop)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            tasks = list(self._tasks.values())
            for name in list(self._conns):
                self._stop(name)
        for task in tasks:
            try:
                task.result(timeout=5)
            except Exception:  # noqa: BLE001 - closing: a server that will not stop is left behind
                pass

    # -- views ---------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        with self._lock:
            return list(self._specs)

    def _named(self) -> tuple[list[Any], dict[tuple[str, str], str]]:
        """The connections in the file's order, and the agent tool name of each of their tools:
        named over every server's last known tools, so a name stays while another server
        restarts, and the earlier server keeps a name two would make."""
        with self._lock:
            conns = list(self._conns.values())
        return conns, tool_names((c.spec.name, t.name) for c in conns for t in c.tools)

    def servers(self) -> list[dict[str, Any]]:
        """GET /api/mcp/servers: each server's state, protocol version and tools."""
        conns, names = self._named()
        items = []
        for conn in conns:
            status = conn.status()
            for tool in status["tools"]:
                tool["agent_tool"] = names.get((conn.spec.name, tool["name"]))
            items.append(status)
        return items

    def tools_for(self, allowed: list[str]) -> list[Tool]:
        """The agent tools of the ready servers in `allowed` (empty: every server)."""
        conns, names = self._named()
        tools: list[Tool] = []
        for conn in conns:
            if conn.state != "ready" or (allowed and conn.spec.name not in allowed):
                continue
            server = conn.spec.name
            mine: dict[str, Any] = {}
            for tool in conn.tools:
                mine.setdefault(names[(server, tool.name)], tool)  # a tool listed twice is offered once
            key = (server, id(conn.tools), tuple(mine))
            cached = self._tools.get(key)
            if cached is None:
                cached = [self._tool(conn.spec, t, name) for name, t in mine.items()]
                self._tools = {k: v for k, v in self._tools.items() if k[0] != server}
                self._tools[key] = cached
            tools.extend(cached)
        return tools

    def _tool(self, spec: McpServerSpec, mcp_tool: Any, name: str) -> Tool:
        server, remote = spec.name, mcp_tool.name

        def run(ctx: ToolContext, args: dict[str, Any]) -> str:
            return self.call(server, remote, args, ctx.cancel)

        description = (mcp_tool.description or mcp_tool.title or remote).strip()
        return Tool(name, f"[MCP server {server}] {description}",
                    _schema(mcp_tool.input_schema), run, origin=f"mcp:{server}", family="mcp")

    # -- calls ---------------------------------------------------------------
    def call(self, server: str, tool: str, args: dict[str, Any], cancel: threading.Event | None = None) -> str:
        """Call `tool` on `server` and render its result for the model; ToolError says what failed."""
        from agentd.mcp.client import ServerGone
        from agentd.mcp.results import render

        with self._lock:
            conn = self._conns.get(server)
        if conn is None:
            raise ToolError(f"MCP server '{server}' is not configured")
        if isinstance(conn, _Unavailable):
            raise ToolError(MISSING_EXTRA)
        timeout = conn.spec.timeout_secs
        future = self.loop.submit(conn.call(tool, args, timeout))
        try:
            # The call's deadline is kept on the loop; here the caller's stop is watched.
            while not future.done():
                if cancel is not None and cancel.is_set():
                    future.cancel()
                    raise ToolError(f"the call to '{tool}' on MCP server '{server}' was stopped")
                wait([future], timeout=0.1)
            result = future.result()
        except TimeoutError:
            raise ToolError(f"MCP server '{server}' did not answer '{tool}' within {timeout:g}s") from None
        except ServerGone as exc:
            raise ToolError(str(exc)) from None
        except ToolError:
            raise
        except Exception as exc:  # noqa: BLE001 - the server's refusal is the model's to read
            raise ToolError(f"MCP server '{server}' refused '{tool}': {exc}") from None
        return render(result)

    def restart(self, name: str) -> None:
        with self._lock:
            spec = self._specs.get(name)
            if spec is None:
                return
            self._stop(name)
            self._start(spec)


class _Unavailable:
    """A configured server while the `mcp` extra is not installed."""

    state = "failed"
    tools: list[Any] = []

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec

    def status(self) -> dict[str, Any]:
        return {"name": self.spec.name, "transport": self.spec.transport, "state": "failed",
                "protocol_version": None, "server_info": None, "restarts": 0, "tools": [],
                "last_error": MISSING_EXTRA}
