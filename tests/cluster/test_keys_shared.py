"""Two daemons on one PostgreSQL database share scoped API keys: a key made on one works on
the other, its budget spent through one is refused by the other, its rate limit counts
requests to both, and disabling it on one refuses it on both. Real daemons, a real
PostgreSQL server (tests/pgtest.py), the fake LLM."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest
import requests

import pgtest
from conftest import LLM_ENV, llm_config
from support import DAY, Daemon, make_home, stop_shared, within_one_utc_period

ADMIN = "shared-admin-key"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[tuple[Daemon, Daemon]]:
    url = pgtest.databases().new_url()
    env = {**LLM_ENV, "AGENTD_DATABASE_URL": url}
    config = f'api_key = "{ADMIN}"\n' + llm_config(fake_llm)
    a = Daemon(make_home(tmp_path_factory.mktemp("keys-a"), config), api_key=ADMIN, env_extra=env).start()
    b = Daemon(make_home(tmp_path_factory.mktemp("keys-b"), config), api_key=ADMIN, env_extra=env).start()
    yield a, b
    stop_shared(a)
    stop_shared(b)


def as_key(d: Daemon, token: str, method: str, path: str, **kwargs) -> requests.Response:
    return requests.request(method, d.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=30,
                            **kwargs)


def key(d: Daemon, **fields) -> dict:
    r = d.post("/api/keys", json={"name": f"sk-{uuid.uuid4().hex[:6]}", "scopes": ["read", "message"], **fields})
    assert r.status_code == 201, r.text
    return r.json()


def test_a_budget_spent_on_one_daemon_is_refused_on_the_other(pair) -> None:
    a, b = pair
    r = a.post("/api/agents", json={"manifest_toml": f'name = "kb-{uuid.uuid4().hex[:6]}"\n'})
    agent_id = r.json()["agent_id"]
    within_one_utc_period(30, DAY)  # the spend and the refusal below, in one budget month
    made = key(a, budget_usd_per_month=0.000001)
    spent = as_key(a, made["key"], "POST", f"/api/agents/{agent_id}/message", json={"message": "on a"})
    assert spent.status_code == 200, spent.text
    refused = as_key(b, made["key"], "POST", f"/api/agents/{agent_id}/message", json={"message": "on b"})
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
    assert "over its budget" in refused.json()["error"]
    assert b.get(f"/api/keys/{made['id']}").json()["spent_usd_this_month"] == pytest.approx(
        spent.json()["cost_usd"])


def test_parallel_runs_of_a_key_on_both_daemons_cannot_overspend_its_budget(pair) -> None:
    a, b = pair

    def spawn() -> str:
        r = a.post("/api/agents", json={"manifest_toml": f'name = "kp-{uuid.uuid4().hex[:6]}"\n'})
        assert r.status_code == 201, r.text
        return r.json()["agent_id"]

    within_one_utc_period(40, DAY)  # every run below in one budget day
    made = key(a, budget_usd_per_day=1.0)
    first = as_key(a, made["key"], "POST", f"/api/agents/{spawn()}/message", json={"message": "[[slow:1]] spend"})
    assert first.status_code == 200, first.text
    cost = first.json()["cost_usd"]
    assert cost and cost > 0
    # Room for less than one more run: only one of the parallel runs below may start.
    assert a.http.patch(f"{a.url}/api/keys/{made['id']}", json={"budget_usd_per_day": cost * 1.5}).status_code == 200
    agents = [spawn() for _ in range(6)]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda i: as_key((a, b)[i % 2], made["key"], "POST", f"/api/agents/{agents[i]}/message",
                                                 json={"message": "[[slow:1]] spend"}), range(6)))
    assert sorted(r.status_code for r in answers) == [200, 429, 429, 429, 429, 429], [r.text for r in answers]
    assert all("over its budget" in r.json()["error"] for r in answers if r.status_code == 429)
    assert b.get(f"/api/keys/{made['id']}").json()["spent_usd_today"] == pytest.approx(2 * cost)


def test_rate_limit_and_disabling_hold_on_both(pair) -> None:
    a, b = pair
    made = key(a, rate_limit_per_minute=4)
    within_one_utc_period(10)  # the requests below, counted per UTC minute
    codes = [as_key(d, made["key"], "GET", "/api/status").status_code for d in (a, b, a, b, a, b)]
    assert codes == [200, 200, 200, 200, 429, 429]
    other = key(b)
    assert as_key(a, other["key"], "GET", "/api/status").status_code == 200
    assert b.http.patch(f"{b.url}/api/keys/{other['id']}", json={"enabled": False}).status_code == 200
    r = as_key(a, other["key"], "GET", "/api/status")
    assert r.status_code == 401 and "disabled" in r.json()["error"]
