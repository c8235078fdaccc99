"""WebSockets on the daemon's own app (the real `python -m agentd start`): the transport
checks of tests/server/test_websocket.py that matter to users, plus the agent socket's limits at and
one past each value. tests/server/test_websocket.py keeps the transport module's hostile-handler
cases, which need handlers the product does not have."""

from __future__ import annotations

import json
import signal
import socket
import struct
import time
import uuid

import psutil
import pytest
import websocket

from conftest import LLM_ENV, llm_config
from tests.agents.test_agents import spawn
from support import wait_until

WAIT = 10.0


def ws_url(d, path: str) -> str:
    return d.url.replace("http://", "ws://") + path


def agent_socket(d, agent_id: str) -> websocket.WebSocket:
    ws = websocket.create_connection(ws_url(d, f"/api/agents/{agent_id}/ws"), timeout=WAIT)
    assert json.loads(ws.recv()) == {"type": "connected", "agent_id": agent_id}
    return ws


def until(ws: websocket.WebSocket, kind: str) -> list[dict]:
    frames = []
    while True:
        frames.append(json.loads(ws.recv()))
        if frames[-1]["type"] == kind:
            return frames




@pytest.mark.parametrize("payload", ["hello", "ü" * 1000, b"\x00\x01binary\xff", "x" * 200_000])
def test_daemon_echo_round_trips(shared_daemon, payload) -> None:
    ws = websocket.create_connection(ws_url(shared_daemon, "/api/_ws/echo"), timeout=WAIT)
    try:
        if isinstance(payload, bytes):
            ws.send_binary(payload)
        else:
            ws.send(payload)
        assert ws.recv() == payload
    finally:
        ws.close()


def test_abrupt_disconnects_leave_no_threads_or_fds(shared_daemon) -> None:
    d = shared_daemon
    proc = psutil.Process(d.proc.pid)
    url = ws_url(d, "/api/_ws/echo")
    warm = websocket.create_connection(url, timeout=WAIT)   # first use starts waitress workers
    warm.send("w")
    assert warm.recv() == "w"
    warm.close()
    time.sleep(0.3)

    def served() -> int:
        """Open sockets of clients on the daemon's port (its database connections, which a
        daemon on PostgreSQL opens as it likes, are not the point here)."""
        return sum(1 for c in proc.net_connections(kind="tcp")
                   if c.laddr and c.laddr.port == d.port and c.status != psutil.CONN_LISTEN)

    fds_before = served()
    for reset in (False, True, False, True):
        ws = websocket.create_connection(url, timeout=WAIT)
        ws.send("x")
        assert ws.recv() == "x"
        if reset:
            ws.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        ws.sock.close()   # no close frame
    wait_until(lambda: served() <= fds_before, "the daemon to close the dropped sockets")
    assert d.get("/api/health").ok


def test_rejected_upgrade_is_plain_json(agent_daemon) -> None:
    d = agent_daemon
    with socket.create_connection(("127.0.0.1", d.port), timeout=WAIT) as sock:
        sock.sendall((f"GET /api/agents/{uuid.uuid4()}/ws HTTP/1.1\r\nHost: 127.0.0.1:{d.port}\r\n"
                      "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                      "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 404")
        length = int([ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0].split(b":")[1])
        while len(body) < length:
            body += sock.recv(65536)
        assert json.loads(body) == {"error": "agent not found"}


def test_agent_socket_frame_limit_at_and_past_64_kib(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    ws = agent_socket(d, agent_id)
    try:
        ws.send("y" * (64 * 1024 + 1))
        assert json.loads(ws.recv()) == {"type": "error", "content": "frame too large (max 64 KB)"}
        at_limit = "[[reply:fits]]" + "y" * (64 * 1024 - len("[[reply:fits]]"))
        ws.send(at_limit)   # plain text frame of exactly 64 KiB is a message
        frames = until(ws, "response")
        assert frames[-1]["content"] == "fits", "BUG: a message of exactly 64 KiB is refused"
    finally:
        ws.close()


def test_agent_socket_message_frame_limit_is_its_contents(agent_daemon) -> None:
    """The 64 KB is the message's, as on the HTTP message endpoints: a `{type: message}` frame
    whose content is exactly 64 KB runs although its JSON envelope makes the frame longer."""
    d = agent_daemon
    agent_id = spawn(d)
    ws = agent_socket(d, agent_id)
    try:
        at_limit = "[[reply:fits]]" + "y" * (64 * 1024 - len("[[reply:fits]]"))
        ws.send(json.dumps({"type": "message", "content": at_limit}))
        assert until(ws, "response")[-1]["content"] == "fits"
        # Escaped non-ASCII: 32768 two-byte characters are 64 KB, written as 196 KB of JSON.
        escaped = "[[reply:wide]]" + "é" * ((64 * 1024 - len("[[reply:wide]]")) // 2)
        ws.send(json.dumps({"type": "message", "content": escaped}))
        assert until(ws, "response")[-1]["content"] == "wide"
        ws.send(json.dumps({"type": "message", "content": at_limit + "y"}))
        assert json.loads(ws.recv()) == {"type": "error", "content": "message too large (max 64 KB)"}
        ws.send(json.dumps({"type": "ping", "pad": "y" * 64 * 1024}))
        assert json.loads(ws.recv()) == {"type": "error", "content": "frame too large (max 64 KB)"}
        ws.send(json.dumps({"type": "message", "content": "[[reply:alive]]"}))
        assert until(ws, "response")[-1]["content"] == "alive"
    finally:
        ws.close()


def test_agent_socket_bad_attachments_get_the_http_errors(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    ws = agent_socket(d, agent_id)
    try:
        for attachments, error in [
                ("x", "invalid request: attachments: Not a valid list."),
                ([5], "invalid request: attachments.0: Invalid input type."),
                ([{}], "invalid request: attachments.0.file_id: Missing data for required field."),
                ([{"file_id": "nope"}], "invalid file id: 'nope' is not a UUID")]:
            ws.send(json.dumps({"type": "message", "content": "[[reply:no]]", "attachments": attachments}))
            # An unknown file id is found when the run starts (after `typing: start`).
            assert until(ws, "error")[-1] == {"type": "error", "content": error}, attachments
            r = d.post(f"/api/agents/{agent_id}/message", json={"message": "x", "attachments": attachments})
            assert (r.status_code, r.json()) == (400, {"error": error})
        ws.send(json.dumps({"type": "message", "content": "[[reply:yes]]", "attachments": []}))
        assert until(ws, "response")[-1]["content"] == "yes"
    finally:
        ws.close()


def test_agent_socket_allows_exactly_ten_messages_a_minute(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    ws = agent_socket(d, agent_id)
    try:
        answers = []
        for i in range(10):
            ws.send(json.dumps({"type": "message", "content": f"[[reply:r{i}]]"}))
            answers.append(until(ws, "response")[-1]["content"])
        assert answers == [f"r{i}" for i in range(10)], "BUG: fewer than 10 messages a minute are allowed"
        ws.send(json.dumps({"type": "message", "content": "eleventh"}))
        frame = until(ws, "error")[-1]
        assert frame["content"] == "rate limit exceeded: at most 10 messages a minute", \
            "BUG: the 11th message in a minute is accepted"
        ws.send(json.dumps({"type": "ping"}))
        assert until(ws, "pong")[-1] == {"type": "pong"}, "pings are not rate limited"
    finally:
        ws.close()


def test_agent_socket_when_max_streams_is_reached(daemon_factory, fake_llm) -> None:
    config = llm_config(fake_llm).replace("[api]\n", "[api]\nmax_streams = 1\n", 1)
    d = daemon_factory(config, env_extra=LLM_ENV)
    agent_id = spawn(d)
    first = agent_socket(d, agent_id)
    try:
        second = websocket.create_connection(ws_url(d, f"/api/agents/{agent_id}/ws"), timeout=WAIT)
        assert json.loads(second.recv()) == {"type": "error",
                                             "content": "too many concurrent streams; try again shortly"}
        second.close()
        r = d.post(f"/api/agents/{agent_id}/message/stream", json={"message": "hi"})
        assert r.status_code == 503
        first.send(json.dumps({"type": "ping"}))
        assert until(first, "pong")
    finally:
        first.close()
    # Closing the socket frees its slot.
    def freed() -> bool:
        ws = websocket.create_connection(ws_url(d, f"/api/agents/{agent_id}/ws"), timeout=WAIT)
        try:
            return json.loads(ws.recv())["type"] == "connected"
        finally:
            ws.close()
    wait_until(freed, "the closed socket's stream slot to be released")


def test_a_socket_mid_run_at_shutdown_gets_the_stop_notice_then_going_away(daemon_factory, fake_llm) -> None:
    """As a stop command's run ends: `typing: stop` and `error: run cancelled`, then close 1001."""
    d = daemon_factory(llm_config(fake_llm), env_extra=LLM_ENV)
    agent_id = spawn(d)
    ws = agent_socket(d, agent_id)
    ws.send(json.dumps({"type": "message", "content": "[[chunks:40]] [[pace:300]]"}))
    until(ws, "text_delta")
    d.proc.send_signal(signal.SIGTERM)
    frames = []
    while True:
        opcode, frame = ws.recv_data_frame(control_frame=True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            break
        frames.append(json.loads(frame.data))
    assert [f for f in frames if f["type"] not in ("text_delta", "phase")][-2:] == [
        {"type": "typing", "state": "stop"}, {"type": "error", "content": "run cancelled"}]
    assert struct.unpack("!H", frame.data[:2])[0] == 1001
    ws.close()
    assert d.proc.wait(15) == 0
