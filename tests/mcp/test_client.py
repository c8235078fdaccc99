"""agentd as an MCP client, against real MCP servers: `mcp-server-time` (from PyPI) over stdio,
a server built with the SDK's MCPServer over stdio and over Streamable HTTP, and a command
that does not speak MCP. The fake LLM calls the tools; what the servers answer must reach
the model's next request."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Iterator

import psutil
import pytest

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, stop_shared
from tests.mcp.support_mcp import GARBAGE, LOWLEVEL, TOOLBOX, HttpToolbox, servers, stdio_server, url_server, wait_state


@pytest.fixture(scope="module")
def http_toolbox() -> Iterator[HttpToolbox]:
    with HttpToolbox() as server:
        yield server


@pytest.fixture(scope="module")
def mcp_daemon(tmp_path_factory: pytest.TempPathFactory, fake_llm, http_toolbox) -> Iterator[Daemon]:
    extra = (stdio_server("time", args=["-m", "mcp_server_time", "--local-timezone", "UTC"])
             + stdio_server("box", TOOLBOX, timeout_secs=2, env=["BOX_TOKEN"])
             + url_server("web", http_toolbox.url, headers_env={"X-Token": "WEB_TOKEN"})
             + stdio_server("junk", GARBAGE, timeout_secs=1))
    home = make_home(tmp_path_factory.mktemp("mcp-client"), llm_config(fake_llm, extra))
    daemon = Daemon(home, env_extra={**LLM_ENV, "WEB_TOKEN": "t0ken", "BOX_TOKEN": "b0x",
                                     "OTHER_SECRET": "not for servers"}).start()
    for name in ("time", "box", "web"):
        wait_state(daemon, name, "ready")
    yield daemon
    stop_shared(daemon)


def _agent(d: Daemon, extra: str = "") -> str:
    r = d.post("/api/agents", json={"manifest_toml": f'name = "m-{uuid.uuid4().hex[:8]}"\n{extra}'})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def _call(tool: str, **args) -> str:
    return f"[[tool:{tool} {json.dumps(args)}]]"


def _say(d: Daemon, agent_id: str, text: str) -> str:
    r = d.post(f"/api/agents/{agent_id}/message", json={"message": text})
    assert r.status_code == 200, r.text
    return r.json()["response"]


def _tool_message(fake) -> dict:
    """The last tool result the model was sent."""
    for req in reversed(fake.requests):
        tools = [m for m in (req["json"] or {}).get("messages", []) if m.get("role") == "tool"]
        if tools:
            return tools[-1]
    raise AssertionError("no tool result reached the model")


def test_servers_are_listed_with_state_protocol_and_tools(mcp_daemon) -> None:
    listed = servers(mcp_daemon)
    assert list(listed) == ["time", "box", "web", "junk"]
    time_server = listed["time"]
    assert time_server["transport"] == "stdio" and time_server["state"] == "ready"
    assert time_server["protocol_version"] == "2026-07-28"
    assert time_server["server_info"]["name"] == "mcp-time"
    assert time_server["last_error"] is None
    tools = {t["name"]: t for t in time_server["tools"]}
    assert set(tools) == {"get_current_time", "convert_time"}
    assert tools["get_current_time"]["agent_tool"] == "mcp_time_get_current_time"
    assert tools["get_current_time"]["input_schema"]["required"] == ["timezone"]
    assert listed["web"]["transport"] == "streamable_http" and listed["web"]["state"] == "ready"
    assert {t["agent_tool"] for t in listed["web"]["tools"]} >= {"mcp_web_echo", "mcp_web_weather"}


def test_garbage_speaking_server_is_failed_with_its_error(mcp_daemon) -> None:
    junk = wait_state(mcp_daemon, "junk", "failed", last_error=lambda e: bool(e))
    assert junk["last_error"] == "not an MCP server: it wrote \"HTTP/1.1 418 I'm a teapot, not JSON-RPC\""
    assert junk["tools"] == [] and junk["protocol_version"] is None
    assert mcp_daemon.get("/api/health").status_code == 200


def test_time_tool_result_reaches_the_model(mcp_daemon, fake_llm) -> None:
    agent = _agent(mcp_daemon)
    offered = mcp_daemon.get(f"/api/agents/{agent}").json()["capabilities"]["tools"]
    assert {"mcp_time_get_current_time", "mcp_time_convert_time", "mcp_box_echo", "mcp_web_echo"} <= set(offered)
    # The model is offered the server's own schema.
    fake_llm.requests.clear()
    answer = _say(mcp_daemon, agent, _call("mcp_time_get_current_time", timezone="UTC"))
    sent = {t["function"]["name"]: t["function"] for t in fake_llm.requests[0]["json"]["tools"]}
    assert sent["mcp_time_get_current_time"]["parameters"]["properties"]["timezone"]["type"] == "string"
    result = json.loads(_tool_message(fake_llm)["content"])
    assert result["timezone"] == "UTC"
    when = datetime.fromisoformat(result["datetime"])
    assert abs((when - datetime.now(timezone.utc)).total_seconds()) < 60
    assert answer.startswith("tool said: {")


def test_results_reach_the_model_faithfully(mcp_daemon, fake_llm) -> None:
    agent = _agent(mcp_daemon)
    assert _say(mcp_daemon, agent, _call("mcp_web_echo", text="hi there")) == "tool said: echo:hi there"
    assert _say(mcp_daemon, agent, _call("mcp_box_picture")) == "tool said: a red dot\n[image: image/png, 66 bytes]"
    _say(mcp_daemon, agent, _call("mcp_box_weather", city="Oslo"))
    assert json.loads(_tool_message(fake_llm)["content"]) == {"city": "Oslo", "celsius": 21}
    assert _say(mcp_daemon, agent, _call("mcp_web_broken")) == (
        "tool said: error: Error executing tool broken: the gauge is broken")


def test_servers_get_only_the_named_variables_and_headers(mcp_daemon) -> None:
    agent = _agent(mcp_daemon)
    assert _say(mcp_daemon, agent, _call("mcp_box_env", name="BOX_TOKEN")) == "tool said: b0x"
    assert _say(mcp_daemon, agent, _call("mcp_box_env", name="OTHER_SECRET")) == "tool said: "
    assert _say(mcp_daemon, agent, _call("mcp_web_header", name="X-Token")) == "tool said: t0ken"


def test_hanging_tool_gets_a_deadline_and_the_daemon_goes_on(mcp_daemon) -> None:
    agent = _agent(mcp_daemon)
    started = time.monotonic()
    assert _say(mcp_daemon, agent, _call("mcp_box_hang")) == (
        "tool said: error: MCP server 'box' did not answer 'hang' within 2s")
    assert time.monotonic() - started < 10
    assert mcp_daemon.get("/api/health").status_code == 200
    # The server still answers, so it was not restarted.
    assert _say(mcp_daemon, agent, _call("mcp_box_echo", text="x")) == "tool said: echo:x"


def test_crashing_server_is_restarted_and_its_state_shown(mcp_daemon) -> None:
    agent = _agent(mcp_daemon)
    first_pid = _say(mcp_daemon, agent, _call("mcp_box_pid"))
    restarts = servers(mcp_daemon)["box"]["restarts"]
    out = _say(mcp_daemon, agent, _call("mcp_box_crash"))
    assert out == "tool said: error: MCP server 'box' failed: MCPError: Connection closed"
    box = wait_state(mcp_daemon, "box", "ready", restarts=restarts + 1)
    assert box["last_error"] == "MCPError: Connection closed"
    assert _say(mcp_daemon, agent, _call("mcp_box_pid")) != first_pid
    # The other servers were not touched.
    assert servers(mcp_daemon)["time"]["restarts"] == 0


def test_hung_server_is_restarted(mcp_daemon) -> None:
    agent = _agent(mcp_daemon)
    first_pid = int(_say(mcp_daemon, agent, _call("mcp_box_pid")).removeprefix("tool said: "))
    restarts = servers(mcp_daemon)["box"]["restarts"]
    assert _say(mcp_daemon, agent, _call("mcp_box_freeze")) == (
        "tool said: error: MCP server 'box' did not answer 'freeze' within 2s")
    box = wait_state(mcp_daemon, "box", "ready", restarts=restarts + 1)
    assert box["last_error"].startswith("the server stopped answering (")
    assert int(_say(mcp_daemon, agent, _call("mcp_box_pid")).removeprefix("tool said: ")) != first_pid
    # The stopped process was not left behind.
    assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == psutil.STATUS_ZOMBIE


def test_http_server_that_goes_down_is_failed_and_reconnected_when_back(mcp_daemon, http_toolbox) -> None:
    agent = _agent(mcp_daemon)
    first_pid = _say(mcp_daemon, agent, _call("mcp_web_pid"))
    restarts = servers(mcp_daemon)["web"]["restarts"]
    http_toolbox.proc.kill()
    http_toolbox.proc.wait(10)
    web = wait_state(mcp_daemon, "web", "failed", restarts=lambda n: n > restarts)
    assert web["last_error"] == "ConnectError: All connection attempts failed" and web["tools"] == []
    assert _say(mcp_daemon, agent, _call("mcp_web_echo", text="x")) == (
        "tool said: permission denied: tool 'mcp_web_echo' is not available to this agent")
    http_toolbox.__enter__()  # the same server back on the same port
    wait_state(mcp_daemon, "web", "ready", timeout=40)
    assert _say(mcp_daemon, agent, _call("mcp_web_echo", text="y")) == "tool said: echo:y"
    assert _say(mcp_daemon, agent, _call("mcp_web_pid")) != first_pid


def test_allow_list_keeps_other_servers_tools_away(mcp_daemon) -> None:
    agent = _agent(mcp_daemon, 'mcp_servers = ["time"]')
    detail = mcp_daemon.get(f"/api/agents/{agent}").json()
    assert detail["mcp_servers"] == ["time"] and detail["mcp_servers_mode"] == "allowlist"
    mcp_tools = sorted(t for t in detail["capabilities"]["tools"] if t.startswith("mcp_"))
    assert mcp_tools == ["mcp_time_convert_time", "mcp_time_get_current_time"]
    assert _say(mcp_daemon, agent, _call("mcp_box_echo", text="x")) == (
        "tool said: permission denied: tool 'mcp_box_echo' is not available to this agent")


def test_observe_mode_never_calls_them(mcp_daemon) -> None:
    agent = _agent(mcp_daemon)
    first_pid = _say(mcp_daemon, agent, _call("mcp_box_pid"))
    assert mcp_daemon.put(f"/api/agents/{agent}/mode", json={"mode": "Observe"}).status_code == 200
    tools = mcp_daemon.get(f"/api/agents/{agent}").json()["capabilities"]["tools"]
    assert not [t for t in tools if t.startswith("mcp_")]
    assert _say(mcp_daemon, agent, _call("mcp_box_crash")) == (
        "tool said: permission denied: tool 'mcp_box_crash' is not available to this agent "
        "(Observe mode: read-only tools)")
    assert servers(mcp_daemon)["box"]["state"] == "ready"
    assert mcp_daemon.put(f"/api/agents/{agent}/mode", json={"mode": "Auto"}).status_code == 200
    assert _say(mcp_daemon, agent, _call("mcp_box_pid")) == first_pid


def test_manual_mode_asks_for_approval(mcp_daemon) -> None:
    agent = _agent(mcp_daemon)
    assert mcp_daemon.put(f"/api/agents/{agent}/mode", json={"mode": "Manual"}).status_code == 200
    import threading

    answers: list[str] = []
    worker = threading.Thread(target=lambda: answers.append(_say(mcp_daemon, agent, _call("mcp_box_echo", text="ok"))))
    worker.start()
    deadline = time.monotonic() + 10
    pending: list = []
    while time.monotonic() < deadline and not pending:
        pending = [a for a in mcp_daemon.get("/api/approvals").json() if a["agent_id"] == agent]
        time.sleep(0.05)
    assert pending and pending[0]["tool"] == "mcp_box_echo" and pending[0]["input"] == {"text": "ok"}
    assert mcp_daemon.post(f"/api/approvals/{pending[0]['id']}/approve").status_code == 200
    worker.join(15)
    assert answers == ["tool said: echo:ok"]


def test_config_change_is_applied_live(mcp_daemon) -> None:
    config = mcp_daemon.home / "config.toml"
    before = config.read_text()
    try:
        config.write_text(before + stdio_server("box2", TOOLBOX))
        assert wait_state(mcp_daemon, "box2", "ready")["tools"]
        assert servers(mcp_daemon)["box"]["state"] == "ready"  # unchanged servers keep running
        config.write_text(before + "\n[[mcp_servers]]\nname = \"bad\"\nenv = {TOKEN = \"secret\"}\n")
        r = mcp_daemon.post("/api/mcp/reload")
        assert r.status_code == 400
        assert r.json()["error"].startswith("config key mcp_servers[4].env: values are not allowed here")
        assert "box2" in servers(mcp_daemon)  # a bad file changes nothing
    finally:
        config.write_text(before)
    # The watcher may have applied the restored file already; then the reload has nothing to do.
    r = mcp_daemon.post("/api/mcp/reload")
    assert r.status_code == 200 and r.json() in (
        {"status": "reloaded", "added": [], "removed": ["box2"], "restarted": []},
        {"status": "reloaded", "added": [], "removed": [], "restarted": []})
    assert list(servers(mcp_daemon)) == ["time", "box", "web", "junk"]


def test_a_server_slower_to_start_than_its_call_deadline_becomes_ready(mcp_daemon) -> None:
    # `timeout_secs` is each call's deadline; a server gets at least 30 s to answer its handshake
    # (the SDK's discovery probe waits 10 s of it before the handshake proper).
    config = mcp_daemon.home / "config.toml"
    before = config.read_text()
    try:
        config.write_text(before + stdio_server("late", TOOLBOX, args=["--start-delay", "12"], timeout_secs=1))
        late = wait_state(mcp_daemon, "late", "ready", timeout=40)
        assert (late["restarts"], late["last_error"]) == (0, None), late
        assert _say(mcp_daemon, _agent(mcp_daemon), _call("mcp_late_echo", text="x")) == "tool said: echo:x"
    finally:
        config.write_text(before)
        mcp_daemon.post("/api/mcp/reload")


def test_dashboard_lists_servers_and_groups_an_agents_tools(mcp_daemon) -> None:
    page = mcp_daemon.get("/mcp-servers")
    assert page.status_code == 200
    for name in ("time", "box", "web", "junk"):
        assert f'data-server="{name}"' in page.text
    assert "<code>mcp_time_get_current_time</code>" in page.text
    assert "not an MCP server" in page.text
    agent = _agent(mcp_daemon, 'mcp_servers = ["time"]\n[capabilities]\ntools = ["file_read", "mcp_time_convert_time"]')
    html = mcp_daemon.get(f"/agents/{agent}").text
    assert '<dt>Tools (built-in)</dt><dd class="tools" data-origin="built-in">file_read</dd>' in html
    assert ('<dt>Tools (MCP server time)</dt><dd class="tools" data-origin="MCP server time">'
            'mcp_time_convert_time</dd>') in html


class _Refusing(http.server.BaseHTTPRequestHandler):
    """An MCP endpoint that refuses every request as a wrong API key."""

    def do_POST(self) -> None:  # noqa: N802 - the handler's API
        body = b'{"error": "invalid API key"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def odd_daemon(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    """Servers the SDK's MCPServer cannot make: tool names that collide as agent tool names,
    an answer its output schema refuses, no tools at all; and an HTTP server refusing its key."""
    refusing = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=refusing.serve_forever, daemon=True).start()
    extra = (stdio_server("a", LOWLEVEL, args=["tools", "b_c", "x.y", "x_y"])
             + stdio_server("a_b", LOWLEVEL, args=["tools", "c"])
             + stdio_server("odd", LOWLEVEL, args=["badout"])
             + stdio_server("prompts", LOWLEVEL, args=["prompts"])
             + url_server("locked", f"http://127.0.0.1:{refusing.server_address[1]}/mcp"))
    home = make_home(tmp_path_factory.mktemp("mcp-odd"), llm_config(fake_llm, extra))
    daemon = Daemon(home, env_extra=LLM_ENV).start()
    for name in ("a", "a_b", "odd"):
        wait_state(daemon, name, "ready")
    yield daemon
    stop_shared(daemon)
    refusing.shutdown()
    refusing.server_close()


def _hashed(name: str, server: str, tool: str) -> str:
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return f"{name}_{digest}"


def test_tools_whose_names_collide_get_names_of_their_own(odd_daemon, fake_llm) -> None:
    listed = servers(odd_daemon)
    names = {(server, t["name"]): t["agent_tool"] for server in ("a", "a_b") for t in listed[server]["tools"]}
    # The first server in the file, and a server's first tool, keep the name both would make.
    assert names == {("a", "b_c"): "mcp_a_b_c", ("a", "x.y"): "mcp_a_x_y",
                     ("a", "x_y"): _hashed("mcp_a_x_y", "a", "x_y"), ("a_b", "c"): _hashed("mcp_a_b_c", "a_b", "c")}
    agent = _agent(odd_daemon)
    fake_llm.requests.clear()
    for (_, tool), name in names.items():
        assert _say(odd_daemon, agent, _call(name)) == f"tool said: {tool} called"
    offered = [t["function"]["name"] for t in fake_llm.requests[0]["json"]["tools"]]
    assert len(offered) == len(set(offered)) and set(names.values()) <= set(offered)


def test_an_answer_its_output_schema_refuses_is_the_models_error_and_the_server_stays(odd_daemon) -> None:
    agent = _agent(odd_daemon, 'mcp_servers = ["odd"]')
    pid = _say(odd_daemon, agent, _call("mcp_odd_pid"))
    assert _say(odd_daemon, agent, _call("mcp_odd_badout")).startswith(
        "tool said: error: MCP server 'odd' refused 'badout': Invalid structured content returned by tool "
        "badout: 'many' is not of type 'integer'\n")
    odd = servers(odd_daemon)["odd"]
    assert (odd["state"], odd["restarts"], odd["last_error"]) == ("ready", 0, None)
    assert _say(odd_daemon, agent, _call("mcp_odd_pid")) == pid


def test_a_server_without_tools_is_ready_with_none(odd_daemon) -> None:
    prompts = wait_state(odd_daemon, "prompts", "ready")
    assert (prompts["tools"], prompts["restarts"], prompts["last_error"]) == ([], 0, None)
    time.sleep(6)  # past a probe: an answer to it, even an error, keeps the server
    prompts = servers(odd_daemon)["prompts"]
    assert (prompts["state"], prompts["restarts"]) == ("ready", 0)


def test_an_http_server_refusing_the_request_is_failed_with_its_status(odd_daemon) -> None:
    locked = wait_state(odd_daemon, "locked", "failed", last_error=lambda e: bool(e))
    assert locked["last_error"] == "MCPError: Server returned an error response (HTTP 401)"
