"""Built-in tools called directly (the loop and daemon paths are in tests/agents/test_agents.py)."""

from __future__ import annotations

import http.server
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from agentd.agents.tools import ToolContext, ToolError, all_tools, get_tool, validate_args
from agentd.config import ToolsConfig


class Ops:
    """A real in-memory implementation of the AgentOps protocol."""

    def __init__(self) -> None:
        self.kv: dict[tuple[str, str], Any] = {}

    def kv_get(self, agent_id: str, key: str) -> tuple[bool, Any]:
        return ((agent_id, key) in self.kv, self.kv.get((agent_id, key)))

    def kv_set(self, agent_id: str, key: str, value: Any) -> None:
        self.kv[(agent_id, key)] = value

    def list_agents(self) -> list[dict[str, Any]]:
        return [{"id": "a1", "name": "alpha", "description": "writes poems", "tags": ["art"]}]

    def find_agents(self, query: str) -> list[dict[str, Any]]:
        return [a for a in self.list_agents() if query in a["description"]]

    def send_to_agent(self, caller_id: str, target: str, message: str) -> str:
        if target != "alpha":
            raise ToolError(f"no agent with id or name {target!r}")
        return f"alpha got: {message}"

    def spawn_agent(self, caller_id: str, manifest_toml: str) -> dict[str, Any]:
        return {"agent_id": "new", "name": "child"}

    def kill_agent(self, caller_id: str, target: str) -> None:
        pass


def make_ctx(tmp_path: Path, **caps: Any) -> ToolContext:
    capabilities = {"shell": [], "network": [], "agent_spawn": False, **caps}
    cfg = ToolsConfig(shell_timeout_secs=5, shell_max_output_bytes=1000, fetch_max_bytes=2048)
    return ToolContext("agent-1", tmp_path / "ws", capabilities, cfg, ops=Ops(),
                       cancel=threading.Event())


def run(ctx: ToolContext, name: str, **args: Any) -> str:
    tool = get_tool(name)
    validate_args(tool, args)
    return tool.run(ctx, args)


@pytest.fixture()
def ctx(tmp_path: Path) -> ToolContext:
    return make_ctx(tmp_path)


def test_registry_flags() -> None:
    tools = {t.name: t for t in all_tools()}
    assert {"file_read", "file_write", "file_list", "create_directory", "apply_patch", "shell_exec", "web_fetch",
            "web_search", "memory_store", "memory_recall", "agent_send", "agent_spawn", "agent_list",
            "agent_kill", "agent_find", "system_time"} <= set(tools)
    assert tools["shell_exec"].capability == "shell" and tools["agent_spawn"].capability == "agent_spawn"
    assert tools["file_read"].read_only and not tools["file_write"].read_only
    assert all(t.parameters["type"] == "object" for t in tools.values())


def test_validate_args_messages() -> None:
    write = get_tool("file_write")
    with pytest.raises(ToolError, match="missing required argument.*content"):
        validate_args(write, {"path": "a"})
    with pytest.raises(ToolError, match="must be of type string"):
        validate_args(write, {"path": 3, "content": "x"})
    with pytest.raises(ToolError, match="has no argument 'mode'"):
        validate_args(write, {"path": "a", "content": "x", "mode": "w"})
    with pytest.raises(ToolError, match="type integer"):
        validate_args(get_tool("shell_exec"), {"command": "ls", "timeout_seconds": True})


def test_file_round_trip(ctx) -> None:
    assert run(ctx, "file_write", path="d/notes.txt", content="héllo") == "wrote 6 bytes to d/notes.txt"
    assert run(ctx, "file_read", path="d/notes.txt") == "héllo"
    assert run(ctx, "create_directory", path="d/sub") == "created directory d/sub"
    assert run(ctx, "file_list", path="d") == "notes.txt\nsub/"
    assert run(ctx, "file_list") == "d/"
    with pytest.raises(ToolError, match="no such file"):
        run(ctx, "file_read", path="missing.txt")
    with pytest.raises(ToolError, match="directory"):
        run(ctx, "file_read", path="d")


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "a/../../x", "link/secret"])
def test_paths_cannot_escape(ctx, tmp_path, path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s3cret")
    ctx.workspace.mkdir(parents=True)
    os.symlink(outside, ctx.workspace / "link")
    for name, args in (("file_read", {"path": path}), ("file_write", {"path": path, "content": "x"})):
        with pytest.raises(ToolError, match="escapes the agent workspace"):
            run(ctx, name, **args)
    assert (outside / "secret").read_text() == "s3cret"


def test_apply_patch(ctx) -> None:
    run(ctx, "file_write", path="a.py", content="one\ntwo\nthree\n")
    run(ctx, "file_write", path="old.txt", content="bye\n")
    patch = ("*** Begin Patch\n*** Update File: a.py\n@@\n one\n-two\n+TWO\n three\n"
             "*** Add File: new/b.txt\n+fresh\n+file\n*** Delete File: old.txt\n*** End Patch")
    assert run(ctx, "apply_patch", patch=patch) == "updated a.py\nadded new/b.txt\ndeleted old.txt"
    assert run(ctx, "file_read", path="a.py") == "one\nTWO\nthree\n"
    assert run(ctx, "file_read", path="new/b.txt") == "fresh\nfile\n"
    assert not (ctx.workspace / "old.txt").exists()
    bad = "*** Begin Patch\n*** Update File: a.py\n@@\n-nope\n+x\n*** Add File: c.txt\n+c\n*** End Patch"
    with pytest.raises(ToolError, match="does not match"):
        run(ctx, "apply_patch", patch=bad)
    assert not (ctx.workspace / "c.txt").exists()  # nothing applied when one hunk fails
    with pytest.raises(ToolError, match="Begin Patch"):
        run(ctx, "apply_patch", patch="--- a\n+++ b")
    with pytest.raises(ToolError, match="escapes"):
        run(ctx, "apply_patch", patch="*** Begin Patch\n*** Add File: ../x\n+x\n*** End Patch")


def test_shell_policy(tmp_path) -> None:
    ctx = make_ctx(tmp_path, shell=["echo", "sleep", "python3", "sudo"])
    assert run(ctx, "shell_exec", command="echo 'hi there'") == "exit code 0\nhi there\n"
    with pytest.raises(ToolError, match="not in this agent's shell allowlist"):
        run(ctx, "shell_exec", command="ls")
    for command in ("echo hi; ls", "echo hi | cat", "echo $(id)", "echo hi > f", "echo `id`", "echo a && ls"):
        with pytest.raises(ToolError, match="metacharacter"):
            run(ctx, "shell_exec", command=command)
    with pytest.raises(ToolError, match="denied"):
        run(ctx, "shell_exec", command="sudo id")
    wide = make_ctx(tmp_path, shell=["*"])
    for command in ("/usr/bin/sudo id", "env FOO=1 sudo id", "nice -n 5 dd if=/dev/zero"):
        with pytest.raises(ToolError, match="denied by the daemon's shell policy"):
            run(wide, "shell_exec", command=command)
    with pytest.raises(ToolError, match="greater than 0"):
        run(ctx, "shell_exec", command="echo hi", timeout_seconds=-1)
    with pytest.raises(ToolError, match="timed out after 1s"):
        run(ctx, "shell_exec", command="sleep 30", timeout_seconds=1)
    out = run(ctx, "shell_exec", command="python3 -c 'print(\"x\" * 200000)'")
    assert out.startswith("exit code 0\n") and "[output truncated at 1000 bytes" in out and len(out) < 1200
    assert run(ctx, "shell_exec", command="python3 -c 'raise SystemExit(3)'").startswith("exit code 3")


def test_shell_kills_the_process_group(tmp_path) -> None:
    ctx = make_ctx(tmp_path, shell=["*"])
    marker = tmp_path / "ws" / "child.pid"
    run(ctx, "file_write", path="spawn.py", content=(
        "import subprocess, time\np = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(marker)!r}, 'w').write(str(p.pid))\ntime.sleep(60)\n"))
    with pytest.raises(ToolError, match="timed out"):
        run(ctx, "shell_exec", command="python3 spawn.py", timeout_seconds=1)
    _assert_gone(int(marker.read_text()))
    # A background child left by a command that exits normally is ended too.
    run(ctx, "file_write", path="bg.py", content=(
        "import subprocess\np = subprocess.Popen(['sleep', '60'], stdout=subprocess.DEVNULL)\n"
        f"open({str(marker)!r}, 'w').write(str(p.pid))\n"))
    assert run(ctx, "shell_exec", command="python3 bg.py") == "exit code 0\n"
    _assert_gone(int(marker.read_text()))


def _assert_gone(pid: int) -> None:
    """The process is dead: gone, or a zombie waiting for init to reap it (which can be slow)."""
    for _ in range(250):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        threading.Event().wait(0.02)
    raise AssertionError(f"process {pid} survived")


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/redirect"):
            self.send_response(302)
            target = "headers" if self.path.startswith("/redirect-headers") else "page"
            self.send_header("Location", f"http://localhost:{self.server.server_port}/{target}")
            self.end_headers()
            return
        if self.path.startswith("/search"):
            body = json.dumps({"results": [{"title": "T1", "url": "http://a", "content": "c1"},
                                           {"title": "T2", "url": "http://b", "content": "c2"}]}).encode()
        elif self.path.startswith("/headers"):
            body = f"auth={self.headers.get('Authorization')} x={self.headers.get('X-Trace')}".encode()
        elif self.path.startswith("/big"):
            body = b"y" * 10_000
        else:
            body = b"page body"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def site():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_web_fetch_blocks_private_targets(tmp_path, site) -> None:
    ctx = make_ctx(tmp_path, network=["*"])
    for url in (f"{site}/page", "http://localhost:9/x", "http://10.1.2.3/", "http://169.254.169.254/latest"):
        with pytest.raises(ToolError, match="private or loopback") as err:
            run(ctx, "web_fetch", url=url)
        assert "object" not in str(err.value)
    with pytest.raises(ToolError, match="only http and https"):
        run(ctx, "web_fetch", url="file:///etc/passwd")


def test_web_fetch_allowlisted_host_redirects_and_caps(tmp_path, site) -> None:
    ctx = make_ctx(tmp_path, network=["*"])
    ctx.tools_config.fetch_allow_hosts = ["127.0.0.1"]
    assert run(ctx, "web_fetch", url=f"{site}/page") == "HTTP 200\npage body"
    # The redirect goes to `localhost`, which is not allowlisted: re-checked and refused.
    with pytest.raises(ToolError, match="localhost"):
        run(ctx, "web_fetch", url=f"{site}/redirect")
    # Both names allowed: the redirect is followed, but credentials stay with the first host.
    ctx.tools_config.fetch_allow_hosts = ["127.0.0.1", "localhost"]
    out = run(ctx, "web_fetch", url=f"{site}/redirect-headers", headers={"Authorization": "Bearer s", "X-Trace": "1"})
    assert out == "HTTP 200\nauth=None x=1"
    same_host = run(ctx, "web_fetch", url=f"{site}/headers", headers={"Authorization": "Bearer s"})
    assert same_host.endswith("auth=Bearer s x=None")
    out = run(ctx, "web_fetch", url=f"{site}/big")
    assert out.endswith("[truncated at 2048 bytes]") and out.split("\n")[1] == "y" * 2048
    ctx.capabilities["read_only_mode"] = True
    with pytest.raises(ToolError, match="Observe mode"):
        run(ctx, "web_fetch", url=f"{site}/page", method="POST")
    narrow = make_ctx(tmp_path, network=["example.com"])
    with pytest.raises(ToolError, match="network allowlist"):
        run(narrow, "web_fetch", url=f"{site}/page")


def rebind(monkeypatch, port: int) -> list[str]:
    """`rebind.example` resolves to a public address when first asked, then to loopback
    (DNS rebinding); the returned list records each lookup of it."""
    import socket

    real = socket.getaddrinfo
    calls: list[str] = []

    def rebinding(host: str, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.example":
            return real(host, *args, **kwargs)
        calls.append(host)
        ip = "93.184.216.34" if len(calls) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    return calls


def test_web_fetch_checks_the_connected_address(tmp_path, site, monkeypatch) -> None:
    """DNS rebinding: the name looks public when checked, then resolves to loopback on connect."""
    port = int(site.rsplit(":", 1)[1])
    calls = rebind(monkeypatch, port)
    ctx = make_ctx(tmp_path, network=["*"])
    with pytest.raises(ToolError, match="rebind.example.*private or loopback address 127.0.0.1"):
        run(ctx, "web_fetch", url=f"http://rebind.example:{port}/page")
    assert len(calls) == 2
    # CGNAT space is not public either, though 3.11's is_private misses it.
    with pytest.raises(ToolError, match="private or loopback"):
        run(ctx, "web_fetch", url="http://100.64.1.1/")


def test_file_read_refuses_special_files(ctx) -> None:
    ctx.workspace.mkdir(parents=True)
    os.mkfifo(ctx.workspace / "pipe")
    with pytest.raises(ToolError, match="not a regular file"):
        run(ctx, "file_read", path="pipe")


def test_web_search(tmp_path, site) -> None:
    ctx = make_ctx(tmp_path, network=["*"])
    with pytest.raises(ToolError, match="search_url"):
        run(ctx, "web_search", query="x")
    ctx.tools_config.search_url = f"{site}/search?q={{query}}&format=json"
    out = run(ctx, "web_search", query="cats & dogs", max_results=1)
    assert out == "1. T1\n   http://a\n   c1"


def test_memory_spawn_and_time(ctx) -> None:
    assert run(ctx, "memory_recall", key="k") == "no value stored under k"
    assert run(ctx, "memory_store", key="k", value={"a": [1, 2]}) == "stored k"
    assert json.loads(run(ctx, "memory_recall", key="k")) == {"a": [1, 2]}
    # agent_list/agent_find/agent_send run against the daemon's real manager in tests/agents/test_messaging.py
    assert json.loads(run(ctx, "agent_spawn", manifest_toml='name = "c"')) == {"agent_id": "new", "name": "child"}
    stamp = run(ctx, "system_time")
    assert stamp[:2] == "20" and "Z (unix " in stamp
    ctx.ops = None
    with pytest.raises(ToolError, match="not available"):
        run(ctx, "memory_recall", key="k")
