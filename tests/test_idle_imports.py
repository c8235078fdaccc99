"""Idle memory: a started daemon has not loaded what only some requests need.

requests with the LLM drivers (~6 MB), flask-sock with simple-websocket and asyncio
(~2.6 MB), pynacl (~1.1 MB) and apispec load on the first request that needs them, so a
daemon nobody has talked to stays under the 50 MB idle bar. The daemon runs with
`python -X importtime`, which writes every import to its log: the test reads what was
imported before and after each first use, and checks that first use works.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import websocket
from nacl.signing import SigningKey

from agentd.agents.signing import sign_manifest
from conftest import LLM_ENV, llm_config
from support import STARTED, Daemon, agentd_env, make_home

# Top-level packages (and agentd modules) that serving loads on first use only.
LAZY = {"requests", "urllib3", "charset_normalizer", "flask_sock", "simple_websocket", "wsproto",
        "asyncio", "nacl", "apispec", "agentd.llm.drivers",
        # The MCP SDK and what it brings: only with [[mcp_servers]] configured or /mcp called.
        "mcp", "mcp_types", "anyio", "httpx2", "a2wsgi", "starlette", "pydantic",
        "agentd.mcp.client", "agentd.mcp.server",
        # the browser_* and docker_exec tools' drivers: loaded by the first call of such a tool
        "selenium", "docker"}


class ImportTimeDaemon(Daemon):
    """The real daemon, started with `-X importtime` (each import is a line of its log)."""

    def start(self, wait: bool = True) -> "ImportTimeDaemon":
        STARTED.append(self)  # checked for tracebacks and a clean exit like every daemon
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "agentd", "start"],
                                         env=agentd_env(self.home, self.port, **self.env_extra),
                                         stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_healthy()
        return self

    def imported(self) -> set[str]:
        """Every module the daemon has imported so far (top-level names and agentd modules)."""
        names = set()
        for match in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", self.log(), re.M):
            name = match.group(1)
            names.add(name.split(".")[0])
            if name.startswith("agentd."):
                names.add(name)
        return names


def test_idle_daemon_has_not_loaded_first_use_packages_and_each_first_use_works(tmp_path: Path, fake_llm) -> None:
    d = ImportTimeDaemon(make_home(tmp_path, llm_config(fake_llm)), env_extra=LLM_ENV).start()
    try:
        idle = d.imported()
        assert "agentd.kernel" in idle and "flask" in idle, "BUG: the importtime log is not being read"
        assert not LAZY & idle, f"BUG: loaded at start though only some requests need them: {sorted(LAZY & idle)}"
        # A status page, the agent list and the dashboard need none of them either.
        for path in ("/api/status", "/api/agents", "/api/health/detail", "/", "/api/mcp/servers"):
            assert d.get(path).status_code == 200, path
        assert not LAZY & d.imported(), f"BUG: loaded by a plain request: {sorted(LAZY & d.imported())}"

        # First WebSocket: flask-sock loads and the socket works.
        ws = websocket.create_connection(d.url.replace("http", "ws") + "/api/_ws/echo", timeout=10)
        try:
            ws.send("ping-1")
            assert ws.recv() == "ping-1"
        finally:
            ws.close()
        assert {"flask_sock", "simple_websocket"} <= d.imported()
        # A plain GET on a WebSocket route is still refused as before (werkzeug's websocket rule).
        assert d.get("/api/_ws/echo").status_code == 400

        # First signed manifest: pynacl loads, a good signature passes and a forged one fails.
        key = SigningKey.generate()
        text = 'name = "signed-idle"\nprofile = "minimal"\n'
        created = d.post("/api/agents", json={"manifest_toml": text, "signed_manifest": sign_manifest(text, key)})
        assert created.status_code == 201, created.text
        forged = json.loads(sign_manifest('name = "forged-idle"\n', key))
        forged["signature"][0] ^= 1
        refused = d.post("/api/agents", json={"signed_manifest": json.dumps(forged)})
        assert (refused.status_code, refused.json()["error"]) == (
            403, "manifest signature verification failed: bad signature")
        assert "nacl" in d.imported()

        # First OpenAPI document: apispec loads and the document lists the routes.
        doc = d.get("/api/openapi.json")
        assert doc.status_code == 200 and "/api/agents/{agent_id}/message" in doc.json()["paths"]
        assert "apispec" in d.imported()

        # First model call: the drivers and requests load and the message is answered.
        assert "requests" not in d.imported()
        answer = d.post(f"/api/agents/{created.json()['agent_id']}/message", json={"message": "hello there"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["response"]
        assert {"requests", "agentd.llm.drivers"} <= d.imported()
        health = d.get("/api/health/detail").json()
        assert health["model_calls_in_flight"] == 0

        # Traces are not configured here: OpenTelemetry never loads, whatever was served (the
        # MCP SDK below brings its own, so this is asked before it).
        assert "opentelemetry" not in d.imported()

        # First MCP request: the SDK loads and answers the handshake.
        assert "mcp" not in d.imported()
        hello = d.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                     "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                                "clientInfo": {"name": "idle-test", "version": "1"}}},
                       headers={"Accept": "application/json, text/event-stream"})
        assert hello.status_code == 200, hello.text
        assert '"serverInfo":{"name":"agentd"' in hello.text.replace(" ", "")
        assert {"mcp", "agentd.mcp.server"} <= d.imported()
    finally:
        d.stop()


def test_model_calls_in_flight_is_zero_before_the_drivers_load(tmp_path: Path) -> None:
    d = ImportTimeDaemon(make_home(tmp_path)).start()
    try:
        body = d.get("/api/health/detail").json()
        assert body["model_calls_in_flight"] == 0
        assert "agentd.llm.drivers" not in d.imported()
    finally:
        d.stop()


def test_requests_is_not_needed_to_reject_a_bad_provider_url_twice(tmp_path: Path) -> None:
    """validate_url imports requests on use: the first and the second call behave the same."""
    d = Daemon(make_home(tmp_path)).start()
    try:
        for _ in range(2):
            r = d.put("/api/providers/openai/url", json={"base_url": "http://exa mple.com"})
            assert r.status_code == 400
            assert r.json()["error"] == ("base_url must be an http:// or https:// URL with a host, "
                                         "got 'http://exa mple.com'")
        ok = d.put("/api/providers/openai/url", json={"base_url": "http://127.0.0.1:9/v1/"})
        assert ok.status_code == 200, ok.text
    finally:
        d.stop()


def test_nothing_below_the_routes_imports_the_server_layer() -> None:
    # The server layer (agentd/server/) sits beside the routes: the kernel and the layers under
    # it load none of it, and the model layer never writes to a client.
    below = ["agentd.kernel", "agentd.agents", "agentd.llm", "agentd.memory", "agentd.channels", "agentd.workflows"]
    package = Path(__file__).resolve().parents[1] / "agentd"
    modules = [str(p.relative_to(package).with_suffix("")).replace("/", ".") for p in package.rglob("*.py")]
    wanted = sorted(f"agentd.{m}".removesuffix(".__init__") for m in modules
                    if any(f"agentd.{m}".startswith(b) for b in below))
    assert "agentd.llm.drivers.reading" in wanted and "agentd.channels.bases.webhook" in wanted
    script = ("import importlib, json, sys\n"
              f"for name in {wanted!r}:\n"
              "    importlib.import_module(name)\n"
              "print(json.dumps(sorted(m for m in sys.modules if m == 'agentd.server' or m.startswith('agentd.server.'))))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=package.parent, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], "BUG: a layer below the routes imports the server layer"
