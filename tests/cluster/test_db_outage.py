"""PostgreSQL stopped and restarted under a small mixed load, two daemons behind nginx:
health says `degraded`, writes answer 503 with `Retry-After` (the OpenAI shape on /v1),
streams in flight end with an `error` event (SSE) or frame (WebSocket), both daemons serve
again within 5 s of the server's return without a restart, every acknowledged write is
there exactly once, a run that spans the outage (shorter than its lease) completes, runs
cut by it are closed by their own daemon, and the log has one warning per
outage and no traceback. Then the same for connections killed by `pg_terminate_backend`.

The test runs its own PostgreSQL server (it stops it), whatever `--db` says."""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import websocket

import pgtest
from channel_fixtures import wait_for
from conftest import LLM_ENV, llm_config
from support import Daemon, make_home
from test_cluster import NGINX, ClusterNginx, spawn

LEASE = 6.0
UNAVAILABLE = "database unavailable: the PostgreSQL server cannot be reached or is restarting; retry shortly"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(pgtest.pg_bindir() is None, reason="PostgreSQL (initdb/pg_ctl) is not installed"),
    pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed: apt-get install nginx"),
]


class Server:
    """A PostgreSQL cluster of the test's own, stopped and started at will on one port."""

    def __init__(self) -> None:
        self.cluster = pgtest.Cluster().start()
        self.url = pgtest.Databases(self.cluster.admin_url).new_url()

    def _ctl(self, *args: str) -> None:
        c = self.cluster
        subprocess.run([*c._as_user, f"{c.bindir}/pg_ctl", "-D", str(c.data), *args],
                       check=True, capture_output=True, timeout=60)

    def stop(self) -> None:
        self._ctl("-m", "fast", "-w", "stop")

    def start(self) -> None:
        c = self.cluster
        self._ctl("-o", f"-p {c.port} -k {c.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                  "-c max_connections=200", "-l", str(c.dir / "server.log"), "-w", "start")

    def sql(self, statement: str) -> list[tuple]:
        import psycopg2

        conn = psycopg2.connect(self.url)
        try:
            conn.autocommit = True
            cur = conn.cursor()
            cur.execute(statement)
            return cur.fetchall() if cur.description else []
        finally:
            conn.close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory, fake_llm):
    server = Server()
    daemons = []
    for name in ("daemon-a", "daemon-b"):
        extra = f'\n[cluster]\ndaemon_id = "{name}"\nlease_secs = {LEASE}\n'
        # Model calls long enough for a run to outlast the outage.
        config = llm_config(fake_llm, extra).replace("timeout_secs = 3\n", "timeout_secs = 20\n")
        home = make_home(tmp_path_factory.mktemp(name), config)
        daemons.append(Daemon(home, env_extra={**LLM_ENV, "AGENTD_DATABASE_URL": server.url}))
    for d in daemons:
        d.start(wait=False)
    for d in daemons:
        d.wait_healthy()
    proxy = ClusterNginx((daemons[0].port, daemons[1].port))
    yield server, daemons[0], daemons[1], proxy
    proxy.stop()
    for d in daemons:
        d.stop()
    server.cluster.stop()


class Load:
    """KV writes and messages through nginx on a few threads; remembers what was acknowledged."""

    def __init__(self, url: str, agent_id: str) -> None:
        self.url, self.agent_id = url, agent_id
        self.stop = threading.Event()
        self.acked_kv: dict[str, int] = {}
        self.acked_messages: list[str] = []
        self.sent_messages: list[str] = []
        self.statuses: list[int] = []
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(3)
        self.futures = [self.pool.submit(self._kv, 0), self.pool.submit(self._kv, 1),
                        self.pool.submit(self._messages)]

    def _record(self, status: int) -> None:
        with self.lock:
            self.statuses.append(status)

    def _kv(self, worker: int) -> None:
        i = 0
        while not self.stop.is_set():
            key = f"w{worker}-{i}"
            try:
                r = requests.put(f"{self.url}/api/memory/agents/{self.agent_id}/kv/{key}",
                                 json={"value": i}, timeout=10)
            except requests.RequestException:
                continue
            self._record(r.status_code)
            if r.status_code == 200:
                with self.lock:
                    self.acked_kv[key] = i
            i += 1
            time.sleep(0.02)

    def _messages(self) -> None:
        i = 0
        while not self.stop.is_set():
            text = f"load message {i}"
            with self.lock:
                self.sent_messages.append(text)
            try:
                r = requests.post(f"{self.url}/api/agents/{self.agent_id}/message", json={"message": text},
                                  timeout=20)
            except requests.RequestException:
                continue
            self._record(r.status_code)
            if r.status_code == 200:
                with self.lock:
                    self.acked_messages.append(text)
            i += 1
            time.sleep(0.05)

    def finish(self) -> None:
        self.stop.set()
        for f in self.futures:
            f.result(timeout=30)
        self.pool.shutdown()


def _serving(d: Daemon, agent_id: str) -> bool:
    try:
        health = d.get("/api/health", timeout=2).json()["status"]
        write = d.put(f"/api/memory/agents/{agent_id}/kv/probe", json={"value": 1}, timeout=2).status_code
    except (requests.RequestException, ValueError):
        return False
    return health == "ok" and write == 200


def _log_since(d: Daemon, offset: int) -> str:
    return d.log_path.read_bytes()[offset:].decode(errors="replace")


def test_postgres_restart_under_load(setup) -> None:
    server, a, b, proxy = setup
    agent = spawn(proxy.url, "steady")
    spanning_agent = spawn(proxy.url, "spanning")
    streamer = spawn(proxy.url, "streamer")
    socketed = spawn(proxy.url, "socketed")
    offsets = {d.port: d.log_path.stat().st_size for d in (a, b)}
    load = Load(proxy.url, agent)
    wait_for(lambda: len(load.acked_kv) >= 5 and load.acked_messages, 10, what="load running")

    # A run that starts before the outage and ends after it, on daemon a.
    spanning = a.post(f"/api/agents/{spanning_agent}/message/stream", stream=True, timeout=30,
                      json={"message": "[[chunks:90]] [[pace:100]] across"})
    assert spanning.status_code == 200
    stream = a.post(f"/api/agents/{streamer}/message/stream", json={"message": "[[slow:3]] cut"},
                    stream=True, timeout=30)
    assert stream.status_code == 200
    ws = websocket.create_connection(f"ws://127.0.0.1:{b.port}/api/agents/{socketed}/ws", timeout=10)
    assert json.loads(ws.recv())["type"] == "connected"
    ws.send(json.dumps({"type": "message", "content": "[[slow:3]] cut"}))
    time.sleep(0.3)
    server.stop()
    down_at = time.monotonic()
    try:  # a failed check must not leave the server down for the module's other tests
        body = "".join(c.decode() for c in stream.iter_content(None))
        assert "event: error" in body, body
        assert f'"error":"{UNAVAILABLE}","status":503' in body, body
        frames = [json.loads(ws.recv())]
        while frames[-1]["type"] not in ("error", "response"):
            frames.append(json.loads(ws.recv()))
        ws.close()
        assert frames[-1] == {"type": "error", "content": UNAVAILABLE}, frames
        for d in (a, b):
            assert d.get("/api/health", timeout=5).json() == {"status": "degraded"}
            r = d.put(f"/api/memory/agents/{agent}/kv/during", json={"value": 1}, timeout=10)
            assert r.status_code == 503 and r.headers["Retry-After"] == "2", r.text
            assert r.json() == {"error": UNAVAILABLE}
            r = d.post("/v1/chat/completions", json={"model": "steady", "messages": [{"role": "user", "content": "x"}]},
                       timeout=10)
            assert r.status_code == 503 and r.headers["Retry-After"] == "2", r.text
            assert r.json() == {"error": {"message": UNAVAILABLE, "type": "server_error"}}
        # Down for longer than a heartbeat, shorter than the lease: the leases renewed last
        # before the outage run out during it or just after.
        time.sleep(max(0.0, LEASE - 1.5 - (time.monotonic() - down_at)))

    finally:
        server.start()
    back_at = time.monotonic()
    wait_for(lambda: _serving(a, agent) and _serving(b, agent), 5, what="both daemons serving again")
    recovered = time.monotonic() - back_at
    assert recovered < 5, recovered
    time.sleep(0.5)
    load.finish()

    # The run that spanned the outage was neither failed by a reaper nor cut short.
    spanned = "".join(c.decode() for c in spanning.iter_content(None))
    assert "event: done" in spanned and "event: error" not in spanned, spanned[-500:]
    # Runs that failed in the outage are closed by their own daemon once it is back (at its
    # next heartbeat, a third of the lease), with the cause, and their sessions are free
    # again (not left for the reaper).
    wait_for(lambda: (streamer, "failed", UNAVAILABLE) in server.sql("SELECT agent_id, status, error FROM agent_runs"),
             LEASE, interval=0.2, what="the run cut by the outage closed by its daemon")
    runs = server.sql("SELECT agent_id, status, error FROM agent_runs")
    assert [r[1] for r in runs if r[0] == spanning_agent] == ["completed"], runs
    assert not [r for r in runs if "lease" in (r[2] or "")], runs
    again = a.post(f"/api/agents/{streamer}/message", json={"message": "after"}, timeout=10)
    assert again.status_code == 200 and again.json()["response"] == "echo: after", again.text

    assert set(load.statuses) <= {200, 503}, sorted(set(load.statuses))
    assert 503 in load.statuses and load.acked_kv and load.acked_messages
    # Every acknowledged KV write is there with its value.
    for key, value in load.acked_kv.items():
        r = b.get(f"/api/memory/agents/{agent}/kv/{key}")
        assert r.status_code == 200 and r.json()["value"] == value, (key, r.text)
    # Every acknowledged message is in the session exactly once, and no refused one twice.
    stored = [json.loads(row[0]).get("content") for row in server.sql("SELECT body FROM session_messages")]
    for text in load.acked_messages:
        assert stored.count(text) == 1, (text, stored.count(text))
    assert all(stored.count(text) <= 1 for text in load.sent_messages)

    for d in (a, b):
        log = _log_since(d, offsets[d.port])
        assert "Traceback" not in log, log
        assert log.count(UNAVAILABLE) == 1, log
        assert log.count("database available again") == 1, log


def test_killed_connections_reconnect(setup) -> None:
    server, a, b, proxy = setup
    agent = spawn(proxy.url, "killed")
    offsets = {d.port: d.log_path.stat().st_size for d in (a, b)}
    for i in range(4):
        assert (a if i % 2 else b).put(f"/api/memory/agents/{agent}/kv/k{i}", json={"value": i}).ok
    killed = server.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = 'agentd' AND pid <> pg_backend_pid()")
    assert killed
    statuses = []
    deadline = time.monotonic() + 5
    ok_in_a_row = 0
    i = 0
    while ok_in_a_row < 6 and time.monotonic() < deadline:
        d = a if i % 2 else b
        r = d.put(f"/api/memory/agents/{agent}/kv/after{i}", json={"value": i}, timeout=5)
        statuses.append(r.status_code)
        ok_in_a_row = ok_in_a_row + 1 if r.status_code == 200 else 0
        i += 1
    assert ok_in_a_row == 6, statuses
    assert set(statuses) <= {200, 503}, statuses
    reply = a.post(f"/api/agents/{agent}/message", json={"message": "still here"})
    assert reply.status_code == 200 and reply.json()["response"] == "echo: still here"
    for d in (a, b):
        assert d.get("/api/health").json() == {"status": "ok"}
        assert "Traceback" not in _log_since(d, offsets[d.port])


def test_a_channel_configured_during_an_outage_starts_once_the_database_is_back(setup) -> None:
    """The 503 says "retry", but config.toml already holds the section: the daemons' leader
    tick starts the adapter (on one of them) as soon as the database answers."""
    from fakes.ntfy import FakeNtfy

    server, a, b, proxy = setup
    ntfy = FakeNtfy("ntfy-outage-token").start()
    offset = a.log_path.stat().st_size
    try:
        body = {"topic": "outage", "server_url": ntfy.url, "token_env": "NTFY_TOKEN",
                "secrets": {"token_env": "ntfy-outage-token"}}
        server.stop()
        try:
            r = a.post("/api/channels/ntfy/configure", json=body, timeout=10)
        finally:
            server.start()
        assert r.status_code == 503 and r.headers["Retry-After"] == "2", r.text
        assert r.json() == {"error": UNAVAILABLE}
        wait_for(lambda: a.get("/api/cluster", timeout=5).json().get("channel_leaders") == {"ntfy": "daemon-a"},
                 15, what="ntfy started on daemon-a",
                 explain=lambda: (a.get("/api/cluster", timeout=5).json(), _log_since(a, offset)[-4000:]))
        wait_for(lambda: ntfy.subscriptions, 10, what="ntfy subscribed")
        assert a.delete("/api/channels/ntfy/configure").status_code == 200
        assert "Traceback" not in _log_since(a, offset)
    finally:
        ntfy.stop()


def test_health_detail_and_metrics_answer_while_the_database_is_down(setup) -> None:
    server, a, b, proxy = setup
    spawn(proxy.url, "counted")
    offset = a.log_path.stat().st_size
    known = len(a.get("/api/agents").json())
    server.stop()
    try:
        detail = a.get("/api/health/detail", timeout=10)
        scrape = a.get("/metrics", timeout=10)
    finally:
        server.start()
    assert detail.status_code == 200, detail.text
    body = detail.json()
    assert (body["status"], body["database"], body["agent_count"]) == ("degraded", "error", known)
    assert scrape.status_code == 200 and "agentd_build_info" in scrape.text
    assert "agentd_budget_spent_usd" not in scrape.text
    wait_for(lambda: a.get("/api/health/detail", timeout=5).json()["database"] == "connected", 5,
             what="database connected")
    assert "Traceback" not in _log_since(a, offset)


def test_a_daemon_stopped_while_the_database_is_down_exits_cleanly(setup, tmp_path, fake_llm) -> None:
    """Stopping must not depend on the database: its runs end, the channel it leads is let
    go, it exits 0, no traceback."""
    from fakes.ntfy import FakeNtfy

    server, a, b, proxy = setup
    ntfy = FakeNtfy("ntfy-offline-token").start()
    channel = (f'\n[channels.ntfy]\ntopic = "offline"\nserver_url = "{ntfy.url}"\n'
               'token_env = "NTFY_OFFLINE_TOKEN"\n')
    config = llm_config(fake_llm, f'\n[cluster]\ndaemon_id = "daemon-c"\nlease_secs = {LEASE}\n' + channel)
    home = make_home(tmp_path, config.replace("timeout_secs = 3\n", "timeout_secs = 20\n"))
    c = Daemon(home, env_extra={**LLM_ENV, "AGENTD_DATABASE_URL": server.url,
                                "NTFY_OFFLINE_TOKEN": "ntfy-offline-token"}).start()
    wait_for(lambda: ntfy.subscriptions, 10, what="ntfy subscribed")
    agent = spawn(c.url, "stopped-offline")
    stream = c.post(f"/api/agents/{agent}/message/stream", json={"message": "[[slow:5]] stopping"},
                    stream=True, timeout=30)
    assert stream.status_code == 200
    server.stop()
    try:
        assert c.stop() == 0
    finally:
        server.start()
        ntfy.stop()
    assert "Traceback" not in c.log()
    wait_for(lambda: _serving(a, agent), 5, what="daemon a serving again")


def test_a_websocket_during_an_outage_gets_error_frames_and_stays_open(setup) -> None:
    """A message or a command sent while the database is down is answered with an `error`
    frame saying so (as HTTP answers 503), and the socket serves again once it is back."""
    server, a, b, proxy = setup
    agent = spawn(proxy.url, "socket-outage")
    offset = a.log_path.stat().st_size
    ws = websocket.create_connection(f"ws://127.0.0.1:{a.port}/api/agents/{agent}/ws", timeout=10)
    try:
        assert json.loads(ws.recv())["type"] == "connected"
        server.stop()
        try:
            frames = []
            for frame in ({"type": "message", "content": "during"}, {"type": "command", "command": "reset"},
                          {"type": "command", "command": "compact"}, {"type": "command", "command": "stop"}):
                ws.send(json.dumps(frame))
                frames.append(json.loads(ws.recv()))
        finally:
            server.start()
        assert frames == [{"type": "error", "content": UNAVAILABLE}] * 4, frames
        wait_for(lambda: _serving(a, agent), 5, what="daemon-a serving again")
        ws.send(json.dumps({"type": "message", "content": "after"}))
        reply = [json.loads(ws.recv())]
        while reply[-1]["type"] not in ("error", "response"):
            reply.append(json.loads(ws.recv()))
        assert reply[-1]["type"] == "response" and reply[-1]["content"] == "echo: after", reply
    finally:
        ws.close()
    assert "Traceback" not in _log_since(a, offset)


def test_a_stop_during_an_outage_stops_the_run_of_its_daemon(setup) -> None:
    """Stopping a run of this daemon needs no database: the stop answers `run cancelled`
    and the run ends at once, while the database is down."""
    server, a, b, proxy = setup
    agent = spawn(proxy.url, "stopped-in-outage")
    offset = a.log_path.stat().st_size
    stream = a.post(f"/api/agents/{agent}/message/stream", json={"message": "[[slow:20]] long"},
                    stream=True, timeout=30)
    assert stream.status_code == 200
    wait_for(lambda: a.get(f"/api/cluster/runs?agent_id={agent}&status=running").json(), 10, what="the run started")
    server.stop()
    try:
        r = a.post(f"/api/agents/{agent}/stop", timeout=10)
        started = time.monotonic()
        body = "".join(c.decode() for c in stream.iter_content(None))
        ended_in = time.monotonic() - started
    finally:
        server.start()
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "stopped", "agent_id": agent, "was_running": True, "message": "run cancelled"}
    # It ends as a stopped stream does, or with the outage's error when the run's end could
    # not be saved: either way at once, long before the model's answer.
    assert ("event: done" in body and '"stopped":true' in body or f'"error":"{UNAVAILABLE}"' in body), body
    assert ended_in < 10, (ended_in, body)
    wait_for(lambda: _serving(a, agent), 5, what="daemon-a serving again")
    assert "Traceback" not in _log_since(a, offset)
