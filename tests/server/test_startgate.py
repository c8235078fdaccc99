"""Listen first (cold start): the liveness probe answers while the app loads,
every other request waits for the app and gets the app's own answer."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import requests

from agentd.config import parse_config
from agentd.server.startgate import StartGate
from support import Daemon, make_home


def _gate() -> StartGate:
    return StartGate(parse_config({"api": {"rate_limit_per_second": 10, "rate_limit_burst": 3}}, Path("/tmp")))


def _call(gate: StartGate, **environ: str) -> tuple[str, dict[str, str], bytes]:
    seen: dict = {}

    def start_response(status: str, headers: list) -> None:
        seen["status"], seen["headers"] = status, dict(headers)

    env = {"REQUEST_METHOD": "GET", "PATH_INFO": "/api/health", "REMOTE_ADDR": "127.0.0.1",
           "HTTP_HOST": "127.0.0.1:4200", **environ}
    body = b"".join(gate(env, start_response))
    return seen["status"], seen["headers"], body


def test_gate_answers_the_plain_probe_and_counts_it_against_the_rate_limit() -> None:
    gate = _gate()
    status, headers, body = _call(gate)
    assert (status, body) == ("200 OK", b'{"status":"ok"}\n')
    assert headers["X-RateLimit-Limit"] == "3" and headers["X-RateLimit-Remaining"] == "2"
    assert headers["Cache-Control"] == "no-store" and headers["X-Frame-Options"] == "DENY"
    assert len(headers["X-Request-Id"]) == 32
    # The limiter handed to the app is the same object: the budget continues there.
    assert gate.limiter.hit("127.0.0.1").remaining == 1


def test_gate_holds_other_requests_until_the_app_is_open_then_the_app_answers() -> None:
    gate = _gate()
    answers: list = []

    def app(environ, start_response):
        start_response("201 Created", [("X-From", "app")])
        return [environ["PATH_INFO"].encode()]

    waiting = [threading.Thread(target=lambda kw=kw: answers.append(_call(gate, **kw)))
               for kw in ({"PATH_INFO": "/api/agents"}, {"HTTP_HOST": "evil.example"},
                          {"HTTP_ORIGIN": "http://127.0.0.1:4200"}, {"REQUEST_METHOD": "POST"})]
    for t in waiting:
        t.start()
    time.sleep(0.3)
    assert answers == [], "requests the gate cannot answer exactly like the app must wait"
    gate.open(app)
    for t in waiting:
        t.join(5)
    assert sorted(a[2] for a in answers) == [b"/api/agents", b"/api/health", b"/api/health", b"/api/health"]
    assert all(a[0] == "201 Created" and a[1] == {"X-From": "app"} for a in answers)
    assert _call(gate)[0] == "201 Created", "once open, even the probe is the app's"


def test_gate_answers_waiting_requests_503_when_the_start_fails() -> None:
    gate = _gate()
    result: list = []
    t = threading.Thread(target=lambda: result.append(_call(gate, PATH_INFO="/api/status")))
    t.start()
    gate.fail("database /x/agentd.db is locked by another process")
    t.join(5)
    status, headers, body = result[0]
    assert status == "503 Service Unavailable" and headers["Retry-After"] == "1"
    assert body == b'{"error": "agentd failed to start: database /x/agentd.db is locked by another process"}'


def test_daemon_is_healthy_before_its_kernel_and_requests_meanwhile_wait_for_it(tmp_path: Path) -> None:
    d = Daemon(make_home(tmp_path), env_extra={"AGENTD_TEST_BOOT_DELAY": "3"}).start(wait=False)
    deadline = time.monotonic() + 30   # not wait_healthy(): that also waits for the app
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{d.url}/api/health", timeout=1).ok:
                break
        except requests.RequestException:
            time.sleep(0.02)
    listed: list = []
    waiter = threading.Thread(target=lambda: listed.append(requests.get(f"{d.url}/api/agents", timeout=60)))
    waiter.start()
    early = requests.get(f"{d.url}/api/health", timeout=5)
    assert waiter.is_alive(), "GET /api/agents was answered before the kernel could be ready"
    waiter.join(60)
    assert listed[0].status_code == 200 and listed[0].json() == []
    late = requests.get(f"{d.url}/api/health", timeout=5)
    assert early.status_code == late.status_code == 200 and early.content == late.content
    skip = {"Date", "X-Request-Id", "X-RateLimit-Remaining"}
    assert {k: v for k, v in early.headers.items() if k not in skip} == \
        {k: v for k, v in late.headers.items() if k not in skip}, "the gate's probe differs from the app's"
    refused = requests.get(f"{d.url}/api/health", headers={"Host": "evil.example"}, timeout=5)
    assert refused.status_code == 400 and refused.json() == {"error": "host not allowed"}
    assert "agentd ready" in d.log()
    d.stop()


def test_the_probes_answered_during_the_start_count_against_the_apps_rate_limit(tmp_path: Path) -> None:
    """One limiter for the gate and the app: a client that spent its burst on the gate's
    probes is not given a fresh one when the app takes over."""
    home = make_home(tmp_path, "[api]\nrate_limit_per_second = 0.01\nrate_limit_burst = 3\n")
    d = Daemon(home, env_extra={"AGENTD_TEST_BOOT_DELAY": "2"}).start(wait=False)
    try:
        deadline = time.monotonic() + 30
        first = None
        while first is None and time.monotonic() < deadline:
            try:
                first = requests.get(f"{d.url}/api/health", timeout=1)
            except requests.RequestException:
                time.sleep(0.02)
        second = requests.get(f"{d.url}/api/health", timeout=5)
        assert "agentd ready" not in d.log(), "the app took over before both probes were answered"
        assert [r.headers["X-RateLimit-Remaining"] for r in (first, second)] == ["2", "1"]
        while "agentd ready" not in d.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        last = requests.get(f"{d.url}/api/health", timeout=5)
        refused = requests.get(f"{d.url}/api/health", timeout=5)
        assert (last.status_code, last.headers["X-RateLimit-Remaining"]) == (200, "0")
        assert refused.status_code == 429
    finally:
        d.stop()
