"""agentd/api/sockets.py exactly, on the daemon's own app: `create_app(kernel)` served by
waitress with agentd's WebSocket transport (`ws_transport.install`, as agentd.daemon does),
in this process so the test is fast; websocket-client talks to it over 127.0.0.1 and runs go
to the fake LLM over real HTTP. Covers the frame protocol byte for byte, every error frame's
text, the limits at and one past their values, commands, a client that leaves mid-run, the
stream cap and the agent check before the upgrade. The same socket through the real
`python -m agentd start` is tests/api/test_ws_daemon.py and tests/api/test_transports.py."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
import websocket
from prometheus_client.parser import text_string_to_metric_families
from waitress import wasyncore

from agentd import jsonsafe
from agentd.agents.events import Event
from agentd.agents.manager import MESSAGE_LIMIT
from agentd.agents.handle import STOPPED_NOTE
from agentd.api import create_app, sockets
from agentd.server import websocket as ws_transport
from agentd.config import parse_config
from agentd.kernel import Kernel
from support import with_test_db

LOCAL = {"REMOTE_ADDR": "127.0.0.1"}
WAIT = 15.0


class AppServer:
    """The daemon's app on a waitress server with the WebSocket transport installed."""

    def __init__(self, tmp_path: Path, fake_llm, extra: dict | None = None) -> None:
        data = {"api": {"rate_limit_per_second": 10000, "rate_limit_burst": 10000, "max_streams": 3},
                "agents": {"max_queue": 1},
                "llm": {"timeout_secs": 10, "retries": 1},
                "default_model": {"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
                "provider_urls": {"openai": fake_llm.openai_base}}
        data.update(extra or {})
        self.kernel = Kernel.open(parse_config(with_test_db(data, tmp_path), tmp_path))
        self.app = create_app(self.kernel)
        self.waitress = ws_transport.create_server(self.app, host="127.0.0.1", port=0, threads=12,
                                                   asyncore_use_poll=True, ident="agentd-test")
        self.port = self.waitress.effective_port
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sockets-test-loop", daemon=True)
        self._thread.start()
        self.count = 0

    def _loop(self) -> None:
        while not self._stop.is_set():
            wasyncore.loop(timeout=0.05, map=self.waitress._map, use_poll=True, count=1)

    def spawn(self, name: str) -> str:
        self.count += 1
        r = self.app.test_client().post("/api/agents", json={"manifest_toml": f'name = "{name}{self.count}"\n'},
                                        environ_base=LOCAL)
        assert r.status_code == 201, r.get_data(as_text=True)
        return r.get_json()["agent_id"]

    def url(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        try:
            self._stop.set()
            self._thread.join(WAIT)
            ws_transport.close_websockets(self.waitress)
            self.kernel.stopping.set()
            self.waitress.task_dispatcher.shutdown(timeout=WAIT)
            self.waitress.close()
            wasyncore.close_all(self.waitress._map)
        finally:
            self.kernel.close()   # its cluster heartbeat must not outlive the test's directory


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[AppServer]:
    patch = pytest.MonkeyPatch()
    patch.setenv("OPENAI_API_KEY", "test-openai")
    server = AppServer(tmp_path_factory.mktemp("sockets"), fake_llm)
    yield server
    server.stop()
    patch.undo()


class Client:
    def __init__(self, srv: AppServer, agent_id: str) -> None:
        self.ws = websocket.create_connection(srv.url(f"/api/agents/{agent_id}/ws"), timeout=WAIT)
        self.agent_id = agent_id

    def raw(self) -> str:
        return self.ws.recv()

    def frame(self) -> dict:
        return json.loads(self.ws.recv())

    def send(self, data: Any) -> None:
        self.ws.send(data if isinstance(data, str) else json.dumps(data))

    def until(self, kind: str) -> list[dict]:
        frames = []
        while True:
            frames.append(self.frame())
            if frames[-1]["type"] == kind:
                return frames

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def client(srv: AppServer) -> Iterator[Client]:
    c = Client(srv, srv.spawn("ws"))
    assert c.raw() == '{"type":"connected","agent_id":"%s"}' % c.agent_id
    yield c
    c.close()


def final_frames(frames: list[dict]) -> list[dict]:
    """Frames without phase and text_delta noise."""
    return [f for f in frames if f["type"] not in ("phase", "text_delta")]


# -- the frame protocol -------------------------------------------------------------------------------------------

def test_ping_pong_is_compact(client: Client) -> None:
    client.send({"type": "ping"})
    assert client.raw() == '{"type":"pong"}'


def test_message_frames_in_order(client: Client) -> None:
    client.send({"type": "message", "content": "[[chunks:3]]"})
    frames = client.until("response")
    assert frames[0] == {"type": "typing", "state": "start"}
    assert "".join(f["content"] for f in frames if f["type"] == "text_delta") == "w1 w2 w3"
    assert {"type": "phase", "phase": "streaming", "detail": ""} in frames
    response = frames[-1]
    assert list(response) == ["type", "content", "input_tokens", "output_tokens", "iterations", "cost_usd"]
    assert (response["content"], response["output_tokens"], response["iterations"]) == ("w1 w2 w3", 3, 1)
    assert response["input_tokens"] > 0 and response["cost_usd"] > 0
    assert frames[-2] == {"type": "typing", "state": "stop"}, "BUG: typing stop is not right before the response"


def test_a_quiet_socket_stays_open(client: Client) -> None:
    time.sleep(1.0)   # the handler's reads time out meanwhile
    client.send({"type": "ping"})
    assert client.raw() == '{"type":"pong"}'


def test_plain_text_frame_is_a_message(client: Client) -> None:
    client.send("[[reply:plain]]")
    assert client.until("response")[-1]["content"] == "plain"
    client.send("[1, 2]")      # JSON, but not an object: a message too
    assert client.until("response")[-1]["content"] == "echo: [1, 2]"
    client.send('"quoted"')
    assert client.until("response")[-1]["content"] == 'echo: "quoted"'


def test_binary_frame_is_decoded_as_text(client: Client) -> None:
    client.ws.send_binary("[[reply:bin]]".encode())
    assert client.until("response")[-1]["content"] == "bin"
    client.ws.send_binary(b"caf\xc3\xa9 \xff")    # invalid UTF-8 is replaced, not refused
    assert client.until("response")[-1]["content"] == "echo: caf\u00e9 \ufffd"


def test_tool_frames(client: Client) -> None:
    client.send({"type": "message", "content": '[[tool:agent_list {}]]'})
    frames = client.until("response")
    kinds = [f["type"] for f in frames]
    start = frames[kinds.index("tool_start")]
    call_id = start["id"]
    assert frames[kinds.index("tool_start") - 1] == {"type": "typing", "state": "tool", "tool": "agent_list"}
    assert start == {"type": "tool_start", "id": call_id, "tool": "agent_list"}
    assert frames[kinds.index("tool_end")] == {"type": "tool_end", "id": call_id, "tool": "agent_list", "input": {}}
    result = frames[kinds.index("tool_result")]
    assert list(result) == ["type", "id", "tool", "result", "is_error"]
    assert (result["id"], result["tool"], result["is_error"]) == (call_id, "agent_list", False)
    assert client.agent_id in result["result"]
    phases = [f for f in frames if f["type"] == "phase"]
    assert {"type": "phase", "phase": "tool_use", "detail": "agent_list"} in phases, phases
    assert all(list(p) == ["type", "phase", "detail"] and isinstance(p["detail"], str) for p in phases)


@pytest.mark.parametrize("frame", [
    {"type": "message"}, {"type": "message", "content": ""}, {"type": "message", "content": " \n\t"},
    {"type": "message", "content": 5}, {"type": "message", "content": ["hi"]}, {"type": "message", "content": None}])
def test_message_without_content(client: Client, frame: dict) -> None:
    client.send(frame)
    assert client.frame() == {"type": "error", "content": "missing or empty 'content' field"}
    client.send({"type": "ping"})
    assert client.frame() == {"type": "pong"}, "BUG: a refused message was answered with more frames"


@pytest.mark.parametrize("frame, error", [
    ({"type": "bogus"}, "unknown frame type 'bogus'"), ({"content": "hi"}, "unknown frame type None"),
    ({"type": "PING"}, "unknown frame type 'PING'"), ({"type": "messages", "content": "hi"},
                                                      "unknown frame type 'messages'"),
    ({"type": "command", "command": "restart"}, "unknown command 'restart': use stop, reset or compact"),
    ({"type": "command"}, "unknown command None: use stop, reset or compact"),
    ({"type": "command", "command": "STOP"}, "unknown command 'STOP': use stop, reset or compact")])
def test_unknown_frames_and_commands(client: Client, frame: dict, error: str) -> None:
    client.send(frame)
    assert client.raw() == json.dumps({"type": "error", "content": error}, separators=(",", ":"))


def test_frame_limit_at_and_past_64_kib(client: Client) -> None:
    assert sockets.FRAME_LIMIT == 65536
    client.send("y" * 65537)
    assert client.frame() == {"type": "error", "content": "frame too large (max 64 KB)"}
    client.send("é" * 32768 + "y")   # 65537 bytes in 32769 characters
    assert client.frame() == {"type": "error", "content": "frame too large (max 64 KB)"}, \
        "BUG: the frame limit counts characters, not bytes"
    at_limit = "[[reply:fits]]" + "y" * (65536 - len("[[reply:fits]]"))
    client.send(at_limit)
    assert client.until("response")[-1]["content"] == "fits", "BUG: a frame of exactly 64 KiB is refused"
    client.ws.send_binary(b"z" * 65537)
    assert client.frame() == {"type": "error", "content": "frame too large (max 64 KB)"}


def test_the_json_of_a_frame_may_pass_64_kib_but_not_its_message(client: Client) -> None:
    """A message frame's JSON may pass 64 KiB by its envelope and escapes (its content is what
    the message limit counts); any other frame may not."""
    fits = "[[reply:fits]] " + "\u00e9" * 30000   # 60,015 bytes, six times as many escaped
    client.send({"type": "message", "content": fits})
    assert client.until("response")[-1]["content"] == "fits"
    client.send({"type": "ping", "pad": "x" * 65536})
    assert client.frame() == {"type": "error", "content": "frame too large (max 64 KB)"}
    client.send({"type": "command", "command": "stop", "pad": "x" * 65536})
    assert client.frame() == {"type": "error", "content": "frame too large (max 64 KB)"}


def test_a_binary_frame_past_the_json_limit_once_decoded_is_refused(client: Client) -> None:
    """Each invalid UTF-8 byte of a binary frame is read as U+FFFD (3 bytes): the frame is
    measured as decoded, and refused past 4 x 64 KiB before it is parsed."""
    envelope = b'{"type":"message","content":"', b'"}'
    at_limit = envelope[0] + b"\xff" * 87371 + envelope[1]   # 262,144 bytes decoded
    client.ws.send_binary(at_limit)
    assert client.frame() == {"type": "error", "content": "message too large (max 64 KB)"}
    client.ws.send_binary(at_limit[:-2] + b"a" + envelope[1])
    assert client.frame() == {"type": "error", "content": "frame too large (max 64 KB)"}
    client.send({"type": "ping"})
    assert client.frame() == {"type": "pong"}


def test_too_deep_json_is_refused(client: Client) -> None:
    depth = jsonsafe.MAX_DEPTH + 1
    client.send("[" * depth + "]" * depth)
    assert client.frame() == {"type": "error", "content": jsonsafe.TOO_DEEP_MESSAGE}
    client.send({"type": "ping"})
    assert client.frame() == {"type": "pong"}


def test_failed_run_sends_its_error(client: Client) -> None:
    client.send({"type": "message", "content": "[[fail:400]]"})
    frames = final_frames(client.until("error"))
    assert frames == [{"type": "typing", "state": "start"}, {"type": "typing", "state": "stop"},
                      {"type": "error", "content": "message delivery failed: openai model gpt-4o: HTTP 400: "
                                                   "fakellm: scripted failure 400"}]
    client.send({"type": "message", "content": "hi", "attachments": [{"file_id": ""}]})
    assert final_frames(client.until("error"))[-1] == {"type": "error", "content": "invalid file id: '' is not a UUID"}
    # Attachments of the wrong shape are refused before a run, as the HTTP endpoints refuse them.
    client.send({"type": "message", "content": "hi", "attachments": "notalist"})
    assert client.frame() == {"type": "error", "content": "invalid request: attachments: Not a valid list."}
    client.send({"type": "message", "content": "hi", "attachments": [{"bogus": 1}]})
    assert client.frame() == {"type": "error", "content": "invalid request: attachments.0.file_id: Missing data for "
                                                         "required field.; attachments.0.bogus: Unknown field."}


def test_a_run_that_fails_inside_agentd_is_an_internal_error(srv: AppServer, client: Client,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault of agentd's own (not an error it names) is told as such, without its details."""
    def broken(*args: Any) -> None:
        raise RuntimeError("a fault inside the run")

    monkeypatch.setattr(srv.kernel.runs, "_run_locked", broken)
    client.send({"type": "message", "content": "hi"})
    assert final_frames(client.until("error")) == [{"type": "typing", "state": "start"},
                                                   {"type": "typing", "state": "stop"},
                                                   {"type": "error", "content": "internal error"}]


def test_attachments_default_to_none(client: Client) -> None:
    for attachments in (None, [], ""):
        client.send({"type": "message", "content": "[[reply:ok]]", "attachments": attachments})
        assert client.until("response")[-1]["content"] == "ok"


# -- commands -----------------------------------------------------------------------------------------------------

def test_stop_command(client: Client) -> None:
    client.send({"type": "command", "command": "stop"})
    assert client.raw() == '{"type":"command_result","command":"stop","message":"no run in progress"}'
    client.send({"type": "message", "content": "[[slow:5]] hi"})
    assert client.frame() == {"type": "typing", "state": "start"}
    # At once: the stop reaches the run even before a worker has picked it up.
    client.send({"type": "command", "command": "stop"})
    # The command's answer and the run's end come from different threads, in either order.
    answer = {"type": "command_result", "command": "stop", "message": "run cancelled"}
    frames = client.until("error")
    if answer not in frames:
        frames += client.until("command_result")
    assert answer in frames
    assert [f for f in frames if f != answer][-2:] == [{"type": "typing", "state": "stop"},
                                                       {"type": "error", "content": "run cancelled"}]



def test_a_message_frame_names_its_person_or_session(srv: AppServer, client: Client) -> None:
    """A message frame's `user` or `session` field picks the session its run talks in;
    without them the socket's own (here the agent's own session)."""
    def said(query: str) -> list[str]:
        r = srv.app.test_client().get(f"/api/agents/{client.agent_id}/session{query}", environ_base=LOCAL)
        return [m["content"] for m in r.get_json()["messages"]]

    for frame in ({"user": "erin", "content": "from erin"}, {"session": "notes", "content": "in notes"},
                  {"content": "own"}):
        client.send({"type": "message", **frame})
        assert client.until("response")[-1]["content"] == f"echo: {frame['content']}"
    assert said("?user=erin") == ["from erin", "echo: from erin"]
    assert said("?session=notes") == ["in notes", "echo: in notes"]
    assert said("") == ["own", "echo: own"]
    for bad in ({"user": 7}, {"session": ["notes"]}):
        client.send({"type": "message", "content": "x", **bad})
        assert client.frame() == {"type": "error", "content": "'user' and 'session' must be strings"}

def test_a_scoped_key_talks_in_its_own_session_and_its_runs_count_as_websocket_runs(
        tmp_path: Path, fake_llm, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key's socket without `user` or `session` talks in a session of the key's own, as its
    HTTP messages do; the agent's own session sees none of it. /metrics counts the run as ws."""
    monkeypatch.setenv("OPENAI_API_KEY", "test-openai")
    server = AppServer(tmp_path, fake_llm, {"api_key": "admin-for-sockets"})
    http = server.app.test_client()
    admin = {"Authorization": "Bearer admin-for-sockets"}

    def runs() -> list[tuple[str, str, float]]:
        """The run counters that are not 0: (origin, outcome, count)."""
        text = http.get("/metrics", headers=admin, environ_base=LOCAL).get_data(as_text=True)
        return [(x.labels["origin"], x.labels["outcome"], x.value) for family in text_string_to_metric_families(text)
                for x in family.samples if x.name == "agentd_runs_total" and x.value]

    try:
        r = http.post("/api/agents", json={"manifest_toml": 'name = "keyed"\n'}, headers=admin, environ_base=LOCAL)
        assert r.status_code == 201, r.get_data(as_text=True)
        agent_id = r.get_json()["agent_id"]
        r = http.post("/api/keys", json={"name": "socket-key", "scopes": ["read", "message"]}, headers=admin,
                      environ_base=LOCAL)
        assert r.status_code == 201, r.get_data(as_text=True)
        key = {"Authorization": f"Bearer {r.get_json()['key']}"}
        assert runs() == []
        ws = websocket.create_connection(server.url(f"/api/agents/{agent_id}/ws"), timeout=WAIT, header=key)
        try:
            assert json.loads(ws.recv())["type"] == "connected"
            ws.send(json.dumps({"type": "message", "content": "from the key"}))
            while (frame := json.loads(ws.recv()))["type"] != "response":
                pass
            assert frame["content"] == "echo: from the key"
        finally:
            ws.close()

        def said(headers: dict) -> list[str]:
            r = http.get(f"/api/agents/{agent_id}/session", headers=headers, environ_base=LOCAL)
            return [m["content"] for m in r.get_json()["messages"]]

        assert said(key) == ["from the key", "echo: from the key"]
        assert said(admin) == [], "BUG: a key's socket talked in the agent's own session"
        assert runs() == [("ws", "completed", 1.0)]
    finally:
        server.stop()


@pytest.mark.parametrize("query, session", [("?user=erin", "?user=erin"), ("?session=notes", "?session=notes"),
                                            ("?user=", "")])
def test_the_socket_s_user_or_session_picks_the_session_its_runs_talk_in(srv: AppServer, query: str,
                                                                         session: str) -> None:
    agent_id = srv.spawn("person")
    ws = websocket.create_connection(srv.url(f"/api/agents/{agent_id}/ws{query}"), timeout=WAIT)
    try:
        assert json.loads(ws.recv())["type"] == "connected"
        ws.send(json.dumps({"type": "message", "content": "hello"}))
        while (frame := json.loads(ws.recv()))["type"] != "response":
            pass
    finally:
        ws.close()

    def said(query: str) -> list[str]:
        r = srv.app.test_client().get(f"/api/agents/{agent_id}/session{query}", environ_base=LOCAL)
        return [m["content"] for m in r.get_json()["messages"]]

    assert said(session) == ["hello", "echo: hello"]
    if session:
        assert said("") == [], "BUG: the socket's person talked in the agent's own session"


@pytest.mark.parametrize("command", ["reset", "new"])
def test_reset_commands_clear_the_history(srv: AppServer, client: Client, command: str) -> None:
    client.send({"type": "message", "content": "[[reply:remember]]"})
    client.until("response")
    r = srv.app.test_client().get(f"/api/agents/{client.agent_id}/session", environ_base=LOCAL)
    assert len(r.get_json()["messages"]) == 2
    client.send({"type": "command", "command": command})
    assert client.frame() == {"type": "command_result", "command": command,
                              "message": "session reset; history cleared"}
    r = srv.app.test_client().get(f"/api/agents/{client.agent_id}/session", environ_base=LOCAL)
    assert r.status_code == 200 and r.get_json()["messages"] == [], r.get_data(as_text=True)


def test_compact_command(client: Client) -> None:
    client.send({"type": "command", "command": "compact"})
    frame = client.frame()
    assert frame == {"type": "command_result", "command": "compact", "message": "no compaction needed (0 messages)"}


# -- limits and leaving -------------------------------------------------------------------------------------------

def test_exactly_ten_messages_a_minute(client: Client) -> None:
    for i in range(10):
        client.send({"type": "message", "content": f"[[reply:r{i}]]"})
        assert client.until("response")[-1]["content"] == f"r{i}", "BUG: fewer than 10 messages a minute allowed"
    client.send({"type": "message", "content": "[[reply:11]]"})
    assert client.frame() == {"type": "error", "content": "rate limit exceeded: at most 10 messages a minute"}
    client.send({"type": "message", "content": ""})   # an empty one is refused for being empty, not counted
    assert client.frame()["content"] == "missing or empty 'content' field"


def test_full_agent_queue_is_an_error_frame(srv: AppServer) -> None:
    agent_id = srv.spawn("busy")
    a, b = Client(srv, agent_id), Client(srv, agent_id)
    try:
        a.frame(), b.frame()
        # Runs until stopped below (no timing: a loaded machine cannot let it end early).
        a.send({"type": "message", "content": "[[slow:30]] one"})
        assert a.frame() == {"type": "typing", "state": "start"}
        assert a.frame()["type"] == "phase"   # running, so no longer waiting in the queue
        b.send({"type": "message", "content": "[[reply:two]]"})   # max_queue = 1: waits
        assert b.frame() == {"type": "typing", "state": "start"}
        b.send({"type": "message", "content": "[[reply:three]]"})
        name = srv.kernel.agents.get(agent_id).name
        assert b.frame() == {"type": "error", "content": f"agent {name} is busy: 1 requests are already waiting "
                                                         "for it (max_queue 1); try again later"}
        a.send({"type": "command", "command": "stop"})
        assert a.until("error")[-1] == {"type": "error", "content": "run cancelled"}
        assert b.until("response")[-1]["content"] == "two"
    finally:
        a.close(), b.close()


def test_client_leaving_stops_its_runs(srv: AppServer, caplog: pytest.LogCaptureFixture) -> None:
    agent_id = srv.spawn("leave")
    handle = srv.kernel.agents.get(agent_id)
    c = Client(srv, agent_id)
    c.frame()
    c.send({"type": "message", "content": "[[slow:30]] one"})
    c.send({"type": "message", "content": "[[reply:queued]]"})
    assert c.frame() == {"type": "typing", "state": "start"}
    # The first run may report its phase before the second message is read (a loaded machine).
    while (frame := c.frame()) != {"type": "typing", "state": "start"}:
        assert frame["type"] == "phase", frame
    time.sleep(0.2)
    assert len(handle.waiting) == 1
    c.ws.sock.close()   # gone without a close frame
    deadline = time.monotonic() + WAIT
    while (handle.waiting or handle.busy) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not handle.waiting, "BUG: a queued run of a client that left was not withdrawn"
    assert not handle.busy, "BUG: the running run of a client that left went on"
    # Stopped, not ended by the 10 s model-call deadline (which also frees the agent in time),
    # and the queued message never ran.
    texts = [m.get("content") for m in srv.kernel.agents.session(handle)["messages"]]
    assert texts == ["[[slow:30]] one", STOPPED_NOTE], \
        f"BUG: the running run was not stopped or the queued one ran: {texts}"
    failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert failed == [], "BUG: the socket's handler failed while stopping its runs"


def test_a_cron_run_is_shown_while_the_socket_is_open(srv: AppServer) -> None:
    """An agent's cron job's run reaches the agent's open sockets; a closed one is forgotten."""
    agent_id = srv.spawn("cronned")
    http = srv.app.test_client()
    r = http.post("/api/cron/jobs", environ_base=LOCAL, json={
        "name": "chime", "agent_id": agent_id, "schedule": {"kind": "cron", "expr": "0 0 1 1 *"},
        "action": {"kind": "agent_turn", "message": "[[reply:chimed]]"}})
    assert r.status_code == 201, r.get_data(as_text=True)
    job_id = r.get_json()["id"]
    c = Client(srv, agent_id)
    try:
        c.frame()
        assert http.post(f"/api/cron/jobs/{job_id}/run", environ_base=LOCAL).status_code == 202
        frames = final_frames(c.until("response"))
        assert frames[:2] == [{"type": "message", "content": "[[reply:chimed]]", "source": "cron", "job_id": job_id,
                               "job_name": "chime"}, {"type": "typing", "state": "start"}]
        assert frames[-1]["content"] == "chimed"
    finally:
        c.close()
    deadline = time.monotonic() + WAIT
    while srv.kernel.listeners.of(agent_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.kernel.listeners.of(agent_id) == [], "BUG: a closed socket still listens to the agent's cron runs"


def test_unknown_agent_is_404_before_the_upgrade(srv: AppServer) -> None:
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        websocket.create_connection(srv.url(f"/api/agents/{uuid.uuid4()}/ws"), timeout=WAIT)
    assert info.value.status_code == 404
    assert json.loads(info.value.resp_body) == {"error": "agent not found"}
    r = requests.get(f"http://127.0.0.1:{srv.port}/api/agents/{uuid.uuid4()}/ws", timeout=WAIT)
    # Not a handshake: the WebSocket route does not match a plain GET at all.
    assert r.status_code == 400 and list(r.json()) == ["error"]


@pytest.mark.parametrize("headers", [{"Sec-WebSocket-Version": "13"},
                                     {"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "8"}])
def test_a_handshake_without_its_key_or_version_is_a_400(srv: AppServer, headers: dict) -> None:
    agent_id = srv.spawn("handshake")
    r = requests.get(f"http://127.0.0.1:{srv.port}/api/agents/{agent_id}/ws", timeout=WAIT,
                     headers={"Upgrade": "websocket", "Connection": "Upgrade", **headers})
    assert r.status_code == 400
    assert r.json() == {"error": "not a WebSocket handshake: send Sec-WebSocket-Key and Sec-WebSocket-Version: 13"}


def test_echo_socket(srv: AppServer) -> None:
    ws = websocket.create_connection(srv.url("/api/_ws/echo"), timeout=WAIT)
    try:
        for text in ("one", "", "ü" * 500):
            ws.send(text)
            assert ws.recv() == text
        ws.send_binary(b"\x00\xff")
        assert ws.recv() == b"\x00\xff"
    finally:
        ws.close()


def test_socket_options(srv: AppServer) -> None:
    app = create_app(srv.kernel)   # built inside this test, so mutation testing sees it here
    assert app.config["SOCK_SERVER_OPTIONS"] == {"ping_interval": 25, "max_message_size": 4 * 65536}
    assert "sockets" in app.blueprints
    endpoints = {r.rule: r.endpoint for r in app.url_map.iter_rules()}
    assert endpoints["/api/agents/<agent_id>/ws"] == "sockets.agent_socket"
    assert endpoints["/api/_ws/echo"] == "sockets.echo"


def test_socket_options_set_by_the_app_are_kept() -> None:
    from flask import Flask

    app = Flask("own")
    app.config["SOCK_SERVER_OPTIONS"] = {"ping_interval": 5}
    sockets.register_sockets(app)
    assert app.config["SOCK_SERVER_OPTIONS"] == {"ping_interval": 5}


def test_failed_compaction_is_an_error_frame(srv: AppServer) -> None:
    agent_id = srv.spawn("compactfail")
    http = srv.app.test_client()
    for i in range(6):   # 12 stored messages: more than the 10 compaction keeps
        r = http.post(f"/api/agents/{agent_id}/message", json={"message": f"[[fail:400]] n{i}"}, environ_base=LOCAL)
        assert r.status_code >= 400
    c = Client(srv, agent_id)
    try:
        c.frame()
        # The transcript being summarised holds the directive, so the summary call fails too.
        c.send({"type": "command", "command": "compact"})
        assert c.frame() == {"type": "error", "content": "compaction failed: openai model gpt-4o: HTTP 400: "
                                                         "fakellm: scripted failure 400"}
    finally:
        c.close()


def test_max_streams_at_the_cap(srv: AppServer) -> None:
    agent_id = srv.spawn("cap")
    # Sockets of earlier tests give their slots back once their handlers return.
    deadline = time.monotonic() + WAIT
    while ws_transport.active_websockets(srv.waitress) and time.monotonic() < deadline:
        time.sleep(0.05)
    open_ = [Client(srv, agent_id) for _ in range(3)]   # max_streams = 3
    try:
        for c in open_:
            assert c.frame()["type"] == "connected"
        extra = websocket.create_connection(srv.url(f"/api/agents/{agent_id}/ws"), timeout=WAIT)
        assert extra.recv() == '{"type": "error", "content": "too many concurrent streams; try again shortly"}'
        extra.close()
    finally:
        for c in open_:
            c.close()
    deadline = time.monotonic() + WAIT
    while True:
        c = Client(srv, agent_id)
        first = c.frame()
        c.close()
        if first["type"] == "connected":
            break
        assert time.monotonic() < deadline, "BUG: closed sockets kept their stream slots"
        time.sleep(0.1)


# -- AgentSocket directly (checks a socket client cannot reach) ---------------------------------------------------

class Recorder:
    """Where AgentSocket writes, for the checks no frame through the transport can reach."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.sent: list[str] = []
        self.fail = fail

    def send(self, frame: str) -> None:
        if self.fail is not None:
            raise self.fail
        self.sent.append(frame)


def test_message_limit_behind_the_frame_limit(srv: AppServer) -> None:
    # A frame of at most 64 KiB cannot carry more content than that, so this check only
    # guards a future larger FRAME_LIMIT; called directly it must hold at and past the limit.
    handle = srv.kernel.agents.get(srv.spawn("direct"))
    rec = Recorder()
    s = sockets.AgentSocket(rec, srv.kernel, handle)
    s.handle_message({"content": "é" * (MESSAGE_LIMIT // 2) + "a"})
    assert rec.sent == ['{"type":"error","content":"message too large (max 64 KB)"}']
    assert len(s._recent) == 0, "a refused message counted against the rate"


def test_quota_refusal_is_an_error_frame_before_any_run(srv: AppServer) -> None:
    r = srv.app.test_client().post("/api/agents", environ_base=LOCAL, json={
        "manifest_toml": 'name = "quota-ws"\n[capabilities]\nmax_llm_tokens_per_hour = 1\n'})
    assert r.status_code == 201, r.get_data(as_text=True)
    agent_id = r.get_json()["agent_id"]
    c = Client(srv, agent_id)
    try:
        c.frame()
        c.send({"type": "message", "content": "[[reply:spend]]"})   # uses more than 1 token
        assert c.until("response")[-1]["content"] == "spend"
        c.send({"type": "message", "content": "[[reply:more]]"})
        frame = c.frame()
        assert frame["type"] == "error" and frame["content"].startswith(
            "message delivery failed: quota exceeded: ") and frame["content"].endswith(
            " of 1 LLM tokens used in the last hour (max_llm_tokens_per_hour)"), frame
        c.send({"type": "ping"})
        assert c.frame() == {"type": "pong"}, "BUG: a refused message still started a run"
    finally:
        c.close()


def test_finished_runs_are_forgotten(srv: AppServer) -> None:
    # A long-lived socket must not keep every finished run (stop_runs only needs live ones).
    handle = srv.kernel.agents.get(srv.spawn("forget"))
    rec = Recorder()
    s = sockets.AgentSocket(rec, srv.kernel, handle)
    for text in ("one", "two"):
        s.handle_message({"content": f"[[reply:{text}]]"})
        deadline = time.monotonic() + WAIT
        while not any(json.loads(f)["type"] == "response" and json.loads(f)["content"] == text for f in rec.sent):
            assert time.monotonic() < deadline, rec.sent
            time.sleep(0.02)
        while s._runs and time.monotonic() < deadline:   # the done-callback ends right after its last frame
            time.sleep(0.02)
        assert s._runs == {}, "BUG: a finished run is kept by its socket"


def test_rate_window_is_sixty_seconds(srv: AppServer) -> None:
    handle = srv.kernel.agents.get(srv.spawn("window"))
    s = sockets.AgentSocket(Recorder(), srv.kernel, handle)
    now = time.monotonic()
    s._recent.extend([now - 60.5] * 10)     # a minute ago: forgotten
    assert s._rate_ok() is True and len(s._recent) == 1
    s._recent.clear()
    s._recent.extend([now - 59.0] * 9)
    assert s._rate_ok() is True, "BUG: the 10th message within a minute refused"
    assert s._rate_ok() is False, "BUG: the 11th message within a minute allowed"
    assert len(s._recent) == 10


def test_send_after_the_client_left(srv: AppServer) -> None:
    from simple_websocket import ConnectionClosed

    handle = srv.kernel.agents.get(srv.spawn("left"))
    for exc in (ConnectionClosed(), OSError("gone")):
        rec = Recorder(exc)
        s = sockets.AgentSocket(rec, srv.kernel, handle)
        assert s.open
        s.send("pong")
        assert s.open is False
    rec = Recorder()
    s = sockets.AgentSocket(rec, srv.kernel, handle)
    s.open = False
    s.send("pong")
    assert rec.sent == [], "BUG: a frame written to a socket known to be closed"


def test_on_event_ignores_other_events(srv: AppServer) -> None:
    rec = Recorder()
    s = sockets.AgentSocket(rec, srv.kernel, srv.kernel.agents.get(srv.spawn("events")))
    s.on_event(Event("done", {"response": "x"}))
    s.on_event(Event("phase", {"phase": "thinking"}))
    s.on_event(Event("phase", {"phase": "tool_use", "detail": None}))
    s.on_event(Event("phase", {"phase": "tool_use", "detail": "x"}))
    assert rec.sent == ['{"type":"phase","phase":"thinking","detail":""}',
                        '{"type":"phase","phase":"tool_use","detail":""}',
                        '{"type":"phase","phase":"tool_use","detail":"x"}']


def test_stopping_kernel_ends_the_socket(tmp_path: Path, fake_llm, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-openai")
    server = AppServer(tmp_path, fake_llm)
    try:
        c = Client(server, server.spawn("stopping"))
        assert c.frame()["type"] == "connected"
        server.kernel.stopping.set()
        c.ws.settimeout(WAIT)
        with pytest.raises((websocket.WebSocketConnectionClosedException, ConnectionError, socket.error)):
            while True:
                if c.ws.recv() in ("", None):
                    raise websocket.WebSocketConnectionClosedException("closed")
    finally:
        server.kernel.stopping.clear()
        server.stop()
