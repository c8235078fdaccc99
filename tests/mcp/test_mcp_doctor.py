"""`agentd doctor` starts each configured MCP server once and says how it went."""

from __future__ import annotations

import json
from pathlib import Path

from support import free_port, make_home, run_cli
from tests.mcp.support_mcp import GARBAGE, LOWLEVEL, stdio_server


def test_doctor_checks_each_mcp_server_starts(tmp_path: Path) -> None:
    extra = (stdio_server("time", args=["-m", "mcp_server_time", "--local-timezone", "UTC"])
             + stdio_server("prompts", LOWLEVEL, args=["prompts"])
             + stdio_server("junk", GARBAGE, timeout_secs=1))
    home = make_home(tmp_path, extra)
    r = run_cli(home, "doctor", "--json", port=free_port(), env_extra={"AGENTD_DATABASE_URL": ""})
    checks = {c["check"]: c for c in json.loads(r.stdout)}
    assert r.returncode == 1
    assert checks["mcp_servers"]["status"] == "fail"
    assert checks["mcp_servers"]["message"] == (
        "time: started (2026-07-28, 2 tools); prompts: started (2026-07-28, 0 tools); "
        "junk: not an MCP server: it wrote \"HTTP/1.1 418 I'm a teapot, not JSON-RPC\"")
    # Every server started: the check passes.
    (home / "config.toml").write_text(stdio_server("time", args=["-m", "mcp_server_time", "--local-timezone", "UTC"]))
    r = run_cli(home, "doctor", "--json", port=free_port(), env_extra={"AGENTD_DATABASE_URL": ""})
    assert {c["check"]: c for c in json.loads(r.stdout)}["mcp_servers"] == {
        "check": "mcp_servers", "status": "ok", "message": "time: started (2026-07-28, 2 tools)"}
