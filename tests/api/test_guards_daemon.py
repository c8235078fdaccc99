"""Exact values users read, and near-miss inputs to every guard, through the real daemon.

Each assertion message names the bug it catches. tests/api/test_core.py has the
same checks in process with a fake clock; these prove the daemon wires them up.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid

import pytest
import requests

from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from support import FAST_API, Daemon
from tests.agents.test_agents import say, spawn

GPT4O = '[model]\nprovider = "openai"\nmodel = "gpt-4o"\n'
# agentd/data/models.json, gpt-4o: $2.50 per million input tokens, $10.00 per million output tokens.
GPT4O_IN, GPT4O_OUT = 2.50 / 1e6, 10.00 / 1e6


def gpt4o_cost(input_tokens: int, output_tokens: int) -> float:
    return input_tokens * GPT4O_IN + output_tokens * GPT4O_OUT


# -- cost and budget ------------------------------------------------------------------------------

def test_cost_and_budget_exact(daemon_factory, fake_llm) -> None:
    d = daemon_factory(llm_config(fake_llm, NO_REMEMBERING), env_extra=LLM_ENV)
    agent_id = spawn(d, extra='profile = "coding"', model=GPT4O)
    body = say(d, agent_id, "[[reply:ok]] " + "padding " * 40).json()
    inp, out = body["input_tokens"], body["output_tokens"]
    assert out == 1 and inp > 40   # different counts, so swapped prices show
    cost = body["cost_usd"]
    assert cost == pytest.approx(gpt4o_cost(inp, out), abs=1e-12), \
        f"BUG: cost {cost} is not the catalog's price for {inp} in / {out} out tokens (swapped?)"

    # Budget exactly at the limit: refused. Just under: allowed.
    assert d.put("/api/budget", json={"limit_usd": cost}).json() == {"status": "updated", "limit_usd": cost}
    r = say(d, agent_id, "one more")
    assert r.status_code == 429, "BUG: budget lets one more call through when spending is exactly at the limit"
    assert r.json()["error"].startswith("message delivery failed: quota exceeded: monthly budget reached")
    assert int(r.headers["Retry-After"]) >= 1
    b = d.get("/api/budget").json()
    assert b["spent_usd"] == pytest.approx(cost, abs=1e-12) and b["remaining_usd"] == 0
    assert [a["level"] for a in b["alerts"]] == ["warning", "critical"]
    d.put("/api/budget", json={"limit_usd": cost + 1e-7})
    r = say(d, agent_id, "[[reply:ok]] just under")
    assert r.status_code == 200, f"BUG: a run just under the budget is refused: {r.text}"
    d.put("/api/budget", json={"limit_usd": 0})

    # A tool-calling turn: two model calls, each priced exactly; totals equal the sum.
    body = say(d, agent_id, '[[tool:file_list {"path": "."}]]').json()
    assert body["iterations"] == 2
    assert body["cost_usd"] == pytest.approx(gpt4o_cost(body["input_tokens"], body["output_tokens"]), abs=1e-12)
    [row] = d.get("/api/usage/by-model").json()
    assert row["model"] == "gpt-4o" and row["requests"] == 4
    assert row["input_tokens"] != row["output_tokens"]
    assert row["cost_usd"] == pytest.approx(gpt4o_cost(row["input_tokens"], row["output_tokens"]), abs=1e-9), \
        "BUG: usage records are not priced at the catalog's input/output prices"
    totals = d.get("/api/usage").json()
    assert totals["total_cost_usd"] == pytest.approx(row["cost_usd"], abs=1e-12) and totals["requests"] == 4
    [per_agent] = d.get("/api/budget/agents").json()
    assert per_agent["agent_id"] == agent_id and per_agent["spent_usd"] == pytest.approx(row["cost_usd"])


# -- rate limit headers through the daemon ----------------------------------------------------------

class SourceAddress(requests.adapters.HTTPAdapter):
    """Connect from another loopback address: the limiter keys clients by IP, so each test
    client gets a fresh bucket of its own (no waiting for the start-up checks to refill)."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.address, 0)
        return super().init_poolmanager(*args, **kwargs)


def client_from(address: str) -> requests.Session:
    session = requests.Session()
    session.mount("http://", SourceAddress(address))
    return session


def within_a_second(d: Daemon, n: int, *addresses: str) -> tuple[requests.Session, list[requests.Response]]:
    """`n` requests of one client, all sent within a second: from the next address again when
    a slow host spread them out further (the bucket refilled meanwhile)."""
    for address in addresses:
        client = client_from(address)
        started = time.monotonic()
        rs = [client.get(f"{d.url}/api/agents", timeout=10) for _ in range(n)]
        if time.monotonic() - started < 1.0:
            break
    return client, rs


def test_rate_limit_headers_through_the_daemon(daemon_factory) -> None:
    # One request per 2 s, 3 at once: the values below hold for requests within a second.
    d = daemon_factory("[api]\nrate_limit_per_second = 0.5\nrate_limit_burst = 3\nshutdown_grace_secs = 5\n")
    client, rs = within_a_second(d, 4, "127.0.0.2", "127.0.0.12", "127.0.0.22")
    assert [r.status_code for r in rs] == [200, 200, 200, 429]
    assert [r.headers["X-RateLimit-Limit"] for r in rs] == ["3"] * 4, \
        "BUG: X-RateLimit-Limit reports the per-second rate instead of the burst"
    assert [r.headers["X-RateLimit-Remaining"] for r in rs] == ["2", "1", "0", "0"]
    # the bucket is full again after 2, ~4, ~6 s: rounded up
    assert [r.headers["X-RateLimit-Reset"] for r in rs] == ["2", "4", "6", "6"], \
        "BUG: X-RateLimit-Reset is rounded down"
    assert rs[3].headers["Retry-After"] == "2", "BUG: Retry-After rounded down"
    assert rs[3].json() == {"error": "rate limit exceeded: too many requests from this client"}
    r = client.post(f"{d.url}/v1/chat/completions", json={}, timeout=10)
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    # Another client has its own full bucket.
    other = client_from("127.0.0.3")
    assert [other.get(f"{d.url}/api/agents", timeout=10).status_code for _ in range(4)] == [200, 200, 200, 429]


def test_idle_client_bursts_exactly_the_burst_through_the_daemon(daemon_factory) -> None:
    d = daemon_factory("[api]\nrate_limit_per_second = 1\nrate_limit_burst = 3\nshutdown_grace_secs = 5\n")
    client = client_from("127.0.0.4")
    for _ in range(3):
        client.get(f"{d.url}/api/agents", timeout=10)
    time.sleep(4.0)   # idle longer than the 3 s refill
    started = time.monotonic()
    codes = [client.get(f"{d.url}/api/agents", timeout=10).status_code for _ in range(7)]
    took = time.monotonic() - started
    # The burst, plus at most what refilled during the burst itself (1/s) on a slow machine.
    assert codes[:3] == [200, 200, 200], codes
    assert codes.count(200) <= 3 + math.ceil(took * 1.0), \
        f"BUG: an idle client may burst past the limit: {codes} in {took:.2f}s"


def test_the_rate_is_also_the_burst_unless_configured(daemon_factory) -> None:
    """The spec's "30 requests per second": within any second a client gets no more than the
    rate, so the burst defaults to one second's worth (also when only the rate is set)."""
    d = daemon_factory("")  # no config at all: the defaults
    r = client_from("127.0.0.5").get(f"{d.url}/api/agents", timeout=10)
    assert (r.headers["X-RateLimit-Limit"], r.headers["X-RateLimit-Remaining"]) == ("30", "29"), \
        "BUG: the default burst lets a client send more than 30 requests in its first second"
    d = daemon_factory("[api]\nrate_limit_per_second = 1\nshutdown_grace_secs = 5\n")
    _, rs = within_a_second(d, 2, "127.0.0.6", "127.0.0.7", "127.0.0.8")
    assert [(r.status_code, r.headers["X-RateLimit-Limit"]) for r in rs] == [(200, "1"), (429, "1")], \
        "BUG: one request per second let a second request through at once"
    assert rs[1].headers["Retry-After"] == "1"


# -- API key and CORS near misses -----------------------------------------------------------------

KEY = "k-" + "7" * 30


def test_api_key_near_misses_through_the_daemon(daemon_factory) -> None:
    d = daemon_factory(api_key=KEY, env_extra={"AGENTD_API_KEY": KEY})
    url = f"{d.url}/api/agents"
    for bad in ("", KEY[:-1], KEY[:1], KEY + "7", KEY + " x", KEY.upper(), "k-" + "7" * 29 + "8"):
        for headers in ({"Authorization": f"Bearer {bad}"}, {"X-API-Key": bad}):
            r = requests.get(url, headers=headers, timeout=10)
            assert r.status_code == 401, f"BUG: API key check accepts {bad!r} (prefix, extension or empty)"
        r = requests.get(url, params={"token": bad}, timeout=10)
        assert r.status_code == 401, f"BUG: ?token= accepts {bad!r}"
    assert requests.get(url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10).status_code == 200
    assert requests.get(url, headers={"X-API-Key": KEY}, timeout=10).status_code == 200
    assert requests.get(f"{d.url}/api/health", timeout=10).status_code == 200


def test_cors_near_misses_through_the_daemon(daemon_factory) -> None:
    d = daemon_factory()
    good = f"http://localhost:{d.port}"
    for origin in ("http://localhost.evil.example", f"http://localhost:{d.port}.evil",
                   f"https://localhost:{d.port}", f"http://localhost:{d.port}0", f"http://127.0.0.1:{d.port}.evil",
                   "http://evil.example", f"http://localhost:{d.port}@evil.example"):
        r = requests.options(f"{d.url}/api/agents", timeout=10,
                             headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        assert r.status_code >= 400, f"BUG: CORS preflight allows near-miss origin {origin}"
        assert "Access-Control-Allow-Origin" not in r.headers
        r = requests.get(f"{d.url}/api/agents", headers={"Origin": origin}, timeout=10)
        assert "Access-Control-Allow-Origin" not in r.headers, f"BUG: CORS allows near-miss origin {origin}"
    r = requests.options(f"{d.url}/api/agents", timeout=10,
                         headers={"Origin": good, "Access-Control-Request-Method": "POST"})
    assert r.status_code == 204
    r = requests.get(f"{d.url}/api/agents", headers={"Origin": good}, timeout=10)
    assert r.headers["Access-Control-Allow-Origin"] == good


# -- think text, session reset, approval timeout ----------------------------------------------------

@pytest.fixture(scope="module")
def guarded(tmp_path_factory, fake_llm):
    """A daemon with a short approval timeout (shared by this module's agent tests)."""
    from support import Daemon, make_home, stop_shared

    home = make_home(tmp_path_factory.mktemp("guarded"),
                     llm_config(fake_llm, "\n[tools]\napproval_timeout_secs = 0.6\n" + NO_REMEMBERING))
    d = Daemon(home, env_extra=LLM_ENV).start()
    yield d
    stop_shared(d)


def _requests_of(fake_llm, marker: str) -> list[dict]:
    return [q for q in fake_llm.requests if q["json"] and marker in json.dumps(q["json"])]


def test_think_never_in_stored_history_of_a_tool_turn(guarded, fake_llm) -> None:
    d = guarded
    agent_id = spawn(d, extra='profile = "coding"')
    body = say(d, agent_id, '[[think:calls]] [[tool:file_list {"path": "."}]]').json()
    assert body["iterations"] == 2 and "secret reasoning" not in body["response"]
    session = d.get(f"/api/agents/{agent_id}/session").json()
    assert "secret reasoning" not in json.dumps(session) and "<think>" not in json.dumps(session), \
        "BUG: <think> text kept in the stored history of a tool-calling turn"
    marker = uuid.uuid4().hex
    say(d, agent_id, f"follow up {marker}")
    [sent] = _requests_of(fake_llm, marker)
    history = json.dumps(sent["json"]["messages"])
    assert "calling a tool" in history, "the visible text of the tool turn is kept"
    assert "secret reasoning" not in history and "<think>" not in history, \
        "BUG: <think> text from a tool-calling turn is sent back to the model as history"


def test_session_reset(guarded, fake_llm) -> None:
    d = guarded
    agent_id = spawn(d)
    say(d, agent_id, "remember the word pineapple")
    before = d.get(f"/api/agents/{agent_id}").json()["session_id"]
    assert d.get(f"/api/agents/{agent_id}/session").json()["message_count"] == 2
    r = d.post(f"/api/agents/{agent_id}/session/reset")
    assert r.status_code == 200
    assert r.json() == {"status": "reset", "agent_id": agent_id, "session_id": before}
    session = d.get(f"/api/agents/{agent_id}/session").json()
    assert session["message_count"] == 0 and session["messages"] == [], "BUG: session reset kept the history"
    marker = uuid.uuid4().hex
    say(d, agent_id, f"after reset {marker}")
    [sent] = _requests_of(fake_llm, marker)
    assert "pineapple" not in json.dumps(sent["json"]), "BUG: the model still sees history after a reset"
    assert d.post(f"/api/agents/{uuid.uuid4()}/session/reset").status_code == 404
    assert d.post("/api/agents/not-a-uuid/session/reset").status_code == 400


def test_approval_timeout_denies_the_call(guarded) -> None:
    d = guarded
    agent_id = spawn(d, "approver-" + uuid.uuid4().hex[:6], extra='profile = "coding"')
    d.put(f"/api/agents/{agent_id}/mode", json={"mode": "Manual"})
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(
        r=say(d, agent_id, '[[tool:file_write {"path": "late.txt", "content": "x"}]]')))
    t.start()
    deadline = time.monotonic() + 10
    pending = []
    while time.monotonic() < deadline and not pending:
        pending = [a for a in d.get("/api/approvals").json() if a["agent_id"] == agent_id]
        time.sleep(0.05)
    assert pending and pending[0]["tool"] == "file_write"
    t.join(20)
    body = result["r"].json()
    assert body["response"] == ("tool said: denied: the call to 'file_write' was not performed "
                                "because approval timed out."), "BUG: an unanswered approval does not time out"
    assert [a for a in d.get("/api/approvals").json() if a["agent_id"] == agent_id] == []
    assert d.post(f"/api/approvals/{pending[0]['id']}/approve").status_code == 404
    name = d.get(f"/api/agents/{agent_id}").json()["name"]
    assert not (d.home / "workspaces" / name / "late.txt").exists(), "BUG: a timed-out call still ran"


# -- max_streams ----------------------------------------------------------------------------------

def test_max_streams_reached_is_503(daemon_factory, fake_llm) -> None:
    config = llm_config(fake_llm).replace("[api]\n", "[api]\nmax_streams = 1\n", 1)
    d = daemon_factory(config, env_extra=LLM_ENV)
    agent_id = spawn(d)
    held = d.post(f"/api/agents/{agent_id}/message/stream", json={"message": "[[slow:1.5]] hold"},
                  stream=True, timeout=30)
    assert held.status_code == 200
    lines = held.iter_lines()
    next(lines)   # the stream is open and holds the only slot
    r = d.post(f"/api/agents/{agent_id}/message/stream", json={"message": "second"})
    assert r.status_code == 503, "BUG: max_streams is not enforced"
    assert r.json() == {"error": "too many concurrent streams; try again shortly"}
    assert r.headers["Retry-After"] == "1"
    r = d.post("/v1/chat/completions", json={"model": "agentd:nobody", "stream": True,
                                             "messages": [{"role": "user", "content": "x"}]})
    name = d.get(f"/api/agents/{agent_id}").json()["name"]
    r = d.post("/v1/chat/completions", json={"model": f"agentd:{name}", "stream": True,
                                             "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    err = r.json()["error"]
    assert set(err) == {"message", "type"} and err["message"] == "too many concurrent streams; try again shortly"
    # A plain message waits for its agent on a server thread, so it needs a slot too.
    other = spawn(d)
    r = d.post(f"/api/agents/{other}/message", json={"message": "no slot left"})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert r.json() == {"error": "server busy: too many requests are waiting for agents; try again shortly"}
    assert d.get("/api/agents").status_code == 200, "plain HTTP keeps working while the slots are taken"
    rest = b"\n".join(lines)
    assert b"event: done" in rest
    held.close()
    # The slot is released when the stream ends (a deadline only: the first answer that has it ends the loop).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = d.post(f"/api/agents/{agent_id}/message/stream", json={"message": "third"})
        if r.status_code == 200:
            break
        time.sleep(0.1)
    assert r.status_code == 200 and "event: done" in r.text, "BUG: a finished stream keeps its slot"


# -- KV isolation through the API and the memory tools ---------------------------------------------

def test_kv_same_key_isolated_between_agents(guarded) -> None:
    d = guarded
    a, b = spawn(d, extra='profile = "messaging"'), spawn(d, extra='profile = "messaging"')
    kv = "/api/memory/agents/{}/kv"
    assert d.put(kv.format(a) + "/shared", json="from a").status_code == 200
    assert d.put(kv.format(b) + "/shared", json="from b").status_code == 200
    assert d.get(kv.format(a) + "/shared").json() == "from a", "BUG: KV get/put crosses agents"
    assert d.get(kv.format(b) + "/shared").json() == "from b", "BUG: KV put overwrote another agent's key"
    assert d.get(kv.format(a)).json() == {"shared": "from a"}, "BUG: KV list shows another agent's keys"
    assert d.delete(kv.format(a) + "/shared").json() == {"status": "deleted"}
    assert d.get(kv.format(b) + "/shared").json() == "from b", \
        "BUG: KV delete removed another agent's key of the same name"
    assert d.get(kv.format(a) + "/shared").status_code == 404
    assert d.delete(kv.format(a) + "/shared").status_code == 404
    # The memory tools go through the same per-agent scope.
    say(d, a, '[[tool:memory_store {"key": "shared", "value": "tool a"}]]')
    assert d.get(kv.format(b) + "/shared").json() == "from b"
    body = say(d, b, '[[tool:memory_recall {"key": "shared"}]]').json()
    assert "from b" in body["response"] and "tool a" not in body["response"], body
