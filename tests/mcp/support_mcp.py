"""Shared pieces of the MCP tests: the test servers' commands and a Streamable HTTP server."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support import free_port

HERE = Path(__file__).parent
TOOLBOX = HERE / "toolbox_server.py"
GARBAGE = HERE / "garbage_server.py"
LOWLEVEL = HERE / "lowlevel_server.py"


def stdio_server(name: str, script: Path | None = None, args: list[str] | None = None, **keys: Any) -> str:
    """A `[[mcp_servers]]` table for a command speaking stdio (this Python running `script`)."""
    argv = [str(script)] if script is not None else []
    text = f'\n[[mcp_servers]]\nname = "{name}"\ncommand = {json.dumps(sys.executable)}\n' \
           f'args = {json.dumps(argv + (args or []))}\n'
    return text + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())


def url_server(name: str, url: str, **keys: Any) -> str:
    text = f'\n[[mcp_servers]]\nname = "{name}"\nurl = "{url}"\n'
    for key, value in keys.items():
        if isinstance(value, dict):
            text += f"{key} = {{" + ", ".join(f'{k} = "{v}"' for k, v in value.items()) + "}\n"
        else:
            text += f"{key} = {json.dumps(value)}\n"
    return text


class HttpToolbox:
    """The toolbox MCP server over Streamable HTTP (the SDK's MCPServer with uvicorn)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "HttpToolbox":
        self.proc = subprocess.Popen([sys.executable, str(TOOLBOX), "--http", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the HTTP MCP server did not start")

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


def servers(d: Any) -> dict[str, dict[str, Any]]:
    r = d.get("/api/mcp/servers")
    assert r.status_code == 200, r.text
    return {s["name"]: s for s in r.json()}


def wait_state(d: Any, name: str, state: str, timeout: float = 20.0, **more: Any) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = servers(d).get(name, {})
        if last.get("state") == state and all(more_ok(last, k, v) for k, v in more.items()):
            return last
        time.sleep(0.1)
    raise AssertionError(f"MCP server {name} never reached {state} {more}: {last}")


def more_ok(item: dict[str, Any], key: str, value: Any) -> bool:
    return value(item[key]) if callable(value) else item[key] == value
