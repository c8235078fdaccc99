"""One MCP server as agentd's client sees it, on the daemon's MCP loop (agentd/mcp/loop.py).

`Connection.supervise` keeps the server connected with the SDK's `Client` (stdio or
Streamable HTTP; the SDK negotiates the protocol revision): it connects, lists the tools,
then probes the server while it is idle. A failed connect, a probe or a call that finds the
server gone, or a server that stops answering ends the connection; the next attempt waits
a backoff delay (agentd/retry.py). Importing this module imports the `mcp` SDK.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from typing import Any

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from agentd.mcp.config import McpServerSpec
from agentd.retry import Backoff

log = logging.getLogger("agentd.mcp")

PROBE_INTERVAL = 5.0
# A command server starts its interpreter and libraries first: the handshake may take longer
# than a call is given.
STARTUP_SECS = 30.0
# A server's stderr goes to the daemon's log only as far as the log level lets it.
_DEVNULL = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process


class _NoTraceback(logging.Filter):
    """The SDK logs each line a server wrote that is not JSON-RPC with a traceback; the
    connection's state names the problem, the log keeps one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return True


logging.getLogger("mcp.client.stdio").addFilter(_NoTraceback())


class ServerGone(Exception):
    """The connection to the server ended while a call was using it."""


def _message(exc: BaseException) -> str:
    """A one-line reason, unwrapping the task groups the SDK raises through."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, ServerGone):
        return text
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return text or "timed out"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Connection:
    """The live state of one configured server."""

    def __init__(self, spec: McpServerSpec, backoff: Backoff | None = None) -> None:
        self.spec = spec
        self.state = "starting"
        self.protocol_version: str | None = None
        self.server_info: dict[str, Any] | None = None
        self.last_error: str | None = None
        self.tools: list[Any] = []
        self.restarts = 0
        self.connected_at: float | None = None
        self.backoff = backoff or Backoff(initial=0.5, maximum=30.0)
        self._client: Any = None
        self._broken: asyncio.Event | None = None
        # Made here (an Event binds its loop on first use), so a stop asked before the
        # supervisor runs is not lost.
        self._stop = asyncio.Event()
        self._garbage: str | None = None  # the last line the server wrote that was not JSON-RPC
        self._handshake: Any = None  # the handshake's deadline while it runs
        self._http_status: int | None = None  # of the server's last HTTP answer

    # -- the connection ----------------------------------------------------
    def _transport(self) -> Any:
        """The SDK transport: the command over stdio (its stderr sent away), or Streamable HTTP
        with the configured headers."""
        spec = self.spec
        if spec.command:
            env = {name: os.environ[name] for name in spec.env if name in os.environ}
            return stdio_client(StdioServerParameters(command=spec.command, args=list(spec.args), env=env,
                                                      cwd=spec.cwd or None), errlog=_DEVNULL)
        headers = {header: os.environ[var] for header, var in spec.headers_env if var in os.environ}
        timeout = httpx2.Timeout(spec.timeout_secs, read=max(spec.timeout_secs, 300.0))
        http = create_mcp_http_client(headers=headers, timeout=timeout)
        http.event_hooks["response"].append(self._answered)
        return streamable_http_client(spec.url, http_client=http)

    async def _answered(self, response: Any) -> None:
        self._http_status = response.status_code

    def _reason(self, exc: BaseException) -> str:
        """`_message`, with the HTTP status the SDK leaves out of its error for a refusal (401, 403, 500)."""
        text = _message(exc)
        if text.endswith("Server returned an error response") and (self._http_status or 0) >= 400:
            return f"{text} (HTTP {self._http_status})"
        return text

    async def supervise(self) -> None:
        """Connect, serve calls, reconnect after a failure; until `stop`."""
        while not self._stop.is_set():
            self.state = "starting"
            try:
                await self._connected()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - whatever the server did, the daemon goes on
                self.last_error = self._reason(exc)
                log.warning("MCP server %s: %s", self.spec.name, self.last_error)
            finally:
                self._client = None
                self.connected_at = None
            if self._stop.is_set():
                break
            self.state = "failed"
            self.restarts += 1
            try:
                await asyncio.wait_for(self._stop.wait(), self.backoff.next_delay())
            except asyncio.TimeoutError:
                pass
        self.state = "stopped"

    async def _connected(self) -> None:
        spec = self.spec
        startup = max(spec.timeout_secs, STARTUP_SECS)
        # The SDK's own deadline covers the handshake too: a server gets `startup` to answer
        # it; calls and probes keep their own, shorter deadlines (asyncio.timeout below).
        client = Client(self._transport(), read_timeout_seconds=startup, message_handler=self._incoming)
        self._broken = asyncio.Event()
        self._garbage = None
        try:
            async with asyncio.timeout(startup) as self._handshake:
                await client.__aenter__()
        except TimeoutError:
            if self._garbage:
                raise ServerGone(f"not an MCP server: it wrote {self._garbage}") from None
            raise ServerGone(f"no answer to the MCP handshake within {startup:g}s") from None
        finally:
            self._handshake = None
        failure: BaseException | None = None
        try:
            async with asyncio.timeout(startup):
                tools = await self._list_tools(client) if _offers_tools(client) else []
            self.tools = tools
            self.protocol_version = client.protocol_version
            info = client.server_info
            self.server_info = {"name": info.name, "version": info.version} if info is not None else None
            self._client = client
            self.state = "ready"  # last_error stays: it says why the server was restarted
            self.connected_at = time.monotonic()
            self.backoff.reset()
            log.info("MCP server %s ready (%s, %d tools)", spec.name, self.protocol_version, len(tools))
            await self._watch(client)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._client = None
            try:
                async with asyncio.timeout(5):
                    await client.__aexit__(type(failure) if failure else None, failure,
                                           failure.__traceback__ if failure else None)
            except BaseException as closing:  # noqa: BLE001 - a dead server cannot be closed politely
                # A transport that fails (an HTTP server gone) cancels the task that opened the
                # client; told of that cancellation, closing raises the transport's error instead,
                # which makes it a failure to restart after rather than the supervisor's end.
                if isinstance(failure, asyncio.CancelledError) and not isinstance(closing, asyncio.CancelledError):
                    raise closing from None

    async def _incoming(self, message: Any) -> None:
        """Messages the session did not route; a line that is not JSON-RPC arrives as an exception."""
        if isinstance(message, Exception):
            text = str(message)
            found = re.search(r"input_value=('.*?'|\".*?\")", text)
            self._garbage = (found.group(1) if found else _message(message))[:200]
            if self._handshake is not None:  # no need to wait out the handshake's deadline
                self._handshake.reschedule(asyncio.get_running_loop().time())

    async def _list_tools(self, client: Any) -> list[Any]:
        tools: list[Any] = []
        cursor = None
        while True:
            from mcp.types import PaginatedRequestParams

            page = await client.session.list_tools(
                params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def _watch(self, client: Any) -> None:
        """Probe while idle; return when the server stops answering, a call found it gone, or stop."""
        assert self._broken is not None
        while not self._stop.is_set() and not self._broken.is_set():
            waiters = [asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(self._broken.wait())]
            done, pending = await asyncio.wait(waiters, timeout=PROBE_INTERVAL, return_when=asyncio.FIRST_COMPLETED)
            for waiter in pending:
                waiter.cancel()
            if done:
                break
            limit = min(self.spec.timeout_secs, 10.0)
            try:
                await self._probe(client, limit)
            except TimeoutError:
                raise ServerGone(f"the server stopped answering (no answer to a probe within {limit:g}s)") from None
        if self._broken.is_set() and not self._stop.is_set():
            raise ServerGone(self.last_error or "the server stopped answering")

    async def _probe(self, client: Any, timeout: float) -> None:
        """Whether the server still answers: a tools listing (the current protocol has no
        ping), which also picks up tools the server added or removed. An error answer is an
        answer; a timeout or a closed transport raises."""
        from mcp import MCPError

        try:
            async with asyncio.timeout(timeout):
                tools = await self._list_tools(client)
        except MCPError as exc:
            if _transport_failure(exc):
                raise
            return
        if tools != self.tools:
            self.tools = tools

    def stop(self) -> None:
        self._stop.set()

    # -- calls ---------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any], timeout: float) -> Any:
        """The server's CallToolResult; TimeoutError after `timeout` seconds, ServerGone when
        the server is not connected or the connection broke during the call."""
        client = self._client
        if client is None or self.state != "ready":
            raise ServerGone(f"MCP server '{self.spec.name}' is {self.state}"
                             f"{': ' + self.last_error if self.last_error else ''}")
        try:
            async with asyncio.timeout(timeout):
                return await client.call_tool(tool, arguments)
        except TimeoutError:
            self._check_soon(client)
            raise
        except Exception as exc:
            if self._client is not client or _transport_failure(exc):
                self.last_error = self._reason(exc)
                self._mark_broken()
                raise ServerGone(f"MCP server '{self.spec.name}' failed: {self.last_error}") from None
            raise

    def _mark_broken(self) -> None:
        if self._broken is not None:
            self._broken.set()

    def _check_soon(self, client: Any) -> None:
        """After a call ran out of time: restart the server if it no longer answers at all."""
        async def check() -> None:
            try:
                await self._probe(client, min(self.spec.timeout_secs, 5.0))
            except Exception as exc:  # noqa: BLE001
                if self._client is client:
                    self.last_error = f"the server stopped answering (after a call timed out: {_message(exc)})"
                    self._mark_broken()

        asyncio.ensure_future(check())

    def status(self) -> dict[str, Any]:
        return {"name": self.spec.name, "transport": self.spec.transport, "state": self.state,
                "protocol_version": self.protocol_version, "server_info": self.server_info,
                "last_error": self.last_error, "restarts": self.restarts,
                "tools": [{"name": t.name, "description": t.description or "",
                           "input_schema": t.input_schema} for t in self.tools] if self.state == "ready" else []}


def _transport_failure(exc: BaseException) -> bool:
    """Whether `exc` says the connection is gone: not that the server answered with an error,
    nor that the SDK refused what it answered (RuntimeError for structured content that does
    not match the tool's output schema, ValidationError for a result the protocol does not allow)."""
    from mcp import MCPError
    from mcp_types.jsonrpc import CONNECTION_CLOSED
    from pydantic import ValidationError

    if isinstance(exc, MCPError):
        return exc.code == CONNECTION_CLOSED and exc.message == "Connection closed"
    return not isinstance(exc, (RuntimeError, ValidationError))


def _offers_tools(client: Any) -> bool:
    """Whether the server declared the tools capability (a server of prompts or resources
    only need not answer tools/list)."""
    return client.server_capabilities.tools is not None



async def _check_one(spec: McpServerSpec) -> tuple[bool, str]:
    conn = Connection(spec)
    startup = max(spec.timeout_secs, STARTUP_SECS)
    client = Client(conn._transport(), read_timeout_seconds=startup, message_handler=conn._incoming)
    try:
        async with asyncio.timeout(startup) as conn._handshake:
            async with client:
                tools = await conn._list_tools(client) if _offers_tools(client) else []
                return True, f"{spec.name}: started ({client.protocol_version}, {len(tools)} tools)"
    except TimeoutError:
        if conn._garbage:
            return False, f"{spec.name}: not an MCP server: it wrote {conn._garbage}"
        return False, f"{spec.name}: no answer within {startup:g}s"
    except BaseException as exc:  # noqa: BLE001 - a check reports, it does not raise
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return False, f"{spec.name}: {conn._reason(exc)}"


def check_servers(specs: list[McpServerSpec]) -> list[tuple[bool, str]]:
    """Start each server once, list its tools and stop it (`agentd doctor`)."""
    async def run_all() -> list[tuple[bool, str]]:
        return list(await asyncio.gather(*(_check_one(s) for s in specs)))

    return asyncio.run(run_all())
