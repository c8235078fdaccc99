"""agentd's agents as MCP tools at `/mcp`: list them, message one (its run's progress is
sent as MCP progress notifications), recall one's memory.

The SDK's `MCPServer` defines the tools and its `StreamableHTTPSessionManager` speaks
Streamable HTTP (every protocol revision the SDK negotiates). That transport is an ASGI
app; the daemon serves WSGI, so `McpEndpoint` runs the ASGI app on the daemon's MCP loop
through a2wsgi's bridge and the Flask route hands it each request after the usual guard
and auth (agentd/api/routes_mcp.py). The transport is stateless: each POST is answered
on its own (a message's progress streams on its response), so any daemon of a cluster
can answer any request. Importing this module imports the SDK.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from agentd import __version__
from agentd.principals import ADMIN, Principal, run_fields
from agentd.errors import AgentdError
from agentd.mcp.endpoint import Running
from agentd.server.task import DISCONNECTED_KEY

AgentRef = Annotated[str, Field(description="The agent's id or name (as list_agents gives them)")]

# Progress text is cut so a long answer streams as a few notifications, not one per token.
PROGRESS_TEXT_LIMIT = 2000


def build_server(agents: Any, runs: Any, memory: Any, keys: Any, running: Running) -> MCPServer:
    """The MCP server over the agent manager, the run path and semantic memory; each call
    acts as the request's API key (`keys`: agentd/apikeys.py), as the JSON API does. A
    message's run stops when its client leaves or cancels the request (`running`)."""
    server = MCPServer("agentd", version=__version__,
                       instructions="Agents hosted by this agentd daemon: list them, send one a message, "
                                    "or recall what one remembers.")

    def who(ctx: Context) -> Principal:
        # Set by the daemon's route from the request's key, never by the client.
        key_id = (ctx.headers or {}).get("x-agentd-key-id", "")
        if not key_id:
            return ADMIN
        found = keys.principal(key_id)
        if found is None:
            raise ToolError("the API key of this request is no longer valid")
        return found

    def find(ref: str, caller: Principal, scope: str) -> Any:
        try:
            caller.require(scope)
            handle = agents.find(ref)
            if handle is None or not caller.sees(handle):
                raise ToolError(f"no agent with id or name {ref!r}")
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        return handle

    @server.tool(name="list_agents", description="List the agents of this daemon: id, name, state, mode, "
                                                 "model and description.")
    def list_agents(ctx: Context) -> str:
        items = []
        for handle in who(ctx).visible(agents.handles()):
            items.append({"id": handle.id, "name": handle.name, "state": handle.state, "mode": handle.mode,
                          "model": f"{handle.provider}/{handle.model}",
                          "description": handle.manifest.data["description"]})
        return json.dumps(items)

    @server.tool(name="message_agent", description="Send a message to an agent (by id or name) and return its "
                                                   "reply; the run's progress arrives as progress notifications.")
    async def message_agent(agent: AgentRef, message: Annotated[str, Field(description="The message to send")],
                            ctx: Context) -> str:
        from agentd.agents.run_request import RunRequest

        if not message.strip():
            raise ToolError("message is empty")  # (as the API refuses it)
        caller = who(ctx)
        handle = find(agent, caller, "message")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        request = RunRequest(handle, message, emit=lambda e: loop.call_soon_threadsafe(events.put_nowait, e),
                             origin="mcp", **run_fields(caller, handle, own_session=True))
        # The HTTP request the daemon's server is answering (a2wsgi hands its environ on).
        environ = ctx.request_context.request.scope.get("wsgi_environ") or {}

        def run() -> str:
            return runs.start(request).result(environ.get(DISCONNECTED_KEY)).response

        running.add(environ, ctx.request_id, request.cancel)
        done = asyncio.ensure_future(asyncio.to_thread(run))
        step = 0
        try:
            while True:
                getter = asyncio.ensure_future(events.get())
                await asyncio.wait([done, getter], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    break
                note = _progress(getter.result())
                if note:
                    step += 1
                    await ctx.report_progress(step, None, note)
            return await done
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        finally:
            running.remove(environ, ctx.request_id, request.cancel)
            if not done.done():
                request.cancel.set()  # the client went away: the run stops too

    @server.tool(name="recall_memory", description="Fragments of an agent's memory nearest in meaning to a query.")
    def recall_memory(agent: AgentRef, query: Annotated[str, Field(description="What to recall")], ctx: Context,
                      limit: Annotated[int, Field(ge=1, le=100, description="How many fragments")] = 5) -> str:
        caller = who(ctx)
        handle = find(agent, caller, "read")
        try:
            return json.dumps(memory.recall(handle.id, query, limit, owner=caller.label))
        except AgentdError as exc:
            raise ToolError(exc.message) from None

    return server


def _progress(event: Any) -> str:
    """A progress message for a run event ("" for events a client need not see)."""
    kind, data = event.type, event.data
    if kind == "text_delta":
        return str(data.get("content") or "")[:PROGRESS_TEXT_LIMIT]
    if kind == "phase":
        detail = data.get("detail")
        return f"{data.get('phase')}{': ' + str(detail) if detail else ''}"
    if kind == "tool_result":
        return f"tool {data.get('tool')} {'failed' if data.get('is_error') else 'done'}"
    return ""
