"""Two real daemons on one PostgreSQL database behind nginx (docs/nginx-cluster.conf)
behave like one: agents created through one and messaged through the other, a burst to
one agent serialised across both, the budget not overspent by parallel runs on both,
approvals decided on the other daemon, semantic memory seen by the other daemon's
search, stream paths routed by agent id (409 elsewhere), a daemon SIGKILLed mid-run and
its run marked failed within the lease period while the other's run survives, and the
ntfy channel adapter failing over to the surviving daemon."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
import requests

import pgtest
from channel_fixtures import CHANNEL_ENV, wait_for
from conftest import LLM_ENV, llm_config
from fakes.ntfy import FakeNtfy
from support import Daemon, make_home

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_CONF = ROOT / "docs" / "nginx-cluster.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
LEASE = 3.0  # a loaded host (the suite's workers) can miss a shorter lease between renewals
TOPIC = "agentd-cluster"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(pgtest.pg_bindir() is None and not os.environ.get("AGENTD_TEST_DATABASE_URL"),
                       reason="PostgreSQL (initdb/pg_ctl) is not installed: apt-get install postgresql"),
    pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed: apt-get install nginx"),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ClusterNginx:
    """nginx running docs/nginx-cluster.conf in front of two daemons (plain HTTP)."""

    def __init__(self, ports: tuple[int, int]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="agentd-nginx-cluster-"))
        self.dir.chmod(0o755)
        self.port = _free_port()
        text = CLUSTER_CONF.read_text()
        swaps = [("listen 80;", f"listen 127.0.0.1:{self.port};", 1),
                 ("127.0.0.1:4201", f"127.0.0.1:{ports[0]}", 2),
                 ("127.0.0.1:4202", f"127.0.0.1:{ports[1]}", 2)]
        for old, _, count in swaps:
            assert text.count(old) == count, f"{CLUSTER_CONF.name} no longer contains {old!r} {count}x"
        # In one pass: a daemon port such as 42021 holds the text "127.0.0.1:4202".
        new_of = {old: new for old, new, _ in swaps}
        text = re.sub("|".join(map(re.escape, new_of)), lambda m: new_of[m.group(0)], text)
        temps = ""
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.dir / kind).mkdir(mode=0o777)
            (self.dir / kind).chmod(0o777)
            temps += f"    {kind}_temp_path {self.dir / kind};\n"
        (self.dir / "nginx.conf").write_text(
            f"daemon off;\nworker_processes 1;\npid {self.dir / 'nginx.pid'};\nerror_log {self.dir / 'error.log'};\n"
            f"events {{ worker_connections 512; }}\nhttp {{\n    access_log off;\n{temps}{text}\n}}\n")
        self.proc = subprocess.Popen([NGINX, "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir),
                                      "-e", str(self.dir / "error.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _listening(self.port), 10, what="nginx listening")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def spawn(url: str, name: str, profile: str = "minimal") -> str:
    toml = f'name = "{name}"\nprofile = "{profile}"\n'
    r = requests.post(f"{url}/api/agents", json={"manifest_toml": toml}, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def say(url: str, agent_id: str, text: str, timeout: float = 60) -> requests.Response:
    return requests.post(f"{url}/api/agents/{agent_id}/message", json={"message": text}, timeout=timeout)


def runs(url: str, **query: str) -> list[dict]:
    r = requests.get(f"{url}/api/cluster/runs", params=query, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def cluster(tmp_path, fake_llm):
    db_url = pgtest.databases().new_url()
    ntfy = FakeNtfy(CHANNEL_ENV["NTFY_TOKEN"]).start()
    daemons = []
    for name in ("daemon-a", "daemon-b"):
        extra = (f'\n[cluster]\ndaemon_id = "{name}"\nlease_secs = {LEASE}\n'
                 f'\n[channels.ntfy]\ntopic = "{TOPIC}"\nserver_url = "{ntfy.url}"\n'
                 'token_env = "NTFY_TOKEN"\ndefault_agent = "helper"\n')
        home = make_home(tmp_path / name, llm_config(fake_llm, extra))
        # Started one after the other, so daemon-a is the first to claim the ntfy adapter.
        daemons.append(Daemon(home, env_extra={**LLM_ENV, **CHANNEL_ENV, "AGENTD_DATABASE_URL": db_url}).start())
    proxy = ClusterNginx((daemons[0].port, daemons[1].port))
    yield daemons[0], daemons[1], proxy, ntfy
    proxy.stop()
    for d in daemons:
        d.stop()
    ntfy.stop()


def test_two_daemons_behind_nginx_act_as_one(cluster, fake_llm) -> None:
    a, b, proxy, ntfy = cluster
    view = requests.get(f"{a.url}/api/cluster", timeout=10).json()
    assert view["daemon_id"] == "daemon-a" and view["shared_database"] is True
    assert sorted(d["id"] for d in view["daemons"]) == ["daemon-a", "daemon-b"]
    assert view["channel_leaders"] == {"ntfy": "daemon-a"}
    # Plain requests are balanced over both daemons.
    seen = {requests.get(f"{proxy.url}/api/health", timeout=10).headers["X-Agentd-Daemon"] for _ in range(6)}
    assert seen == {"daemon-a", "daemon-b"}

    # -- created through one, messaged through the other ---------------------------------------
    created = requests.post(f"{proxy.url}/api/agents", timeout=30,
                            json={"manifest_toml": 'name = "helper"\nprofile = "minimal"\n'})
    assert created.status_code == 201, created.text
    helper = created.json()["agent_id"]
    creator = created.headers["X-Agentd-Daemon"]
    other = b if creator == "daemon-a" else a
    reply = say(other.url, helper, "hello from the other daemon")
    assert reply.status_code == 200, reply.text
    assert reply.json()["response"] == "echo: hello from the other daemon"
    for d in (a, b):
        assert [x["name"] for x in d.get("/api/agents").json()] == ["helper"]
        assert d.get(f"/api/agents/{helper}/session").json()["message_count"] == 2

    # -- a burst to one agent on both daemons runs one at a time -------------------------------
    burst = spawn(a.url, "burst")
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(say, (a if i % 2 else b).url, burst, f"[[slow:0.3]] burst {i}") for i in range(6)]
        answers = [f.result() for f in futures]
    assert [r.status_code for r in answers] == [200] * 6, [r.text for r in answers]
    assert sorted(r.json()["response"] for r in answers) == [f"echo: burst {i}" for i in range(6)]
    spans = sorted((ts(r["started_at"]), ts(r["ended_at"]), r["daemon_id"]) for r in runs(b.url, agent_id=burst))
    assert len(spans) == 6 and {s[2] for s in spans} == {"daemon-a", "daemon-b"}
    for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
        assert start >= end - 0.005, spans  # never two runs of the agent at once (5 ms clock slack)
    assert b.get(f"/api/agents/{burst}/session").json()["message_count"] == 12

    # -- streams go to the daemon running the agent (nginx: hash by agent id) ------------------
    streamer = spawn(proxy.url, "streamer")
    stream = requests.post(f"{proxy.url}/api/agents/{streamer}/message/stream",
                           json={"message": "[[slow:2]] streamed"}, stream=True, timeout=30)
    assert stream.status_code == 200
    owner = stream.headers["X-Agentd-Daemon"]
    elsewhere = b if owner == "daemon-a" else a
    wait_for(lambda: runs(a.url, agent_id=streamer, status="running"), 10, what="stream run started")
    refused = elsewhere.post(f"/api/agents/{streamer}/message/stream", json={"message": "hi"})
    assert refused.status_code == 409
    assert refused.json() == {"error": f"run is on daemon {owner}; route stream paths by agent id"}
    handshake = elsewhere.get(f"/api/agents/{streamer}/ws", headers={
        "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    assert handshake.status_code == 409 and handshake.json()["error"].startswith(f"run is on daemon {owner};")
    again = requests.post(f"{proxy.url}/api/agents/{streamer}/message/stream", json={"message": "second"},
                          stream=True, timeout=30)
    assert again.headers["X-Agentd-Daemon"] == owner  # sticky: same agent, same daemon
    first_body = "".join(c.decode() for c in stream.iter_content(None))
    second_body = "".join(c.decode() for c in again.iter_content(None))
    assert '"content":" streamed"' in first_body and "event: done" in first_body
    assert '"content":" second"' in second_body and "event: done" in second_body

    # -- approvals: requested on one daemon, decided on the other -------------------------------
    careful = spawn(a.url, "careful", "messaging")
    assert a.put(f"/api/agents/{careful}/mode", json={"mode": "Manual"}).status_code == 200
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(
        r=say(a.url, careful, '[[tool:memory_store {"key": "k", "value": "v"}]]')))
    t.start()
    pending = wait_for(lambda: [p for p in b.get("/api/approvals").json() if p["agent_id"] == careful],
                       10, what="approval visible on daemon-b")
    assert pending[0]["tool"] == "memory_store"
    assert b.post(f"/api/approvals/{pending[0]['id']}/approve").status_code == 200
    t.join(30)
    assert result["r"].status_code == 200, result["r"].text
    assert b.get(f"/api/memory/agents/{careful}/kv/k").json() == "v"  # the tool ran (read on b)

    # -- semantic memory: a fragment stored through one daemon is found by the other's index ----
    base = f"/api/memory/agents/{helper}"
    assert b.post(f"{base}/recall", json={"query": "favourite colour"}).status_code == 200  # b builds its index
    stored = a.post(f"{base}/memories", json={"content": "The user's favourite colour is teal."})
    assert stored.status_code == 201, stored.text

    def found_on_b() -> bool:
        hits = b.post(f"{base}/recall", json={"query": "favourite colour", "limit": 3}).json()["memories"]
        return any("teal" in m["content"] for m in hits)

    wait_for(found_on_b, 10, what="daemon-b's index to take in daemon-a's fragment")

    # -- budget: parallel runs on both daemons cannot overspend ----------------------------------
    probe = spawn(a.url, "probe")
    first = say(a.url, probe, "[[slow:1]] spend")
    cost = first.json()["cost_usd"]
    assert cost and cost > 0
    spent = a.get("/api/budget").json()["spent_usd"]
    limit = round(spent + cost / 2, 10)  # room for less than one more run
    assert b.put("/api/budget", json={"limit_usd": limit, "alert_levels": [0.5, 1.0]}).status_code == 200
    assert a.get("/api/budget").json()["alert_levels"] == [0.5, 1.0], "alert levels are shared like the limit"
    spenders = [spawn(a.url, f"spender{i}") for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(say, (a if i % 2 else b).url, agent, "[[slow:1]] spend")
                   for i, agent in enumerate(spenders)]
        answers = [f.result() for f in futures]
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 429, 429, 429, 429, 429], [r.text for r in answers]
    assert all("monthly budget reached" in r.json()["error"] for r in answers if r.status_code == 429)
    final = [d.get("/api/budget").json() for d in (a, b)]
    assert final[0]["spent_usd"] == final[1]["spent_usd"] == pytest.approx(spent + cost, rel=1e-6)
    assert final[0]["spent_usd"] < limit + cost  # at most the one run admitted under the limit
    assert a.put("/api/budget", json={"limit_usd": 0, "alert_levels": [0.8, 1.0]}).status_code == 200

    # -- the channel adapter runs on daemon-a only ---------------------------------------------
    wait_for(lambda: ntfy.subscriptions, 15, what="ntfy subscribed")
    ntfy.publish(TOPIC, "before the crash")
    wait_for(lambda: ntfy.bot_messages(TOPIC), 20, what="reply from daemon-a")
    time.sleep(LEASE)  # a second adapter (on daemon-b) would answer twice by now
    assert ntfy.bot_messages(TOPIC) == ["echo: before the crash"]
    assert {s["topic"] for s in ntfy.subscriptions} == {TOPIC} and len(ntfy.subscriptions) == 1

    # -- daemon-a dies mid-run: its run fails within the lease period, b's run survives ---------
    victim, survivor = spawn(a.url, "victim"), spawn(b.url, "survivor")
    hung: dict = {}
    threading.Thread(target=lambda: hung.update(r=_swallow(lambda: say(a.url, victim, "[[hang]]"))),
                     daemon=True).start()
    surviving: dict = {}
    t = threading.Thread(target=lambda: surviving.update(r=say(b.url, survivor, "[[slow:2.5]] still here")))
    t.start()
    wait_for(lambda: runs(b.url, agent_id=victim, status="running"), 10, what="victim's run on daemon-a")
    wait_for(lambda: runs(b.url, agent_id=survivor, status="running"), 10, what="survivor's run on daemon-b")
    a.kill()
    killed_at = time.monotonic()
    failed = wait_for(lambda: runs(b.url, agent_id=victim, status="failed"), 15, what="victim's run failed")
    # The lease runs out LEASE s after the last renewal; b's next heartbeat (LEASE/3) sees it.
    assert time.monotonic() - killed_at < LEASE + LEASE / 3 + 5.0  # generous slack: a loaded machine
    assert failed[0]["daemon_id"] == "daemon-a" and "daemon daemon-a stopped renewing" in failed[0]["error"]
    t.join(30)
    assert surviving["r"].status_code == 200 and surviving["r"].json()["response"] == "echo: still here"
    assert runs(b.url, agent_id=survivor)[0]["status"] == "completed"
    assert runs(b.url, status="running") == []
    # The victim is free again (its lease expired with its daemon): b runs it now.
    again = say(b.url, victim, "after the crash")
    assert again.status_code == 200 and again.json()["response"] == "echo: after the crash"
    # nginx skips the dead daemon.
    assert say(proxy.url, helper, "through the proxy").json()["response"] == "echo: through the proxy"

    # -- ...and daemon-b takes the channel adapter over ------------------------------------------
    wait_for(lambda: len(ntfy.subscriptions) == 2, 15, what="daemon-b subscribing to ntfy")
    assert requests.get(f"{b.url}/api/cluster", timeout=10).json()["channel_leaders"] == {"ntfy": "daemon-b"}
    ntfy.publish(TOPIC, "after the crash")
    wait_for(lambda: len(ntfy.bot_messages(TOPIC)) == 2, 20, what="reply from daemon-b")
    assert ntfy.bot_messages(TOPIC) == ["echo: before the crash", "echo: after the crash"]


def workflow_run(d: Daemon, run_id: str) -> dict:
    r = d.get(f"/api/workflows/runs/{run_id}", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_workflow_runs_belong_to_their_daemon(cluster) -> None:
    """A workflow run in progress on daemon-a survives daemon-b restarting (b's start fails
    only its own runs) and a finishes it; daemon-a SIGKILLed mid-workflow: b's reaper marks
    a's run failed within a lease period, with the reason, in the audit trail too."""
    a, b, _proxy, _ntfy = cluster
    spawn(a.url, "flow")
    created = a.post("/api/workflows", json={"name": "slow-flow", "steps": [
        {"name": "first", "agent_name": "flow"},
        # Each model call must end within the fake's 3 s client timeout: 10 naps of 2 s instead
        # (20 s: long enough for daemon-b to restart on a loaded machine before the run ends).
        {"name": "nap", "agent_name": "flow", "mode": "loop", "max_iterations": 10,
         "prompt": "[[slow:2]]{{input}}"}]})
    assert created.status_code == 201, created.text
    wid = created.json()["workflow_id"]
    finished: dict = {}
    t = threading.Thread(target=lambda: finished.update(
        r=a.post(f"/api/workflows/{wid}/run", json={"input": "survive"}, timeout=90)))
    t.start()

    def on_second_step() -> list:
        return [r for r in b.get(f"/api/workflows/{wid}/runs").json() if r["steps_completed"] == 1]

    # Its first step is one model call, but a loaded host can take long to get the run going.
    (run,) = wait_for(on_second_step, 60, what="the run on daemon-a reaching its slow step",
                      explain=lambda: (b.get(f"/api/workflows/{wid}/runs").json(), finished))
    assert run["state"] == {"status": "running"} and workflow_run(b, run["id"])["daemon_id"] == "daemon-a"
    b.stop()
    b.start()
    # b is back (it ran its startup recovery) while a still drives the run.
    assert workflow_run(b, run["id"])["state"] == {"status": "running"}
    t.join(60)
    assert finished["r"].status_code == 200, finished["r"].text
    assert finished["r"].json() == {"run_id": run["id"], "status": "completed", "output": "echo: " * 11 + "survive"}
    done = workflow_run(b, run["id"])
    assert done["state"] == {"status": "completed"} and done["error"] is None and done["steps_completed"] == 2

    # -- daemon-a dies mid-workflow: b fails its run within a lease period ----------------------
    hung: dict = {}
    threading.Thread(target=lambda: hung.update(r=_swallow(lambda: a.post(
        f"/api/workflows/{wid}/run", json={"input": "doomed"}, timeout=60))), daemon=True).start()
    # Killed once the slow step's agent run has its record (a loaded host can take a while
    # between the first step's end and the second's run starting), and just after one of its
    # 2 s naps began: a nap seen running may end before the kill lands, leaving no run to fail.
    (run,) = wait_for(lambda: runs(b.url, status="running")
                      and [r for r in on_second_step() if r["state"]["status"] == "running"], 20,
                      what="the second run's slow step running on daemon-a")
    seen = {r["id"] for r in runs(b.url, status="running")}
    wait_for(lambda: {r["id"] for r in runs(b.url, status="running")} - seen, 20, interval=0.02,
             what="the next nap's agent run starting on daemon-a")
    a.kill()
    killed_at = time.monotonic()
    failed = wait_for(lambda: workflow_run(b, run["id"])["state"] == {"status": "failed"}
                      and workflow_run(b, run["id"]), 15, what="daemon-a's workflow run failed by daemon-b")
    # a's heartbeat row goes stale LEASE s after its last beat; b's next heartbeat (LEASE/3) sees it.
    assert time.monotonic() - killed_at < LEASE + LEASE / 3 + 5.0  # generous slack: a loaded machine
    reason = ("daemon daemon-a stopped while the run was in progress "
              "(its lease expired; marked failed by daemon daemon-b)")
    assert failed["error"] == reason and failed["daemon_id"] == "daemon-a"
    assert failed["output"] == "" and failed["completed_at"] and failed["steps_completed"] == 1
    assert [r["step_name"] for r in failed["step_results"]] == ["first"]
    # The audit entry is written just after the run is marked failed.
    audit = wait_for(lambda: b.get("/api/audit/recent", params={"event": "workflow."}).json(), 10,
                     what="the failed run's audit entry")
    assert [(e["event"], e["subject"], e["detail"]) for e in audit] == \
        [("workflow.run_failed", run["id"], {"daemon_id": "daemon-a", "error": reason})]
    # The step's agent run died with a too (its own record, reaped the same way).
    wait_for(lambda: runs(b.url, status="failed"), 10, what="the step's agent run failed")
    assert runs(b.url, status="running") == []


def _swallow(fn):
    try:
        return fn()
    except requests.RequestException as exc:
        return exc
