"""Exact values and near-miss inputs for the core's guards, in process (fast, so mutation
testing can afford them). Each assertion message names the user-visible bug it catches.

The same behaviours are checked through the real daemon in tests/api/test_guards_daemon.py.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from flask import Flask, jsonify

from agentd.agents.loop_guard import BLOCK_AT, STOP_AFTER_BLOCKED, WARN_AT, LoopGuard, call_key
from agentd.api.errors import register_error_handlers
from agentd.api.middleware import allowed_origins, install_middleware, is_loopback
from agentd.api.ratelimit import GcraLimiter
from agentd.config import parse_config
from agentd.errors import TooManyRequests
from agentd.timestamps import utcnow
from agentd.llm.catalog import Catalog
from agentd.memory.kv import KvMemory
from agentd.metering import Metering, month_bounds
from agentd.store import open_store
from support import Clock, store_url_for


# -- loop guard -------------------------------------------------------------------------------

def test_loop_guard_counts_reordered_arguments_as_the_same_call() -> None:
    guard = LoopGuard()
    assert guard.check("file_read", {"path": "a", "limit": 5, "opts": {"x": 1, "y": [1, 2]}}).count == 1
    second = guard.check("file_read", {"opts": {"y": [1, 2], "x": 1}, "limit": 5, "path": "a"})
    assert second.count == 2, "BUG: loop guard treats the same call with reordered argument keys as a new call"
    assert call_key("t", {"b": 1, "a": 2}) == call_key("t", {"a": 2, "b": 1})
    # Different values or a different tool are different calls.
    assert guard.check("file_read", {"path": "b", "limit": 5, "opts": {"x": 1, "y": [1, 2]}}).count == 1
    assert guard.check("file_list", {"path": "a", "limit": 5, "opts": {"x": 1, "y": [1, 2]}}).count == 1
    assert call_key("t", {"a": [1, 2]}) != call_key("t", {"a": [2, 1]}), "list order is meaningful"
    assert call_key("ab", {"c": 1}) != call_key("a", {"bc": 1})


def test_loop_guard_thresholds_are_exact() -> None:
    assert (WARN_AT, BLOCK_AT, STOP_AFTER_BLOCKED) == (3, 5, 30)
    guard = LoopGuard()
    verdicts = [guard.check("t", {"a": 1}) for _ in range(6)]
    assert [v.action for v in verdicts] == ["allow", "allow", "warn", "warn", "block", "block"], \
        "BUG: loop guard warns/blocks one call early or late"
    assert [v.count for v in verdicts] == [1, 2, 3, 4, 5, 6]
    assert verdicts[0].message == "" and verdicts[1].message == ""
    assert verdicts[2].message == ("[loop guard] warning: tool 't' has been called 3 times with identical "
                                   "arguments; it will be blocked from call 5 on.")
    assert verdicts[4].message == ("blocked by loop guard: tool 't' was called 5 times with identical "
                                   "arguments; it was not run. Try a different approach.")
    assert guard.blocked == 2 and not guard.tripped
    for _ in range(STOP_AFTER_BLOCKED - 3):
        guard.check("t", {"a": 1})
    assert guard.blocked == 29 and not guard.tripped, "BUG: loop guard stops the run one blocked call early"
    guard.check("t", {"a": 1})
    assert guard.blocked == 30 and guard.tripped, "BUG: loop guard does not stop the run at 30 blocked calls"
    # A fresh guard per run: nothing carries over.
    assert LoopGuard().check("t", {"a": 1}).action == "allow"


# -- GCRA limiter -------------------------------------------------------------------------------

def test_gcra_exact_remaining_reset_and_retry() -> None:
    clock = Clock()
    limiter = GcraLimiter(rate=2, burst=4, clock=clock)   # one request per 0.5 s, 4 at once
    first = limiter.hit("ip")
    assert (first.allowed, first.remaining, first.reset_after, first.retry_after) == (True, 3, 0.5, 0.0)
    for expected_remaining, expected_reset in ((2, 1.0), (1, 1.5), (0, 2.0)):
        d = limiter.hit("ip")
        assert d.allowed and d.remaining == expected_remaining and d.reset_after == pytest.approx(expected_reset)
    refused = limiter.hit("ip")
    assert not refused.allowed and refused.remaining == 0
    assert refused.retry_after == pytest.approx(0.5) and refused.reset_after == pytest.approx(2.0)
    clock.now += 0.499
    assert not limiter.hit("ip").allowed, "BUG: GCRA lets a request through before retry_after elapsed"
    clock.now += 0.001
    ok = limiter.hit("ip")
    assert ok.allowed and ok.remaining == 0


def test_gcra_idle_client_gets_exactly_one_burst() -> None:
    clock = Clock()
    limiter = GcraLimiter(rate=10, burst=5, clock=clock)
    assert [limiter.hit("ip").allowed for _ in range(5)] == [True] * 5, \
        "BUG: the last request of a full burst is refused (float drift in the TAT)"
    clock.now += 10_000  # idle for hours
    decisions = [limiter.hit("ip") for _ in range(7)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2, \
        "BUG: a client idle for a long time may burst past the limit"
    assert [d.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
    # A brand-new client is the same as an idle one.
    assert sum(limiter.hit("new").allowed for _ in range(6)) == 5


def test_gcra_sweep_runs_every_n_calls_and_forgets_idle_clients() -> None:
    clock = Clock()
    limiter = GcraLimiter(rate=2, burst=5, clock=clock)
    assert (limiter.burst, limiter.interval, limiter.tolerance) == (5, 0.5, 2.5)
    limiter._SWEEP_EVERY = 4
    limiter.hit("a")
    clock.now += 100
    limiter.hit("b")          # call 2: a is idle but the sweep waits for call 4
    assert set(limiter._tat) == {"a", "b"}, "BUG: the idle-client sweep runs before every N-th call"
    clock.now += 100          # a and b are idle now
    limiter.hit("c")          # call 3: no sweep yet
    assert set(limiter._tat) == {"a", "b", "c"}, "BUG: the idle-client sweep runs before every N-th call"
    limiter.hit("d")          # call 4: sweep
    assert set(limiter._tat) == {"c", "d"}, "BUG: idle clients are never forgotten (the table grows without bound)"
    for key in "efg":
        limiter.hit(key)      # calls 5-7: no sweep
    assert set(limiter._tat) == {"c", "d", "e", "f", "g"}
    clock.now += 100
    limiter.hit("h")          # call 8: sweep again
    assert set(limiter._tat) == {"h"}


def test_gcra_boundary_is_exact() -> None:
    clock = Clock(1000.0)
    limiter = GcraLimiter(rate=2, burst=1, clock=clock)
    assert limiter.hit("ip").allowed
    clock.now = 1000.5 - 1e-6          # exactly when the next request is due (1 us slack)
    assert limiter.hit("ip").allowed, "BUG: a request exactly at its allowed time is refused"
    clock.now = 1001.0 - 2e-6          # just before the next one is due
    assert not limiter.hit("ip").allowed, "BUG: a request before its allowed time is let through"


def test_gcra_sweep_forgets_only_idle_clients() -> None:
    clock = Clock()
    limiter = GcraLimiter(rate=1, burst=1, clock=clock)
    limiter._SWEEP_EVERY = 3  # small table sweep so the test reaches it
    assert limiter.hit("busy").allowed
    assert not limiter.hit("busy").allowed
    assert not limiter.hit("busy").allowed  # third call sweeps: "busy" is not idle, must be kept
    assert not limiter.hit("busy").allowed, "BUG: the sweep forgot a client that is still limited"


# -- middleware headers through a real Flask app with a fake clock ------------------------------

def make_app(tmp_path: Path, clock: Clock, config_text: dict | None = None) -> Flask:
    data = {"api": {"rate_limit_per_second": 2, "rate_limit_burst": 3}, "api_listen": "127.0.0.1:4321"}
    data.update(config_text or {})
    config = parse_config(data, tmp_path)
    app = Flask("agentd-test")
    install_middleware(app, config, clock=clock)
    register_error_handlers(app)

    @app.route("/api/ping", methods=["GET", "POST"])
    def ping():
        return jsonify({"ok": True})

    @app.route("/v1/ping")
    def v1_ping():
        return jsonify({"ok": True})

    @app.route("/")
    def index():
        return "home"

    return app


def test_rate_limit_headers_exact_and_rounded_up(tmp_path: Path) -> None:
    clock = Clock()
    client = make_app(tmp_path, clock).test_client()
    seen = []
    for _ in range(3):
        r = client.get("/api/ping")
        assert r.status_code == 200
        seen.append((r.headers["X-RateLimit-Limit"], r.headers["X-RateLimit-Remaining"],
                     r.headers["X-RateLimit-Reset"]))
        clock.now += 0.1
    assert [s[0] for s in seen] == ["3"] * 3, "BUG: X-RateLimit-Limit is not the burst size"
    assert [s[1] for s in seen] == ["2", "1", "0"], "BUG: X-RateLimit-Remaining is wrong"
    # bucket full again after 0.5, 0.9 (=1.0-0.1), 1.3 s: rounded UP to whole seconds
    assert [s[2] for s in seen] == ["1", "1", "2"], "BUG: X-RateLimit-Reset is not rounded up"
    r = client.get("/api/ping")   # at t=0.3: next slot at 0.5 -> retry after 0.2 s
    assert r.status_code == 429
    assert r.get_json() == {"error": "rate limit exceeded: too many requests from this client"}
    assert r.headers["Retry-After"] == "1", "BUG: Retry-After rounded down (a client told to retry in 0 s)"
    assert r.headers["X-RateLimit-Remaining"] == "0" and r.headers["X-RateLimit-Limit"] == "3"
    assert r.headers["X-RateLimit-Reset"] == "2"   # 1.5 - 0.3 = 1.2 -> 2
    clock.now += 2.7   # t = 3.0, long idle: full burst, and never more
    codes = [client.get("/api/ping").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429], "BUG: idle-then-burst client gets more than the burst"
    r = client.get("/v1/ping")
    assert r.status_code == 429 and r.get_json()["error"]["type"] == "rate_limit_error"
    assert r.get_json()["error"]["code"] == "rate_limit_exceeded"
    # Retry-After for waits over a second are rounded up too, never down.
    clock.now += 0.0001
    assert client.get("/api/ping").headers["Retry-After"] == "1"


def test_retry_after_rounds_up_fractions_above_one_second(tmp_path: Path) -> None:
    clock = Clock()
    app = make_app(tmp_path, clock, {"api": {"rate_limit_per_second": 0.4, "rate_limit_burst": 1}})
    client = app.test_client()
    assert client.get("/api/ping").status_code == 200
    clock.now += 0.2
    r = client.get("/api/ping")   # next slot 2.5 s after the first -> 2.3 s away
    assert r.status_code == 429 and r.headers["Retry-After"] == "3", "BUG: Retry-After rounded down"
    assert r.headers["X-RateLimit-Reset"] == "3"
    assert r.headers["X-RateLimit-Limit"] == "1"


def test_pages_outside_the_api_are_not_rate_limited(tmp_path: Path) -> None:
    client = make_app(tmp_path, Clock()).test_client()
    for _ in range(10):
        r = client.get("/")
        assert r.status_code == 200 and "X-RateLimit-Limit" not in r.headers
    r = client.get("/api/ping")
    assert r.headers["X-RateLimit-Remaining"] == "2", "BUG: non-API pages spend the API rate budget"


KEY = "s3cret-key-123"


@pytest.mark.parametrize("presented", [
    "", "s", "s3cret-key-12", KEY + "4", KEY + " x", "S3CRET-KEY-123", "s3cret-key-124", " ",
])
def test_api_key_near_misses_are_refused(tmp_path: Path, presented: str) -> None:
    client = make_app(tmp_path, Clock(), {"api_key": KEY}).test_client()
    for headers in ({"Authorization": f"Bearer {presented}"}, {"X-API-Key": presented}):
        r = client.get("/api/ping", headers=headers, environ_base={"REMOTE_ADDR": "127.0.0.1"})
        assert r.status_code == 401, f"BUG: API key check accepts {presented!r} (prefix/extension/empty)"
        assert r.get_json()["error"] == "invalid API key" and r.headers["WWW-Authenticate"] == "Bearer"
    r = client.get(f"/api/ping?token={presented}")
    assert r.status_code == 401, f"BUG: ?token= accepts {presented!r}"


def test_api_key_exact_match_is_accepted_every_way(tmp_path: Path) -> None:
    client = make_app(tmp_path, Clock(), {"api_key": KEY, "api": {"rate_limit_per_second": 100,
                                                                  "rate_limit_burst": 100}}).test_client()
    assert client.get("/api/ping", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert client.get("/api/ping", headers={"X-API-Key": KEY}).status_code == 200
    assert client.get(f"/api/ping?token={KEY}").status_code == 200
    r = client.get("/api/ping")
    assert r.status_code == 401 and r.get_json()["error"] == "missing API key: send Authorization: Bearer <api_key>"
    assert r.headers["X-RateLimit-Limit"] == "100", "refused requests are rate limited too"
    r = client.get("/api/ping", headers={"Authorization": f"Basic {KEY}"})
    assert r.status_code == 401, "BUG: a non-Bearer Authorization scheme is accepted"
    r = client.get("/v1/ping", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.get_json()["error"]["type"] == "authentication_error"
    # Public routes stay public; everything else needs the key even from loopback.
    assert client.get("/").status_code == 200
    assert client.post("/api/ping").status_code == 401


def test_no_key_serves_loopback_only(tmp_path: Path) -> None:
    client = make_app(tmp_path, Clock()).test_client()
    assert client.get("/api/ping", environ_base={"REMOTE_ADDR": "127.0.0.1"}).status_code == 200
    assert client.get("/api/ping", environ_base={"REMOTE_ADDR": "127.9.9.9"}).status_code == 200
    r = client.get("/api/ping", environ_base={"REMOTE_ADDR": "10.0.0.7"})
    assert r.status_code == 401, "BUG: a non-loopback client is served without an API key"
    assert r.get_json()["error"] == (
        "API key required for non-loopback clients: set api_key in config.toml (or AGENTD_API_KEY) and "
        "send Authorization: Bearer <key>, or bind to 127.0.0.1")
    assert r.headers["WWW-Authenticate"] == "Bearer"
    assert client.get("/api/ping", environ_base={"REMOTE_ADDR": "::1"}).status_code == 200
    r = client.get("/api/ping", environ_base={"REMOTE_ADDR": "128.0.0.1"})
    assert r.status_code == 401


@pytest.mark.parametrize("addr, expected", [
    ("127.0.0.1", True), ("127.255.255.254", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("128.0.0.1", False), ("10.0.0.1", False), ("::ffff:10.0.0.1", False), ("", False), (None, False),
    ("localhost", False), ("fe80::1%eth0", False), ("::1%lo", True),
])
def test_is_loopback(addr, expected) -> None:
    assert is_loopback(addr) is expected


@pytest.mark.parametrize("origin", [
    "http://localhost.evil.example", "http://localhost:4321.evil", "http://localhost:4321.evil.example",
    "https://localhost:4321", "http://127.0.0.1:43210", "http://127.0.0.1:432", "http://evil.localhost:4321",
    "http://localhost", "http://127.0.0.1", "null", "http://localhost:30000", "http://localhost:80800",
    "https://app.example.com.evil", "https://evil-app.example.com", "http://app.example.com",
])
def test_cors_near_miss_origins_are_refused(tmp_path: Path, origin: str) -> None:
    client = make_app(tmp_path, Clock(), {"api_key": KEY,
                                          "api": {"cors_origins": ["https://app.example.com"]}}).test_client()
    r = client.options("/api/ping", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    assert r.status_code == 403, f"BUG: CORS preflight allows near-miss origin {origin}"
    assert r.get_json() == {"error": f"CORS origin {origin} is not allowed"}
    r = client.get("/api/ping", headers={"Origin": origin, "Authorization": f"Bearer {KEY}"})
    assert "Access-Control-Allow-Origin" not in r.headers, f"BUG: CORS allows near-miss origin {origin}"


@pytest.mark.parametrize("origin", [
    "http://localhost:4321", "http://127.0.0.1:4321", "http://localhost:3000", "http://127.0.0.1:8080",
    "https://app.example.com", "http://localhost:4321/",
])
def test_cors_allowed_origins(tmp_path: Path, origin: str) -> None:
    client = make_app(tmp_path, Clock(), {"api_key": KEY,
                                          "api": {"cors_origins": ["https://app.example.com"]}}).test_client()
    r = client.options("/api/ping", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    assert r.status_code == 204
    assert r.headers["Access-Control-Allow-Methods"] == "GET, POST, PUT, PATCH, DELETE, OPTIONS"
    assert r.headers["Access-Control-Allow-Headers"] == "Authorization, Content-Type, X-API-Key, X-Request-Id"
    assert r.headers["Access-Control-Max-Age"] == "600"
    r = client.get("/api/ping", headers={"Origin": origin, "Authorization": f"Bearer {KEY}"})
    assert r.headers["Access-Control-Allow-Origin"] == origin and "Origin" in r.headers.getlist("Vary")


def test_extra_cors_origins_need_an_api_key(tmp_path: Path) -> None:
    config = parse_config({"api_listen": "127.0.0.1:4321", "api": {"cors_origins": ["https://app.example.com"]}},
                          tmp_path)
    assert "https://app.example.com" not in allowed_origins(config), \
        "BUG: extra CORS origins honoured on a daemon without an API key"
    assert allowed_origins(config) == {f"http://{h}:{p}" for h in ("127.0.0.1", "localhost")
                                       for p in (4321, 3000, 8080)}


def test_security_headers(tmp_path: Path) -> None:
    client = make_app(tmp_path, Clock()).test_client()
    r = client.get("/api/ping")
    assert r.headers["X-Content-Type-Options"] == "nosniff" and r.headers["X-Frame-Options"] == "DENY"
    assert r.headers["Referrer-Policy"] == "strict-origin-when-cross-origin"
    assert r.headers["Cache-Control"] == "no-store"
    assert r.headers["Content-Security-Policy"] == "default-src 'none'; frame-ancestors 'none'"
    assert len(r.headers["X-Request-Id"]) == 32
    page = client.get("/")
    assert "Cache-Control" not in page.headers and page.headers["X-Frame-Options"] == "DENY"


# -- metering: exact cost, budget at the limit, month rollover ----------------------------------

class Now:
    """A UTC clock for Metering that the test moves across month ends."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


@pytest.fixture()
def store(tmp_path: Path):
    s = open_store(tmp_path / "agentd.db", store_url_for(tmp_path))
    yield s
    s.close() if hasattr(s, "close") else None


# gpt-4o in agentd/data/models.json: $2.50 per million input tokens, $10.00 per million output.
def test_cost_uses_the_catalogs_input_and_output_prices(store) -> None:
    metering = Metering(store, Catalog.load())
    cost = metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)
    # 1000 * 2.50 / 1e6 + 10 * 10.00 / 1e6 = 0.0025 + 0.0001
    assert cost == pytest.approx(0.0026, abs=1e-12), \
        "BUG: cost not computed from the catalog's input/output prices (tokens swapped?)"
    cost = metering.record("a1", "alpha", "openai", "gpt-4o", 7, 123_456)
    assert cost == pytest.approx(7 * 2.5e-6 + 123_456 * 1e-5, abs=1e-12)   # 0.0000175 + 1.23456
    totals = metering.totals(*metering.period(None, None))
    assert totals["total_input_tokens"] == 1007 and totals["total_output_tokens"] == 123_466
    assert totals["total_cost_usd"] == pytest.approx(1.2371775, abs=1e-10) and totals["requests"] == 2
    by_model = metering.by_model(*metering.period(None, None))
    assert by_model == [{"model": "gpt-4o", "input_tokens": 1007, "output_tokens": 123_466,
                         "cost_usd": pytest.approx(1.2371775, abs=1e-10), "requests": 2}]
    assert metering.record("a1", "alpha", "openai", "no-such-model", 10, 10) is None
    agents = metering.by_agent(*metering.period(None, None))
    assert agents[0]["agent_id"] == "a1" and agents[0]["spent_usd"] == pytest.approx(1.2371775, abs=1e-10)


def test_budget_exactly_at_the_limit_is_refused_just_under_is_allowed(store) -> None:
    metering = Metering(store, Catalog.load())
    metering.check_budget()   # no limit: never refused
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)      # $0.0026
    metering.set_limit(0.0026)
    with pytest.raises(TooManyRequests) as exc:
        metering.check_budget()
        pytest.fail("BUG: budget lets one more call through when spending is exactly at the limit")
    assert exc.value.message.startswith("message delivery failed: quota exceeded: monthly budget reached: $0.0026 of $")
    assert exc.value.retry_after >= 1
    metering.set_limit(0.0026 + 1e-9)
    metering.check_budget()   # just under the limit: allowed
    b = metering.budget()
    assert b["limit_usd"] == pytest.approx(0.0026 + 1e-9) and b["spent_usd"] == pytest.approx(0.0026)
    assert b["remaining_usd"] == pytest.approx(1e-9, abs=1e-12)
    assert b["limited"] is True
    metering.set_limit(0)
    metering.check_budget()
    assert metering.budget()["limited"] is False


def test_budget_alerts_fire_exactly_at_80_and_100_percent(store) -> None:
    metering = Metering(store, Catalog.load())
    metering.set_limit(0.0026 / 0.8 * 1.0000001)   # 80 % is just above one call
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)
    assert metering.budget()["alerts"] == [], "BUG: 80 % alert fires below 80 %"
    metering.set_limit(0.0026 / 0.8)   # exactly 80 %
    levels = [a["level"] for a in metering.budget()["alerts"]]
    assert levels == ["warning"], f"BUG: no 80 % alert exactly at 80 % ({levels})"
    metering.set_limit(0.0026)
    levels = [a["level"] for a in metering.budget()["alerts"]]
    assert levels == ["warning", "critical"], "BUG: no critical alert exactly at the limit"
    alert = metering.budget()["alerts"][1]
    assert alert["threshold"] == 1.0 and alert["limit_usd"] == 0.0026
    metering.set_limit(0)
    assert metering.budget()["alerts"] == []


def test_month_rolls_over(store) -> None:
    clock = Now(datetime(2026, 1, 31, 23, 59, 59, tzinfo=timezone.utc))
    metering = Metering(store, Catalog.load(), now=clock)
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)
    metering.set_limit(0.0026)
    with pytest.raises(TooManyRequests) as exc:
        metering.check_budget()
    assert exc.value.retry_after == 1   # one second to February
    b = metering.budget()
    assert b["period_start"] == "2026-01-01T00:00:00+00:00" and b["period_end"] == "2026-02-01T00:00:00+00:00"
    clock.at = datetime(2026, 2, 1, 0, 0, 0, tzinfo=timezone.utc)
    metering.check_budget()   # a new month: spending starts again at zero
    b = metering.budget()
    assert b["spent_usd"] == 0 and b["period_start"] == "2026-02-01T00:00:00+00:00", \
        "BUG: the monthly budget period does not roll over"
    assert b["period_end"] == "2026-03-01T00:00:00+00:00" and b["alerts"] == []
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)
    with pytest.raises(TooManyRequests):
        metering.check_budget()
    # Retry-After is the time to the period's end, rounded up (never "retry in 0 s" too early).
    clock.at = datetime(2026, 2, 28, 23, 59, 58, 250000, tzinfo=timezone.utc)
    with pytest.raises(TooManyRequests) as exc:
        metering.check_budget()
    assert exc.value.retry_after == 2, "BUG: the budget's Retry-After is rounded down"
    # January's spend is still reported for January.
    jan = metering.totals(datetime(2026, 1, 1, tzinfo=timezone.utc), datetime(2026, 2, 1, tzinfo=timezone.utc))
    assert jan["requests"] == 1 and jan["total_cost_usd"] == pytest.approx(0.0026)
    # A restart in February rebuilds February's total from the database only.
    again = Metering(store, Catalog.load(), now=clock)
    assert again.budget()["spent_usd"] == pytest.approx(0.0026)


@pytest.mark.parametrize("now, start, end", [
    (datetime(2026, 12, 31, 23, 59, tzinfo=timezone.utc), datetime(2026, 12, 1), datetime(2027, 1, 1)),
    (datetime(2024, 2, 10, tzinfo=timezone.utc), datetime(2024, 2, 1), datetime(2024, 3, 1)),
    (datetime(2025, 2, 28, 23, 59, tzinfo=timezone.utc), datetime(2025, 2, 1), datetime(2025, 3, 1)),
    (datetime(2026, 4, 1, tzinfo=timezone.utc), datetime(2026, 4, 1), datetime(2026, 5, 1)),
])
def test_month_bounds(now, start, end) -> None:
    assert month_bounds(now) == (start.replace(tzinfo=timezone.utc), end.replace(tzinfo=timezone.utc))


# -- KV memory: one agent never touches another's key of the same name --------------------------

def _agent(store, name: str) -> str:
    from pony import orm

    agent_id = str(uuid.uuid4())
    with orm.db_session:
        store.e.AgentRow(id=agent_id, name=name, manifest_toml="x", manifest={}, created_at=utcnow(),
                         last_active=utcnow(), session_id=str(uuid.uuid4()))
    return agent_id


def test_kv_same_key_in_two_agents_is_isolated(store) -> None:
    kv = KvMemory(store)
    a, b = _agent(store, "a"), _agent(store, "b")
    kv.set(a, "color", "blue")
    kv.set(b, "color", "red")
    kv.set(b, "size", 3)
    assert kv.get(a, "color") == (True, "blue") and kv.get(b, "color") == (True, "red"), \
        "BUG: KV get/put of one agent reads or overwrites another agent's key of the same name"
    kv.set(a, "color", "green")
    assert kv.get(b, "color") == (True, "red"), "BUG: KV put overwrote another agent's key"
    assert kv.all(a) == {"color": "green"}, "BUG: KV list shows another agent's keys"
    assert kv.all(b) == {"color": "red", "size": 3}
    assert kv.delete(a, "color") is True
    assert kv.get(b, "color") == (True, "red"), "BUG: KV delete removed another agent's key of the same name"
    assert kv.get(a, "color") == (False, None)
    assert kv.delete(a, "color") is False and kv.delete(a, "size") is False
    assert kv.all(b) == {"color": "red", "size": 3}
    kv.set(a, "keep", 1)
    kv.set(a, "drop", 2)
    assert kv.delete(a, "drop") is True and kv.all(a) == {"keep": 1}, "BUG: KV delete removed the wrong key"
    assert kv.delete(a, "missing") is False and kv.all(a) == {"keep": 1}, \
        "BUG: deleting a missing key removed another key of the same agent"
    kv.set(a, "z", 0)
    kv.set(a, "b", [1])
    kv.set(a, "a", {"k": 1})
    assert list(kv.all(a)) == ["a", "b", "keep", "z"], "KV list is sorted by key"


# -- error shapes (agentd/api/errors.py) ------------------------------------------------------------

def error_app(tmp_path: Path) -> Flask:
    from agentd import errors

    app = make_app(tmp_path, Clock(), {"api": {"rate_limit_per_second": 1000, "rate_limit_burst": 1000}})
    app.config["MAX_CONTENT_LENGTH"] = 100
    kinds = {"bad": errors.BadRequest, "unauth": errors.Unauthorized, "forbidden": errors.Forbidden,
             "missing": errors.NotFound, "conflict": errors.Conflict, "large": errors.PayloadTooLarge,
             "quota": errors.TooManyRequests}

    def raiser(kind: str):
        retry = request_arg("retry", None)  # none given: a 429 that names no delay of its own
        extra = {"retry_after": float(retry or 0)} if kind == "quota" and retry is not None else {}
        code = request_arg("code", None)
        raise kinds[kind](f"{kind} happened", code=code, **extra)

    def boom():
        raise RuntimeError("secret internal detail")

    def upload():
        from flask import request as r
        r.get_data()
        return jsonify({"ok": True})

    from werkzeug import exceptions as wz

    def teapot():
        raise wz.ImATeapot(description="")

    def odd():
        raise wz.UnsupportedMediaType(description="only JSON here. Really X.")

    app.add_url_rule("/api/teapot", "teapot", teapot)
    app.add_url_rule("/api/odd", "odd", odd)
    app.add_url_rule("/page/raise/<kind>", "raise_page", raiser)  # a dashboard path: HTML errors
    for prefix in ("/api", "/v1"):
        app.add_url_rule(f"{prefix}/raise/<kind>", f"raise{prefix}", raiser)
        app.add_url_rule(f"{prefix}/boom", f"boom{prefix}", boom)
        app.add_url_rule(f"{prefix}/upload", f"upload{prefix}", upload, methods=["POST"])
    return app


def request_arg(name: str, default):
    from flask import request
    return request.args.get(name, default)


@pytest.mark.parametrize("kind, status, openai_type", [
    ("bad", 400, "invalid_request_error"), ("unauth", 401, "authentication_error"),
    ("forbidden", 403, "permission_error"), ("missing", 404, "invalid_request_error"),
    ("conflict", 409, "invalid_request_error"), ("large", 413, "invalid_request_error"),
    ("quota", 429, "rate_limit_error"),
])
def test_error_shapes_native_and_openai(tmp_path: Path, kind: str, status: int, openai_type: str) -> None:
    client = error_app(tmp_path).test_client()
    r = client.get(f"/api/raise/{kind}")
    assert r.status_code == status and r.get_json() == {"error": f"{kind} happened"}
    r = client.get(f"/v1/raise/{kind}?code=some_code")
    assert r.status_code == status
    assert r.get_json() == {"error": {"message": f"{kind} happened", "type": openai_type, "code": "some_code"}}
    r = client.get(f"/v1/raise/{kind}")
    assert "code" not in r.get_json()["error"]


@pytest.mark.parametrize("retry, header", [("0.01", "1"), ("0.999", "1"), ("1", "1"), ("1.001", "2"),
                                           ("59.5", "60"), ("0", "1")])
def test_retry_after_header_is_rounded_up(tmp_path: Path, retry: str, header: str) -> None:
    client = error_app(tmp_path).test_client()
    r = client.get(f"/api/raise/quota?retry={retry}")
    assert r.status_code == 429 and r.headers["Retry-After"] == header, \
        f"BUG: Retry-After for {retry}s is {r.headers.get('Retry-After')}, expected {header} (rounded up)"
    assert "Retry-After" not in client.get("/api/raise/bad").headers


def test_the_retry_after_value_of_a_delay_and_of_none() -> None:
    from agentd.api.errors import retry_after_header

    assert [retry_after_header(s) for s in (None, 0, 0.2, 1.0, 7.3)] == ["1", "1", "1", "1", "8"]


@pytest.mark.parametrize("path", ["/api/raise/quota", "/v1/raise/quota"])
def test_a_429_without_a_delay_of_its_own_still_says_retry_after(tmp_path: Path, path: str) -> None:
    """The spec: `Retry-After` on 429, also when the cause (a provider's bare 429) named none."""
    r = error_app(tmp_path).test_client().get(path)
    assert (r.status_code, r.headers.get("Retry-After")) == (429, "1")


@pytest.mark.parametrize("query, header", [("", "1"), ("?retry=2.5", "3"), ("?retry=0.2", "1")])
def test_a_dashboard_429_is_a_page_with_retry_after(tmp_path: Path, caplog, query: str, header: str) -> None:
    """Off the API an error is an HTML page; without the dashboard's templates (this bare app)
    it is the built-in fallback page, and the failed render is one log line."""
    client = error_app(tmp_path).test_client()
    with caplog.at_level("ERROR", logger="agentd.api"):
        r = client.get(f"/page/raise/quota{query}")
    assert (r.status_code, r.mimetype, r.headers["Retry-After"]) == (429, "text/html", header)
    assert r.get_data(as_text=True) == "<!doctype html><title>Error 429</title><h1>Error 429</h1><p>quota happened</p>"
    assert [rec.getMessage() for rec in caplog.records if rec.name.startswith("agentd")] == \
        ["error page failed to render"]
    r = client.get("/page/raise/bad")
    assert r.status_code == 400 and "Retry-After" not in r.headers
    assert r.get_data(as_text=True).endswith("<p>bad happened</p>")


def test_json_paths_are_api_and_v1_exactly() -> None:
    from agentd.api.errors import is_api_path
    assert is_api_path("/api") and is_api_path("/v1") and is_api_path("/api/x") and is_api_path("/v1/x")
    assert is_api_path("/metrics") and not is_api_path("/metrics/x")
    assert not any(is_api_path(p) for p in ("/", "/agents", "/apix", "/v1x", "/API", "/V1", "/x/api"))


def test_http_errors_are_json(tmp_path: Path) -> None:
    client = error_app(tmp_path).test_client()
    r = client.get("/api/nope")
    assert r.status_code == 404 and r.get_json() == {"error": "not found: GET /api/nope"}
    r = client.get("/v1/nope")
    assert r.get_json() == {"error": {"message": "not found: GET /v1/nope", "type": "invalid_request_error"}}
    # A trailing slash names the route it missed (only one the method has).
    r = client.post("/api/upload/")
    assert r.status_code == 404 and r.get_json() == {
        "error": "not found: POST /api/upload/ (the route is /api/upload, without the trailing slash)"}
    r = client.post("/api/upload//")
    assert r.get_json() == {"error": "not found: POST /api/upload// (the route is /api/upload, without the trailing slash)"}
    assert client.get("/api/nope/").get_json() == {"error": "not found: GET /api/nope/"}
    assert client.put("/api/upload/").get_json() == {"error": "not found: PUT /api/upload/"}
    r = client.delete("/api/upload")
    assert r.status_code == 405 and r.get_json() == {"error": "method DELETE not allowed on /api/upload"}
    assert r.headers["Allow"] == "OPTIONS, POST"
    r = client.get("/api/teapot")
    assert r.status_code == 418 and r.get_json() == {"error": "I'm a teapot"}
    r = client.get("/api/odd")
    assert r.status_code == 415 and r.get_json() == {"error": "only JSON here. Really X"}, \
        "werkzeug's description without its final period"
    r = client.post("/v1/upload", data=b"x" * 101)
    assert r.status_code == 413 and r.get_json()["error"]["message"] == "request body too large"
    assert r.get_json()["error"]["type"] == "invalid_request_error"


def test_unexpected_errors_hide_the_detail(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    client = error_app(tmp_path).test_client()
    r = client.get("/api/boom")
    request_id = r.headers["X-Request-Id"]
    assert r.status_code == 500 and r.get_json() == {"error": f"internal server error (request id {request_id})"}
    assert "secret" not in r.get_data(as_text=True)
    logged = [rec for rec in caplog.records if rec.name == "agentd.api" and rec.exc_info]
    assert [rec.getMessage() for rec in logged] == [f"unhandled error in GET /api/boom (request {request_id})"], \
        "the failure is logged once with method, path, request id and traceback"
    r = client.get("/v1/boom")
    assert r.get_json()["error"]["type"] == "server_error" and "code" not in r.get_json()["error"]


def test_public_routes_need_no_key_and_only_for_get(tmp_path: Path) -> None:
    app = make_app(tmp_path, Clock(), {"api_key": KEY, "api": {"rate_limit_per_second": 100,
                                                               "rate_limit_burst": 100}})

    @app.route("/api/health", methods=["GET", "POST"])
    def health():
        return jsonify({"status": "ok"})

    @app.route("/api/version")
    def version():
        return jsonify({"version": "x"})

    @app.route("/favicon.ico")
    def favicon():
        return "icon"

    client = app.test_client()
    for path in ("/api/health", "/api/version", "/favicon.ico", "/"):
        assert client.get(path).status_code == 200, f"BUG: public {path} needs a key"
        assert client.head(path).status_code == 200
    assert client.get("/static/no-such-file.css").status_code == 404, "static files are public (404 here, not 401)"
    assert client.post("/api/health").status_code == 401, "BUG: a public path accepts POST without a key"
    for path in ("/api/healthz", "/api/health/x", "/api/versions", "/staticx/a", "/api/static/a"):
        assert client.get(path).status_code == 401, f"BUG: {path} is treated as public"


def test_metering_reports_have_exact_shapes_and_running_totals(store) -> None:
    clock = Now(datetime(2026, 3, 10, 12, 0, tzinfo=timezone.utc))
    metering = Metering(store, Catalog.load(), now=clock)
    assert metering.limit_usd == 0, "a fresh install has no budget limit"
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)       # 0.0026
    metering.record("a1", "alpha", "openai", "gpt-4o", 2000, 30)       # 0.0053
    metering.record("b2", "beta", "openai", "no-such-model", 50, 70)   # unpriced: $0
    assert metering.budget()["spent_usd"] == pytest.approx(0.0079, abs=1e-12), \
        "BUG: the running budget total is not the sum of the recorded costs"
    start, end = metering.period(None, None)
    assert (start, end) == (datetime(2026, 3, 1, tzinfo=timezone.utc), datetime(2026, 4, 1, tzinfo=timezone.utc))
    assert metering.totals(start, end) == {
        "total_input_tokens": 3050, "total_output_tokens": 110, "total_cost_usd": pytest.approx(0.0079, abs=1e-12),
        "requests": 3, "period_start": "2026-03-01T00:00:00+00:00", "period_end": "2026-04-01T00:00:00+00:00"}
    assert metering.by_agent(start, end) == [
        {"agent_id": "a1", "agent_name": "alpha", "spent_usd": pytest.approx(0.0079, abs=1e-12),
         "input_tokens": 3000, "output_tokens": 40},
        {"agent_id": "b2", "agent_name": "beta", "spent_usd": 0.0, "input_tokens": 50, "output_tokens": 70}]
    assert [r["model"] for r in metering.by_model(start, end)] == ["gpt-4o", "no-such-model"]
    from pony import orm
    with orm.db_session:
        priced = store.db.select("SELECT model, priced FROM usage ORDER BY id")
    assert [tuple(r) for r in priced] == [("gpt-4o", 1), ("gpt-4o", 1), ("no-such-model", 0)], \
        "usage rows record whether the model had a price"
    # An explicit window narrows the report.
    since = datetime(2026, 3, 10, 12, 0, 1, tzinfo=timezone.utc)
    assert metering.period(since, None) == (since, end)
    assert metering.totals(since, end)["requests"] == 0


def test_budget_limit_survives_a_restart(store) -> None:
    metering = Metering(store, Catalog.load())
    metering.set_limit(12.5)
    assert Metering(store, Catalog.load()).limit_usd == 12.5, "BUG: the budget limit is lost on restart"
    metering.set_limit(0)
    again = Metering(store, Catalog.load())
    assert again.limit_usd == 0
    again.record("a1", "alpha", "openai", "gpt-4o", 10**6, 10**6)     # $12.50
    again.check_budget()   # 0 = unlimited


def test_report_windows_honour_time_zones(store, monkeypatch: pytest.MonkeyPatch) -> None:
    import time as time_module

    # The machine's zone must not matter: the database holds UTC wall time.
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time_module.tzset()
    try:
        clock = Now(datetime(2026, 1, 31, 23, 30, tzinfo=timezone.utc))
        metering = Metering(store, Catalog.load(), now=clock)
        metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)
        plus_one = timezone(timedelta(hours=1))
        # 2026-02-01 00:00 at +01:00 is 2026-01-31 23:00 UTC: the record is inside.
        window = (datetime(2026, 2, 1, 0, 0, tzinfo=plus_one), datetime(2026, 2, 1, 1, 0, tzinfo=plus_one))
        assert metering.totals(*window)["requests"] == 1, "BUG: report windows ignore the time zone offset"
        naive = (datetime(2026, 1, 31, 23, 0), datetime(2026, 2, 1, 0, 0))   # naive = UTC
        assert metering.totals(*naive)["requests"] == 1, "BUG: naive times are read as local time, not UTC"
        assert metering.totals(datetime(2026, 1, 31, 23, 31), datetime(2026, 2, 1))["requests"] == 0
    finally:
        monkeypatch.delenv("TZ")
        time_module.tzset()
