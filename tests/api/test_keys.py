"""Scoped API keys through the real daemon: /api/keys (the secret once, a salted hash
stored, rotate keeps settings), scopes (403 naming the scope), agent lists (404 as if
absent, filtered lists), budgets (429 with Retry-After to the period's end, other keys
unaffected), rate limits, `GET /api/usage?key=`, the audit trail, sessions per person on
`/v1` and the native API (what the fake LLM received), the dashboard's key login and keys page."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator
from urllib.parse import quote

import pytest
import requests

from conftest import LLM_ENV, llm_config
from support import DAY, Daemon, db_dump, db_rows, make_home, stop_shared, wait_until, within_one_utc_period

ADMIN = "admin-secret-for-keys"


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    home = make_home(tmp_path_factory.mktemp("keys"), f'api_key = "{ADMIN}"\n' + llm_config(fake_llm))
    daemon = Daemon(home, api_key=ADMIN, env_extra=LLM_ENV).start()
    yield daemon
    stop_shared(daemon)


def spawn(d: Daemon, prefix: str) -> tuple[str, str]:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n'})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"], name


def new_key(d: Daemon, **fields: Any) -> dict[str, Any]:
    body = {"name": f"k-{uuid.uuid4().hex[:8]}", "scopes": ["read", "message"], **fields}
    r = d.post("/api/keys", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def as_key(d: Daemon, key: dict[str, Any] | str, method: str, path: str, **kwargs: Any) -> requests.Response:
    token = key if isinstance(key, str) else key["key"]
    return requests.request(method, d.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=30,
                            **kwargs)


def signed_in(d: Daemon, secret: str) -> requests.Session:
    """A browser session signed in to the dashboard with `secret`."""
    browser = requests.Session()
    login = browser.get(f"{d.url}/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', login.text).group(1)
    r = browser.post(f"{d.url}/login", data={"api_key": secret, "csrf_token": token}, allow_redirects=False)
    assert r.status_code == 303, r.text
    return browser


def make_workflow(d: Daemon, agent: str) -> str:
    """A one-step workflow on `agent` (by name), made by the admin; its id."""
    r = d.post("/api/workflows", json={"name": f"wf-{uuid.uuid4().hex[:6]}",
                                       "steps": [{"name": "one", "agent_name": agent, "prompt": "{{input}}"}]})
    assert r.status_code == 201, r.text
    return r.json()["workflow_id"]


def test_create_shows_the_secret_once_and_stores_only_a_salted_hash(d: Daemon) -> None:
    expires = (datetime.now(timezone.utc) + timedelta(days=30)).replace(microsecond=0)
    body = {"name": f"ci-{uuid.uuid4().hex[:6]}", "scopes": ["read"], "agents": ["support-*"],
            "budget_usd_per_day": 1.5, "budget_usd_per_month": 20, "rate_limit_per_minute": 30,
            "expires_at": expires.isoformat()}
    r = d.post("/api/keys", json=body)
    assert r.status_code == 201, r.text
    created = r.json()
    secret = created.pop("key")
    assert re.fullmatch(r"agd_[0-9a-f]{32}_[A-Za-z0-9_-]{43}", secret)
    assert created == {"id": created["id"], "name": body["name"], "scopes": ["read"], "agents": ["support-*"],
                       "budget_usd_per_day": 1.5, "budget_usd_per_month": 20.0, "rate_limit_per_minute": 30,
                       "expires_at": expires.isoformat(), "enabled": True, "created_at": created["created_at"],
                       "updated_at": created["created_at"], "last_used_at": None,
                       "spent_usd_today": 0.0, "spent_usd_this_month": 0.0}
    listed = [k for k in d.get("/api/keys").json() if k["id"] == created["id"]]
    assert listed == [created]
    assert d.get(f"/api/keys/{created['id']}").json() == created
    assert d.get(f"/api/keys/{body['name']}").json() == created  # by name too
    assert all("key" not in k for k in d.get("/api/keys").json())
    # Neither the secret nor its random part is anywhere in the database.
    dump = db_dump(d.home)
    random_part = secret[len("agd_") + 33:]  # (after the key id and its "_")
    assert len(random_part) == 43 and secret.encode() not in dump and random_part.encode() not in dump
    salt, digest = db_rows(d.home, "SELECT salt, secret_hash FROM api_keys WHERE id = ?", (created["id"],))[0]
    assert len(bytes(salt)) == 16 and len(bytes(digest)) == 32
    # The key works at once and last_used_at is kept.
    assert as_key(d, secret, "GET", "/api/status").status_code == 200
    assert d.get(f"/api/keys/{created['id']}").json()["last_used_at"] is not None


def test_bad_bodies_and_unknown_keys(d: Daemon) -> None:
    for bad, word in [({"scopes": ["read"]}, "name"), ({"name": "x"}, "scopes"),
                      ({"name": "x", "scopes": ["root"]}, "scopes"), ({"name": "x", "scopes": []}, "scopes"),
                      ({"name": "x", "scopes": ["read"], "budget_usd_per_day": -1}, "budget_usd_per_day"),
                      ({"name": "x", "scopes": ["read"], "expires_at": "soon"}, "expires_at"),
                      ({"name": "x", "scopes": ["read"], "colour": "red"}, "colour"),
                      # What PostgreSQL cannot store is refused on every backend.
                      ({"name": "x", "scopes": ["read"], "agents": ["x\x00y"]}, "NUL character")]:
        r = d.post("/api/keys", json=bad)
        assert r.status_code == 400 and word in r.json()["error"], (bad, r.text)
    key = new_key(d, scopes=["read", "message", "read"], agents=["a-*", "a-*"])
    assert key["scopes"] == ["read", "message"] and key["agents"] == ["a-*"]
    patched = d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"scopes": ["manage", "manage"]}).json()
    assert patched["scopes"] == ["manage"]
    r = d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"agents": ["a\x00b"]})
    assert r.status_code == 400 and "NUL character" in r.json()["error"], r.text
    again = d.post("/api/keys", json={"name": key["name"], "scopes": ["read"]})
    assert again.status_code == 409 and key["name"] in again.json()["error"]
    for method in ("GET", "PATCH", "DELETE"):
        r = d.http.request(method, f"{d.url}/api/keys/nope", json={} if method == "PATCH" else None)
        assert r.status_code == 404 and r.json() == {"error": "API key not found: nope"}, (method, r.text)
    assert d.post("/api/keys/nope/rotate").status_code == 404
    # White space alone, or around a key's id or name, names no key.
    for ref in (" ", "\u00a0", "\t", "\u3000", f" {key['id']}", f"{key['name']}\u00a0"):
        for method in ("GET", "PATCH", "DELETE", "POST"):
            path = f"/api/keys/{quote(ref)}" + ("/rotate" if method == "POST" else "")
            r = d.http.request(method, d.url + path, json={} if method == "PATCH" else None)
            assert r.status_code == 404 and r.json() == {"error": f"API key not found: {ref}"}, (method, ref, r.text)
    assert d.get(f"/api/keys/{key['id']}").json()["name"] == key["name"]
    wrong = key["key"][:-4] + "AAAA"
    r = as_key(d, wrong, "GET", "/api/status")
    assert r.status_code == 401 and r.json() == {"error": "invalid API key"}


def test_patch_disable_rotate_delete(d: Daemon) -> None:
    key = new_key(d, rate_limit_per_minute=500)
    r = d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"enabled": False, "scopes": ["read"]})
    assert r.status_code == 200 and r.json()["enabled"] is False and r.json()["scopes"] == ["read"]
    refused = as_key(d, key, "GET", "/api/status")
    assert refused.status_code == 401 and refused.json() == {"error": f"API key '{key['name']}' is disabled"}
    assert d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"enabled": True}).status_code == 200
    assert as_key(d, key, "GET", "/api/status").status_code == 200
    rotated = d.post(f"/api/keys/{key['id']}/rotate")
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()
    assert new["key"] != key["key"] and new["id"] == key["id"]
    assert (new["scopes"], new["rate_limit_per_minute"], new["enabled"]) == (["read"], 500, True)
    assert as_key(d, key, "GET", "/api/status").status_code == 401
    assert as_key(d, new, "GET", "/api/status").status_code == 200
    expired = d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"expires_at": "2000-01-01T00:00:00Z"})
    assert expired.status_code == 200 and expired.json()["expires_at"] == "2000-01-01T00:00:00+00:00"
    r = as_key(d, new, "GET", "/api/status")
    assert r.status_code == 401 and "expired" in r.json()["error"]
    gone = d.delete(f"/api/keys/{key['id']}")
    assert gone.status_code == 200 and gone.json() == {"status": "deleted", "id": key["id"]}
    assert as_key(d, new, "GET", "/api/status").status_code == 401
    # Management actions are audited by name, never with the secret.
    audit = d.get("/api/audit/recent", params={"limit": 200}).json()
    mine = [(e["event"], e["subject"]) for e in audit if e["detail"].get("key_id") == key["id"]]
    for event in ("key.create", "key.update", "key.rotate", "key.delete", "key.refused"):
        assert (event, key["name"]) in mine, event
    text = json.dumps(audit)
    assert key["key"] not in text and new["key"] not in text


def test_scopes_are_enforced_with_the_scope_named(d: Daemon) -> None:
    agent_id, _ = spawn(d, "scoped")
    reader = new_key(d, scopes=["read"])
    assert as_key(d, reader, "GET", "/api/agents").status_code == 200
    r = as_key(d, reader, "POST", f"/api/agents/{agent_id}/message", json={"message": "hi"})
    assert r.status_code == 403 and r.json() == {"error": f"forbidden: API key '{reader['name']}' is missing scope 'message'"}
    r = as_key(d, reader, "POST", "/v1/chat/completions", json={"model": "x", "messages": []})
    assert r.status_code == 403 and "missing scope 'message'" in r.json()["error"]["message"]
    talker = new_key(d, scopes=["message"])
    r = as_key(d, talker, "DELETE", f"/api/agents/{agent_id}")
    assert r.status_code == 403 and "missing scope 'manage'" in r.json()["error"]
    r = as_key(d, talker, "GET", "/api/keys")
    assert r.status_code == 403 and "missing scope 'admin'" in r.json()["error"]
    manager = new_key(d, scopes=["manage"])
    r = as_key(d, manager, "POST", "/api/keys", json={"name": "escalate", "scopes": ["admin"]})
    assert r.status_code == 403 and "missing scope 'admin'" in r.json()["error"]
    admin = new_key(d, scopes=["admin"])
    made = as_key(d, admin, "POST", "/api/keys", json={"name": f"by-{admin['name']}", "scopes": ["read"]})
    assert made.status_code == 201
    refusals = [e for e in d.get("/api/audit/recent", params={"limit": 100}).json()
                if e["event"] == "key.refused" and e["subject"] == reader["name"]]
    assert refusals and refusals[0]["detail"]["missing_scope"] == "message"


def test_an_agent_outside_the_list_is_absent(d: Daemon) -> None:
    inside, inside_name = spawn(d, "team-a")
    outside, outside_name = spawn(d, "team-b")
    key = new_key(d, scopes=["read", "message", "manage"], agents=["team-a-*"])
    listed = {a["id"] for a in as_key(d, key, "GET", "/api/agents").json()}
    assert inside in listed and outside not in listed
    for method, path in [("GET", f"/api/agents/{outside}"), ("GET", f"/api/agents/{outside}/session"),
                         ("POST", f"/api/agents/{outside}/message"), ("DELETE", f"/api/agents/{outside}"),
                         ("GET", f"/api/memory/agents/{outside}/kv")]:
        r = as_key(d, key, method, path, json={"message": "hi"} if method == "POST" else None)
        assert r.status_code == 404 and r.json() == {"error": "agent not found"}, (method, path, r.text)
    assert as_key(d, key, "GET", f"/api/agents/{inside}").status_code == 200
    models = {m["id"] for m in as_key(d, key, "GET", "/v1/models").json()["data"]}
    assert f"agentd:{inside_name}" in models and f"agentd:{outside_name}" not in models

    def refusals() -> list[dict[str, Any]]:
        return [e["detail"] for e in d.get("/api/audit/recent", params={"limit": 100}).json()
                if e["event"] == "key.refused" and e["subject"] == key["name"]]

    before = len(refusals())
    r = as_key(d, key, "POST", "/v1/chat/completions",
               json={"model": f"agentd:{outside_name}", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    # Refused as absent, and audited as a refusal of the key like every other.
    assert len(refusals()) == before + 1
    assert refusals()[0] == {"key_id": key["id"], "reason": "agent", "agent_id": outside}
    # So on A2A: the agent's own endpoint and the daemon's, naming it.
    send = {"jsonrpc": "2.0", "id": 1, "method": "message/send",
            "params": {"message": {"role": "user", "messageId": "m", "parts": [{"kind": "text", "text": "hi"}]}}}
    r = as_key(d, key, "POST", f"/a2a/agents/{outside_name}", json=send)
    assert r.status_code == 404 and r.json() == {"error": f"no agent named '{outside_name}'"}
    r = as_key(d, key, "POST", "/a2a", json={**send, "params": {**send["params"], "metadata": {"agent": outside}}})
    assert r.json()["error"]["code"] == -32602
    assert refusals()[:2] == [{"key_id": key["id"], "reason": "agent", "agent_id": outside}] * 2
    assert len(refusals()) == before + 3
    by_id = new_key(d, agents=[outside])
    assert as_key(d, by_id, "GET", f"/api/agents/{outside}").status_code == 200
    assert as_key(d, by_id, "GET", f"/api/agents/{inside}").status_code == 404
    # A name where the id belongs: the id is named only for an agent the key may reach.
    r = as_key(d, key, "GET", f"/api/agents/{inside_name}")
    assert r.status_code == 400 and r.json()["error"].endswith(f"did you mean agent {inside}?")
    # A hidden agent's name gets what a name no agent has gets, with no hint.
    r = as_key(d, key, "GET", f"/api/agents/{outside_name}")
    unknown = as_key(d, key, "GET", "/api/agents/nobody-here")
    assert r.status_code == unknown.status_code == 400
    assert r.json()["error"].replace(outside_name, "<name>") == unknown.json()["error"].replace("nobody-here", "<name>")
    r = as_key(d, key, "GET", f"/api/agents/{outside}/uploads")
    assert r.status_code == 404 and r.json() == {"error": "agent not found"}


def test_a_key_spawns_only_agents_its_list_names(d: Daemon) -> None:
    tag = uuid.uuid4().hex[:6]
    key = new_key(d, scopes=["read", "manage"], agents=[f"made-{tag}-*"])
    refusal = (f"forbidden: API key '{key['name']}' may only spawn agents its list names (made-{tag}-*), "
               f"not 'stray-{tag}'")
    r = as_key(d, key, "POST", "/api/agents", json={"manifest_toml": f'name = "stray-{tag}"\n'})
    assert r.status_code == 403 and r.json() == {"error": refusal}, r.text
    assert f"stray-{tag}" not in {a["name"] for a in d.get("/api/agents").json()}
    refused = [e["detail"] for e in d.get("/api/audit/recent", params={"limit": 20}).json()
               if e["event"] == "key.refused" and e["subject"] == key["name"]]
    assert refused[0] == {"key_id": key["id"], "reason": "spawn", "name": f"stray-{tag}"}
    browser = signed_in(d, key["key"])
    token = re.search(r'name="csrf_token" value="([^"]+)"', browser.get(f"{d.url}/agents").text).group(1)
    form = {"name": f"stray-{tag}", "model": "", "profile": "", "mode": "", "system_prompt": "", "csrf_token": token}
    page = browser.post(f"{d.url}/agents", data=form, allow_redirects=False)
    assert page.status_code == 403 and refusal.replace("'", "&#39;") in page.text
    assert f'value="stray-{tag}"' in page.text, "what was typed is kept"
    assert f"stray-{tag}" not in {a["name"] for a in d.get("/api/agents").json()}
    r = as_key(d, key, "POST", "/api/agents", json={"manifest_toml": f'name = "made-{tag}-one"\n'})
    assert r.status_code == 201, r.text
    assert as_key(d, key, "GET", f"/api/agents/{r.json()['agent_id']}").status_code == 200


def test_status_budget_and_usage_show_a_key_only_its_own(d: Daemon) -> None:
    inside, inside_name = spawn(d, "seen")
    outside, _ = spawn(d, "unseen")
    for agent_id in (inside, outside):  # both have spend this month
        assert d.post(f"/api/agents/{agent_id}/message", json={"message": "hi"}).status_code == 200
    key = new_key(d, agents=[inside_name])
    status = as_key(d, key, "GET", "/api/status").json()
    assert [a["id"] for a in status["agents"]] == [inside] and status["agent_count"] == 1
    assert as_key(d, key, "GET", "/api/health/detail").json()["agent_count"] == 1
    overview = signed_in(d, key["key"]).get(f"{d.url}/").text
    assert re.search(r'Agents</a> <span class="count">(\d+)</span>', overview).group(1) == "1"
    assert d.get("/api/health/detail").json()["agent_count"] >= 2
    assert [a["agent_id"] for a in as_key(d, key, "GET", "/api/budget/agents").json()] == [inside]
    admin_view = {a["agent_id"] for a in d.get("/api/budget/agents").json()}
    assert {inside, outside} <= admin_view
    assert outside in {a["id"] for a in d.get("/api/status").json()["agents"]}
    # A key reads its own spend; another key's is as absent as an unknown key's.
    other = new_key(d)
    assert as_key(d, key, "GET", "/api/usage", params={"key": key["name"]}).json()["key_id"] == key["id"]
    r = as_key(d, key, "GET", "/api/usage", params={"key": other["name"]})
    assert r.status_code == 404 and r.json() == {"error": f"API key not found: {other['name']}"}
    assert d.get("/api/usage", params={"key": other["name"]}).status_code == 200


def test_jobs_triggers_and_runs_of_an_agent_outside_the_list_are_absent(d: Daemon) -> None:
    inside, inside_name = spawn(d, "own")
    outside, outside_name = spawn(d, "foreign")
    assert d.post(f"/api/agents/{outside}/message", json={"message": "hi"}).status_code == 200

    def job(agent: str) -> dict[str, Any]:
        return {"agent_id": agent, "name": f"j-{uuid.uuid4().hex[:6]}", "schedule": {"kind": "every", "every_secs": 3600},
                "action": {"kind": "agent_turn", "message": "m"}}

    def trigger(agent: str) -> dict[str, Any]:
        return {"agent_id": agent, "pattern": {"content_match": "never"}, "prompt_template": "t {{event}}"}

    hidden_job = d.post("/api/cron/jobs", json=job(outside)).json()["id"]
    shown_job = d.post("/api/cron/jobs", json=job(inside)).json()["id"]
    hidden_trigger = d.post("/api/triggers", json=trigger(outside)).json()["id"]
    key = new_key(d, scopes=["read", "manage"], agents=[inside_name])
    assert [j["id"] for j in as_key(d, key, "GET", "/api/cron/jobs").json()] == [shown_job]
    assert as_key(d, key, "GET", "/api/triggers").json() == []
    assert all(r["agent_id"] != outside for r in as_key(d, key, "GET", "/api/cluster/runs").json())
    for method, path, error in [("GET", f"/api/cron/jobs/{hidden_job}", "cron job not found"),
                                ("PATCH", f"/api/cron/jobs/{hidden_job}", "cron job not found"),
                                ("DELETE", f"/api/cron/jobs/{hidden_job}", "cron job not found"),
                                ("GET", f"/api/triggers/{hidden_trigger}", "trigger not found"),
                                ("DELETE", f"/api/triggers/{hidden_trigger}", "trigger not found")]:
        r = as_key(d, key, method, path, json={"enabled": False} if method == "PATCH" else None)
        assert r.status_code == 404 and r.json() == {"error": error}, (method, path, r.text)
    # Refused in the words an unknown agent gets on each route.
    r = as_key(d, key, "POST", "/api/cron/jobs", json=job(outside_name))
    assert r.status_code == 400 and r.json() == {"error": f"agent_id: no agent '{outside_name}'"}, r.text
    r = as_key(d, key, "POST", "/api/triggers", json=trigger(outside))
    assert r.status_code == 404 and r.json() == {"error": "agent not found"}, r.text
    # Nothing was changed behind the refusals.
    assert d.get(f"/api/cron/jobs/{hidden_job}").json()["enabled"] is True
    assert d.get(f"/api/triggers/{hidden_trigger}").status_code == 200
    assert as_key(d, key, "GET", f"/api/cron/jobs/{shown_job}").status_code == 200


def test_an_approval_of_an_agent_outside_the_list_is_absent(d: Daemon) -> None:
    outside, _ = spawn(d, "manual")
    assert d.http.put(f"{d.url}/api/agents/{outside}/mode", json={"mode": "Manual"}).status_code == 200
    result: dict[str, Any] = {}
    talk = threading.Thread(target=lambda: result.update(r=d.post(
        f"/api/agents/{outside}/message",
        json={"message": '[[tool:memory_store {"key": "k", "value": "v"}]]'})))
    talk.start()
    try:
        approval = None
        for _ in range(200):
            approval = next((a for a in d.get("/api/approvals").json() if a["agent_id"] == outside), None)
            if approval:
                break
            time.sleep(0.05)
        assert approval is not None, "no approval appeared"
        key = new_key(d, scopes=["read", "manage"], agents=["nobody-*"])
        assert as_key(d, key, "GET", "/api/approvals").json() == []
        # Nor on the dashboard's approvals and overview pages.
        browser = signed_in(d, key["key"])
        for page in ("/approvals", "/"):
            text = browser.get(f"{d.url}{page}").text
            assert approval["id"] not in text and approval["agent_name"] not in text, page
        assert approval["agent_name"] in d.get("/approvals").text  # the admin's page shows it
        for decision in ("approve", "reject"):
            r = as_key(d, key, "POST", f"/api/approvals/{approval['id']}/{decision}")
            assert r.status_code == 404 and r.json() == {"error": "approval not found"}, r.text
        assert d.post(f"/api/approvals/{approval['id']}/reject").status_code == 200
        # An approval nobody has (this one, now decided) is the route's own 404 for the key too.
        r = as_key(d, key, "POST", f"/api/approvals/{approval['id']}/approve")
        assert r.status_code == 404 and r.json() == {"error": "approval not found"}, r.text
    finally:
        talk.join(30)
    assert result["r"].status_code == 200


def test_a_key_over_its_budget_gets_429_until_the_period_ends(d: Daemon) -> None:
    agent_id, name = spawn(d, "budget")
    within_one_utc_period(30, DAY)  # the spend and the refusals below, in one budget day
    tight = new_key(d, budget_usd_per_day=0.000001)
    other = new_key(d)
    first = as_key(d, tight, "POST", f"/api/agents/{agent_id}/message", json={"message": "one"})
    assert first.status_code == 200, first.text
    spent = first.json()["cost_usd"]
    assert spent > 0.000001
    now = datetime.now(timezone.utc)
    day_end = datetime(now.year, now.month, now.day, tzinfo=timezone.utc) + timedelta(days=1)
    for method, path, body in [("POST", f"/api/agents/{agent_id}/message", {"message": "two"}),
                               ("POST", f"/api/agents/{agent_id}/message/stream", {"message": "two"}),
                               ("POST", "/v1/chat/completions",
                                {"model": f"agentd:{name}", "messages": [{"role": "user", "content": "two"}]}),
                               ("POST", "/v1/responses", {"model": f"agentd:{name}", "input": "two"}),
                               ("POST", "/v1/responses", {"model": f"agentd:{name}", "input": "two", "stream": True})]:
        r = as_key(d, tight, method, path, json=body)
        assert r.status_code == 429, (path, r.text)
        wait = int(r.headers["Retry-After"])
        assert abs(wait - (day_end - datetime.now(timezone.utc)).total_seconds()) < 5
        text = r.json()["error"] if path.startswith("/api/") else r.json()["error"]["message"]
        assert f"API key '{tight['name']}' is over its budget" in text
        if path.startswith("/v1/"):
            assert r.json()["error"]["code"] == "key_budget_exceeded"
    # The dashboard's chat, signed in with the key, says when to come back too.
    browser = signed_in(d, tight["key"])
    token = re.search(r'name="csrf_token" value="([^"]+)"', browser.get(f"{d.url}/agents/{agent_id}").text).group(1)
    r = browser.post(f"{d.url}/agents/{agent_id}/message", data={"message": "five", "csrf_token": token})
    assert r.status_code == 429 and "is over its budget" in r.text and "five" in r.text
    assert abs(int(r.headers["Retry-After"]) - (day_end - datetime.now(timezone.utc)).total_seconds()) < 5
    # Another key, and the admin, keep working; the spend is the key's.
    assert as_key(d, other, "POST", f"/api/agents/{agent_id}/message", json={"message": "three"}).status_code == 200
    assert d.post(f"/api/agents/{agent_id}/message", json={"message": "four"}).status_code == 200
    usage = d.get("/api/usage", params={"key": tight["name"]}).json()
    assert usage["requests"] == 1 and usage["total_cost_usd"] == pytest.approx(spent) and usage["key_id"] == tight["id"]
    assert d.get(f"/api/keys/{tight['id']}").json()["spent_usd_today"] == pytest.approx(spent)
    assert d.get("/api/usage", params={"key": "nobody"}).status_code == 404


def test_parallel_runs_of_a_key_cannot_overspend_its_budget(d: Daemon) -> None:
    within_one_utc_period(40, DAY)  # every run below in one budget day
    made = new_key(d, budget_usd_per_day=1.0)
    first = as_key(d, made, "POST", f"/api/agents/{spawn(d, 'par')[0]}/message", json={"message": "[[slow:1]] x"})
    assert first.status_code == 200, first.text
    cost = first.json()["cost_usd"]
    # Room for less than one more run: one of the parallel runs below starts, the others wait
    # for nothing and are refused, as if they had come one after another.
    assert d.http.patch(f"{d.url}/api/keys/{made['id']}", json={"budget_usd_per_day": cost * 1.5}).status_code == 200
    agents = [spawn(d, "par")[0] for _ in range(5)]
    answers: list[requests.Response] = []
    talkers = [threading.Thread(target=lambda a=a: answers.append(as_key(
        d, made, "POST", f"/api/agents/{a}/message", json={"message": "[[slow:1]] spend"}))) for a in agents]
    for t in talkers:
        t.start()
    for t in talkers:
        t.join(30)
    assert sorted(r.status_code for r in answers) == [200, 429, 429, 429, 429], [r.text for r in answers]
    refusal = next(r for r in answers if r.status_code == 429).json()["error"]
    assert f"API key '{made['name']}' is over its budget" in refusal
    assert d.get(f"/api/keys/{made['id']}").json()["spent_usd_today"] == pytest.approx(2 * cost)
    # Each refusal is audited, whether the check before the queue or the admission made it.
    audited = [e for e in d.get("/api/audit/recent", params={"limit": 200}).json()
               if e["event"] == "key.refused" and e["subject"] == made["name"]]
    assert [e["detail"]["reason"] for e in audited] == ["budget"] * 4


def test_a_key_over_both_budgets_waits_for_the_months_end(d: Daemon) -> None:
    agent_id, _ = spawn(d, "budget-both")
    within_one_utc_period(30, DAY)
    broke = new_key(d, budget_usd_per_day=0.000001, budget_usd_per_month=0.000001)
    assert as_key(d, broke, "POST", f"/api/agents/{agent_id}/message", json={"message": "one"}).status_code == 200
    r = as_key(d, broke, "POST", f"/api/agents/{agent_id}/message", json={"message": "two"})
    now = datetime.now(timezone.utc)
    month_end = datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=timezone.utc)
    assert r.status_code == 429, r.text
    # The day's end would only bring another refusal: the wait is to the month's.
    assert abs(int(r.headers["Retry-After"]) - (month_end - now).total_seconds()) < 5, r.headers
    assert r.json()["error"].endswith("spent this month"), r.text


def test_a_keys_workflow_runs_are_its_own_spend(d: Daemon) -> None:
    _, name = spawn(d, "flow")
    _, hidden_name = spawn(d, "flow-hidden")

    mine, foreign = make_workflow(d, name), make_workflow(d, hidden_name)
    within_one_utc_period(30, DAY)  # the spend and the refusal below, in one budget day
    key = new_key(d, scopes=["read", "manage"], agents=[name], budget_usd_per_day=0.000001)
    first = as_key(d, key, "POST", f"/api/workflows/{mine}/run", json={"input": "go"})
    assert first.status_code == 200 and first.json()["status"] == "completed", first.text
    usage = d.get("/api/usage", params={"key": key["name"]}).json()
    assert usage["requests"] == 1 and usage["total_cost_usd"] > 0.000001
    # Over its budget, the key's next run fails at its step; the admin's runs go on.
    second = as_key(d, key, "POST", f"/api/workflows/{mine}/run", json={"input": "again"}).json()
    assert second["status"] == "failed" and f"API key '{key['name']}' is over its budget" in second["error"]
    assert d.post(f"/api/workflows/{mine}/run", json={"input": "admin"}).json()["status"] == "completed"
    for path in (f"/api/workflows/{foreign}/run", f"/api/workflows/{foreign}/runs"):
        r = as_key(d, key, "POST", path, json={"input": "x"})
        assert r.status_code == 404 and r.json() == {"error": "workflow not found"}, (path, r.text)


def test_workflows_on_an_agent_outside_the_list_are_absent(d: Daemon) -> None:
    mine_id, mine = spawn(d, "wf-mine")
    _, hidden = spawn(d, "wf-hidden")

    own, foreign = make_workflow(d, mine), make_workflow(d, hidden)
    job = d.post("/api/cron/jobs", json={"agent_id": mine_id, "name": f"wf-job-{uuid.uuid4().hex[:6]}",
                                         "schedule": {"kind": "every", "every_secs": 3600},
                                         "action": {"kind": "agent_turn", "message": "x"}}).json()
    run = d.post(f"/api/workflows/{foreign}/run", json={"input": "private"}).json()
    assert run["status"] == "completed", run
    key = new_key(d, scopes=["read", "message", "manage"], agents=[mine])
    listed = [w["id"] for w in as_key(d, key, "GET", "/api/workflows").json()]
    assert own in listed and foreign not in listed
    assert as_key(d, key, "GET", f"/api/workflows/{own}").status_code == 200
    definition = {"name": "taken over", "steps": [{"name": "one", "agent_name": mine, "prompt": "x"}]}
    for method, path, error in [("GET", f"/api/workflows/{foreign}", "workflow not found"),
                                ("PUT", f"/api/workflows/{foreign}", "workflow not found"),
                                ("DELETE", f"/api/workflows/{foreign}", "workflow not found"),
                                ("GET", f"/api/workflows/{foreign}/runs", "workflow not found"),
                                ("GET", f"/api/workflows/runs/{run['run_id']}", "workflow run not found"),
                                ("GET", f"/api/workflows/runs/{run['run_id']}/events", "workflow run not found"),
                                ("POST", f"/api/workflows/runs/{run['run_id']}/cancel", "workflow run not found")]:
        r = as_key(d, key, method, path, json=definition if method == "PUT" else None)
        assert r.status_code == 404 and r.json() == {"error": error}, (method, path, r.text)
    assert d.get(f"/api/workflows/{foreign}").json()["steps"][0]["agent"] == {"name": hidden}  # unchanged
    # A definition naming the agent is refused exactly as one naming an agent that does not exist.
    for method, path in [("POST", "/api/workflows"), ("PUT", f"/api/workflows/{own}")]:
        for field, shown, missing in [("agent_name", hidden, "nobody-here"), ("agent", hidden, "nobody-here"),
                                      ("agent_id", foreign_id(d, hidden), str(uuid.uuid4()))]:
            answers = []
            for ref in (shown, missing):
                step = {field: {"name": ref} if field == "agent" else ref}
                body = {"name": f"wf-{uuid.uuid4().hex[:6]}", "steps": [{"name": "one", "prompt": "x", **step}]}
                r = as_key(d, key, method, path, json=body)
                answers.append((r.status_code, r.json()["error"].replace(ref, "<ref>")))
            assert answers[0] == answers[1] and answers[0][0] == 400, (method, field, answers)
    browser = signed_in(d, key["key"])
    token = re.search(r'name="csrf_token" value="([^"]+)"', browser.get(f"{d.url}/workflows/new").text).group(1)
    pages = []
    for agent in (hidden, "nobody-here"):
        form = {"name": f"wf-{uuid.uuid4().hex[:6]}", "description": "", "csrf_token": token}
        for i, (name, on) in enumerate([("one", mine), ("two", agent)]):
            form.update({f"steps-{i}-name": name, f"steps-{i}-agent_name": on, f"steps-{i}-prompt": "p",
                         f"steps-{i}-mode": "sequential", f"steps-{i}-error_mode": "fail"})
        r = browser.post(f"{d.url}/workflows/new", data=form)
        marked = re.search(r'<fieldset[^>]*id="step-(\d)"[^>]*aria-invalid="true"', r.text)
        error = re.search(r'id="step-1-error">([^<]*)<', r.text)
        pages.append((r.status_code, marked and marked.group(1), error and error.group(1).replace(agent, "")))
    assert pages[0] == pages[1] and pages[0][:2] == (400, "1"), pages
    # The dashboard's lists leave it out too.
    for page in ("/workflows", "/", "/schedules", "/workflows/new", f"/schedules/{job['id']}"):
        text = browser.get(f"{d.url}{page}").text
        assert foreign not in text and hidden not in text, page
    assert own in browser.get(f"{d.url}/schedules/{job['id']}").text  # (the job's form offers the key's own)
    assert browser.get(f"{d.url}/workflows/{foreign}").status_code == 404
    assert browser.get(f"{d.url}/workflows/runs/{run['run_id']}").status_code == 404


def test_a_cron_job_running_a_workflow_outside_the_list_is_absent(d: Daemon) -> None:
    mine_id, mine = spawn(d, "cronwf-mine")
    _, hidden = spawn(d, "cronwf-hidden")
    own, foreign = make_workflow(d, mine), make_workflow(d, hidden)

    def job(workflow_id: str) -> dict[str, Any]:
        r = d.post("/api/cron/jobs", json={"name": f"wf-job-{uuid.uuid4().hex[:6]}",
                                           "schedule": {"kind": "every", "every_secs": 3600},
                                           "action": {"kind": "workflow_run", "workflow_id": workflow_id}})
        assert r.status_code == 201, r.text
        return r.json()

    shown, hidden_job = job(own), job(foreign)
    # On an agent of the key's own, and running the workflow: as absent still.
    on_mine = d.post("/api/cron/jobs", json={"agent_id": mine_id, "name": f"wf-job-{uuid.uuid4().hex[:6]}",
                                             "schedule": {"kind": "every", "every_secs": 3600},
                                             "action": {"kind": "workflow_run", "workflow_id": foreign}}).json()
    key = new_key(d, scopes=["read", "message", "manage"], agents=[mine])
    listed = [j["id"] for j in as_key(d, key, "GET", "/api/cron/jobs").json()]
    assert shown["id"] in listed and hidden_job["id"] not in listed and on_mine["id"] not in listed
    assert [j["id"] for j in as_key(d, key, "GET", "/api/cron/jobs", params={"agent_id": mine}).json()] == []
    for job_id in (hidden_job["id"], on_mine["id"]):
        for method, path in [("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/run"), ("GET", "/runs")]:
            r = as_key(d, key, method, f"/api/cron/jobs/{job_id}{path}",
                       json={"enabled": False} if method == "PATCH" else None)
            assert r.status_code == 404 and r.json() == {"error": "cron job not found"}, (method, path, r.text)
    assert d.get(f"/api/cron/jobs/{hidden_job['id']}/runs").json() == []  # nothing ran
    assert d.get(f"/api/cron/jobs/{hidden_job['id']}").json()["enabled"] is True
    # The dashboard's Schedules leave it out, and its page and buttons are not found.
    browser = signed_in(d, key["key"])
    page = browser.get(f"{d.url}/schedules").text
    assert shown["name"] in page and hidden_job["name"] not in page and foreign not in page
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    assert browser.get(f"{d.url}/schedules/{hidden_job['id']}").status_code == 404
    for action in ("run", "disable", "delete"):
        r = browser.post(f"{d.url}/schedules/{hidden_job['id']}/{action}", data={"csrf_token": token},
                         allow_redirects=False)
        assert r.status_code == 404, (action, r.text)
    assert d.get(f"/api/cron/jobs/{hidden_job['id']}/runs").json() == []
    assert as_key(d, key, "GET", f"/api/cron/jobs/{shown['id']}").status_code == 200


def foreign_id(d: Daemon, name: str) -> str:
    return next(a["id"] for a in d.get("/api/agents").json() if a["name"] == name)


def test_a_key_rate_limit(d: Daemon) -> None:
    key = new_key(d, rate_limit_per_minute=3)
    within_one_utc_period(10)  # the requests below, counted per UTC minute
    codes = [as_key(d, key, "GET", "/api/status").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    r = as_key(d, key, "GET", "/api/status")
    assert r.status_code == 429 and float(r.headers["Retry-After"]) >= 1
    assert f"API key '{key['name']}' allows 3 requests a minute" in r.json()["error"]
    assert as_key(d, new_key(d), "GET", "/api/status").status_code == 200


def _histories(fake_llm: Any, since: int, marker: str) -> list[list[str]]:
    """The user turns of every model request since `since` whose last user turn holds `marker`."""
    out = []
    for req in fake_llm.requests[since:]:
        users = [m.get("content") for m in (req.get("json") or {}).get("messages", []) if m.get("role") == "user"]
        if users and marker in str(users[-1]):
            out.append(users)
    return out


def test_v1_user_and_keys_talk_in_sessions_of_their_own(d: Daemon, fake_llm) -> None:
    agent_id, name = spawn(d, "people")
    tag = uuid.uuid4().hex[:6]
    mark = len(fake_llm.requests)
    errors: list[str] = []

    def chat(token: str, user: str | None, n: int) -> None:
        body: dict[str, Any] = {"model": f"agentd:{name}",
                                "messages": [{"role": "user", "content": f"{tag} {user} says {n}"}]}
        if user:
            body["user"] = user
        r = requests.post(f"{d.url}/v1/chat/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {token}"})
        if r.status_code != 200:
            errors.append(r.text)

    def person(token: str, user: str | None) -> None:
        for n in range(2):
            chat(token, user, n)

    key = new_key(d)
    threads = [threading.Thread(target=person, args=(ADMIN, "alice")),
               threading.Thread(target=person, args=(ADMIN, "bob")),
               threading.Thread(target=person, args=(key["key"], None))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    for who in ("alice", "bob", "None"):
        seen = _histories(fake_llm, mark, f"{tag} {who} says 1")
        assert len(seen) == 1, who
        # The second turn's history is this person's first turn only.
        assert seen[0] == [f"{tag} {who} says 0", f"{tag} {who} says 1"], seen
    # The agent's own session saw none of it.
    assert d.get(f"/api/agents/{agent_id}/session").json()["messages"] == []


def test_responses_user_and_keys_talk_in_sessions_of_their_own(d: Daemon, fake_llm) -> None:
    agent_id, name = spawn(d, "respond")
    tag = uuid.uuid4().hex[:6]
    mark = len(fake_llm.requests)
    key = new_key(d)

    def respond(token: str, text: str, **fields: Any) -> dict[str, Any]:
        r = requests.post(f"{d.url}/v1/responses", json={"model": f"agentd:{name}", "input": text, **fields},
                          headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    alice = respond(ADMIN, f"{tag} alice 0", user="alice")
    respond(ADMIN, f"{tag} bob 0", user="bob")
    keys_first = respond(key["key"], f"{tag} key 0")
    # previous_response_id continues the session the response was answered in.
    alice_1 = respond(ADMIN, f"{tag} alice 1", previous_response_id=alice["id"])
    respond(ADMIN, f"{tag} bob 1", user="bob")
    keys_second = respond(key["key"], f"{tag} key 1")
    for who in ("alice", "bob", "key"):
        assert _histories(fake_llm, mark, f"{tag} {who} 1") == [[f"{tag} {who} 0", f"{tag} {who} 1"]], who
    # So does a chain of them, and the admin's continuation of a key's response.
    respond(ADMIN, f"{tag} alice 2", previous_response_id=alice_1["id"])
    respond(ADMIN, f"{tag} key 2", previous_response_id=keys_second["id"])
    for who in ("alice", "key"):
        assert _histories(fake_llm, mark, f"{tag} {who} 2") == [[f"{tag} {who} {n}" for n in range(3)]], who
    assert d.get(f"/api/agents/{agent_id}/session").json()["messages"] == []
    # The key's spend is the key's.
    assert d.get("/api/usage", params={"key": key["name"]}).json()["requests"] == 2
    # A key sees no stored response of an agent outside its list.
    elsewhere = new_key(d, agents=["nothing-*"])
    for method in ("GET", "DELETE"):
        r = as_key(d, elsewhere, method, f"/v1/responses/{alice['id']}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found", r.text
    assert d.get(f"/v1/responses/{alice['id']}").status_code == 200
    # A key reads back only its own answers; the admin reads every one.
    other = new_key(d)
    assert as_key(d, key, "GET", f"/v1/responses/{keys_first['id']}").json() == keys_first
    assert d.get(f"/v1/responses/{keys_first['id']}").json() == keys_first
    for method, path, body in [("GET", f"/v1/responses/{keys_first['id']}", None),
                               ("GET", f"/v1/responses/{alice['id']}", None),
                               ("DELETE", f"/v1/responses/{keys_first['id']}", None),
                               ("POST", "/v1/responses", {"model": f"agentd:{name}", "input": "x",
                                                          "previous_response_id": keys_first["id"]})]:
        r = as_key(d, other, method, path, json=body)
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["error"]["code"] in ("response_not_found", "previous_response_not_found")
    assert as_key(d, key, "DELETE", f"/v1/responses/{keys_first['id']}").status_code == 200


def test_native_user_and_session_parameters(d: Daemon, fake_llm) -> None:
    agent_id, _ = spawn(d, "native")
    tag = uuid.uuid4().hex[:6]

    def say(text: str, **extra: str) -> None:
        r = d.post(f"/api/agents/{agent_id}/message", json={"message": f"{tag} {text}", **extra})
        assert r.status_code == 200, r.text

    say("carol one", user="carol")
    say("shared one")
    say("room one", session="room-7")
    mark = len(fake_llm.requests)
    say("carol two", user="carol")
    say("room two", session="room-7")
    assert _histories(fake_llm, mark, f"{tag} carol two") == [[f"{tag} carol one", f"{tag} carol two"]]
    assert _histories(fake_llm, mark, f"{tag} room two") == [[f"{tag} room one", f"{tag} room two"]]
    contents = [m["content"] for m in d.get(f"/api/agents/{agent_id}/session").json()["messages"]]
    assert contents == [f"{tag} shared one", f"echo: {tag} shared one"]
    mark = len(fake_llm.requests)
    r = d.post(f"/api/agents/{agent_id}/message/stream", json={"message": f"{tag} carol three", "user": "carol"})
    assert r.status_code == 200 and "event: done" in r.text
    assert _histories(fake_llm, mark, f"{tag} carol three") == [
        [f"{tag} carol one", f"{tag} carol two", f"{tag} carol three"]]
    bad = d.post(f"/api/agents/{agent_id}/message", json={"message": "x", "user": ""})
    assert bad.status_code == 400 and "user" in bad.json()["error"]


NUL_REFUSED = "must not contain the NUL character (\\u0000), which PostgreSQL cannot store"


def test_a_person_or_session_name_is_refused_the_same_way_everywhere(d: Daemon) -> None:
    agent_id, name = spawn(d, "names")
    long_name = "p" * 257
    for field, value, error in [("user", "a\x00b", f"invalid request: user: {NUL_REFUSED}"),
                                ("session", "a\x00b", f"invalid request: session: {NUL_REFUSED}"),
                                ("user", long_name, "invalid request: user: Length must be between 1 and 256.")]:
        r = d.post(f"/api/agents/{agent_id}/message", json={"message": "hi", field: value})
        assert (r.status_code, r.json()) == (400, {"error": error}), r.text
        r = d.get(f"/api/agents/{agent_id}/session", params={field: value})
        assert r.status_code == 400 and r.json()["error"].startswith(f"invalid request: {field}: "), r.text
    # `/v1`'s `user` names the same person's session, with the same limits.
    for value, error in [("a\x00b", f"invalid request: user: {NUL_REFUSED}"),
                         (long_name, "invalid request: user: Length must be between 1 and 256.")]:
        for path, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/responses", {"input": "hi"})]:
            r = d.post(path, json={"model": f"agentd:{name}", "user": value, **body})
            assert (r.status_code, r.json()["error"]["message"]) == (400, error), r.text
    r = d.post("/v1/chat/completions", json={"model": f"agentd:{name}", "user": "p" * 256,
                                             "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert d.get(f"/api/agents/{agent_id}/session", params={"user": "p" * 256}).json()["message_count"] == 2


def test_two_keys_on_one_agent_see_sessions_of_their_own(d: Daemon, fake_llm) -> None:
    agent_id, _ = spawn(d, "shared")
    tag = uuid.uuid4().hex[:6]
    one, two = new_key(d), new_key(d)
    ones = as_key(d, one, "POST", f"/api/agents/{agent_id}/message", json={"message": f"{tag} one says hi"})
    assert ones.status_code == 200, ones.text
    streamed = as_key(d, two, "POST", f"/api/agents/{agent_id}/message/stream", json={"message": f"{tag} two says hi"})
    assert streamed.status_code == 200 and "event: done" in streamed.text
    mark = len(fake_llm.requests)
    assert as_key(d, one, "POST", f"/api/agents/{agent_id}/message",
                  json={"message": f"{tag} one again"}).status_code == 200
    assert _histories(fake_llm, mark, f"{tag} one again") == [[f"{tag} one says hi", f"{tag} one again"]]

    def contents(key: dict[str, Any] | None, **query: str) -> tuple[str, list[str]]:
        r = as_key(d, key, "GET", f"/api/agents/{agent_id}/session", params=query) if key else \
            d.get(f"/api/agents/{agent_id}/session", params=query)
        assert r.status_code == 200, r.text
        return r.json()["session_id"], [m["content"] for m in r.json()["messages"]]

    own_id, seen = contents(one)
    assert seen == [f"{tag} one says hi", f"echo: {tag} one says hi", f"{tag} one again", f"echo: {tag} one again"]
    two_id, seen = contents(two)
    assert seen == [f"{tag} two says hi", f"echo: {tag} two says hi"]
    agent_session = d.get(f"/api/agents/{agent_id}").json()["session_id"]
    assert len({own_id, two_id, agent_session}) == 3
    assert contents(None) == (agent_session, [])  # the admin's: the agent's own, which no key talked in
    # A person's session is read with the `user` the messages named.
    assert as_key(d, one, "POST", f"/api/agents/{agent_id}/message",
                  json={"message": f"{tag} for dana", "user": "dana"}).status_code == 200
    assert contents(one, user="dana")[1] == [f"{tag} for dana", f"echo: {tag} for dana"]
    assert contents(two, user="dana")[1] == []  # a key's people are its own
    labels = {who: as_key(d, key, "GET", f"/api/agents/{agent_id}/session", params=query).json()["label"]
              for who, key, query in [("one", one, {}), ("one's dana", one, {"user": "dana"})]}
    assert labels == {"one": f"key:{one['id']}", "one's dana": f"key:{one['id']}:user:dana"}
    r = as_key(d, one, "GET", f"/api/agents/{agent_id}/session", params={"user": ""})
    assert r.status_code == 400 and "user" in r.json()["error"]
    # A reset with a key clears the session it talks in, not another's.
    manager = new_key(d, scopes=["read", "message", "manage"])
    assert as_key(d, manager, "POST", f"/api/agents/{agent_id}/message", json={"message": f"{tag} m"}).status_code == 200
    r = as_key(d, manager, "POST", f"/api/agents/{agent_id}/session/reset")
    assert r.status_code == 200 and r.json()["session_id"] == contents(manager)[0], r.text
    assert contents(manager)[1] == [] and len(contents(one)[1]) == 4


def test_keys_need_an_admin_key(daemon_factory, fake_llm) -> None:
    keyless = daemon_factory(llm_config(fake_llm), env_extra=LLM_ENV)
    r = keyless.post("/api/keys", json={"name": "x", "scopes": ["read"]})
    assert r.status_code == 409 and "need an admin key" in r.json()["error"]
    assert keyless.get("/api/keys").json() == []


def test_dashboard_login_with_a_key_sees_what_it_may(d: Daemon) -> None:
    visible, _ = spawn(d, "dash-in")
    hidden, hidden_name = spawn(d, "dash-out")
    job = d.post("/api/cron/jobs", json={"agent_id": hidden, "name": f"dash-job-{uuid.uuid4().hex[:6]}",
                                         "schedule": {"kind": "every", "every_secs": 3600},
                                         "action": {"kind": "agent_turn", "message": "m"}}).json()
    key = new_key(d, scopes=["read", "message"], agents=["dash-in-*"])
    browser = signed_in(d, key["key"])
    page = browser.get(f"{d.url}/agents")
    assert page.status_code == 200 and visible in page.text and hidden not in page.text
    assert browser.get(f"{d.url}/agents/{hidden}").status_code == 404
    # By name too, in the words a name no agent has gets.
    by_name, unknown = browser.get(f"{d.url}/agents/{hidden_name}"), browser.get(f"{d.url}/agents/nobody-here")
    assert by_name.status_code == unknown.status_code == 404
    assert by_name.text.replace(hidden_name, "<name>") == unknown.text.replace("nobody-here", "<name>")
    assert browser.get(f"{d.url}/keys").status_code == 403
    assert [a["id"] for a in browser.get(f"{d.url}/api/agents").json()] == [visible]
    assert browser.get(f"{d.url}/usage").status_code == 200
    page = browser.get(f"{d.url}/schedules")
    assert page.status_code == 200 and job["name"] not in page.text and hidden_name not in page.text
    assert browser.get(f"{d.url}/schedules/{job['id']}").status_code == 404
    # A socket the login opened (the dashboard's chat) works until the key's secret changes.
    import websocket

    ws = websocket.create_connection(d.url.replace("http://", "ws://") + f"/api/agents/{visible}/ws",
                                     timeout=10, cookie="; ".join(f"{k}={v}" for k, v in browser.cookies.items()))
    try:
        assert json.loads(ws.recv())["type"] == "connected"
        ws.send(json.dumps({"type": "command", "command": "stop"}))
        assert _answer(ws) == {"type": "command_result", "command": "stop", "message": "no run in progress"}
        # A rotation ends the sessions signed in with the old secret, as it ends the secret.
        assert d.post(f"/api/keys/{key['id']}/rotate").status_code == 200
        ws.send(json.dumps({"type": "command", "command": "stop"}))
        assert _answer(ws) == {"type": "error", "content": f"API key '{key['name']}' is no longer valid"}
    finally:
        ws.close()
    r = browser.get(f"{d.url}/api/agents")
    assert r.status_code == 401, r.text
    assert browser.get(f"{d.url}/agents", allow_redirects=False).status_code in (302, 303)


def test_dashboard_offers_only_the_forms_a_keys_scopes_allow(d: Daemon) -> None:
    agent_id, name = spawn(d, "forms")
    pages = {}
    for scopes in (["read"], ["read", "message"], ["read", "message", "manage"]):
        browser = signed_in(d, new_key(d, scopes=scopes, agents=["forms-*"])["key"])
        pages[len(scopes)] = (browser.get(f"{d.url}/agents").text, browser.get(f"{d.url}/agents/{agent_id}").text)
    listing, agent = pages[1]
    assert 'id="spawn-form"' not in listing and name in listing
    assert 'id="chat"' not in agent and 'id="chat-scope"' in agent and "Kill agent" not in agent
    assert 'name="mode"' not in agent and "Stop run" not in agent
    listing, agent = pages[2]
    assert 'id="spawn-form"' not in listing and 'id="chat"' in agent and "Stop run" in agent
    assert "Kill agent" not in agent and 'name="mode"' not in agent
    listing, agent = pages[3]
    assert 'id="spawn-form"' in listing and 'id="chat"' in agent and "Kill agent" in agent and 'name="mode"' in agent


def test_every_dashboard_page_offers_only_the_forms_a_keys_scopes_allow(d: Daemon) -> None:
    agent_id, name = spawn(d, "pageforms")
    api = f"/api/memory/agents/{agent_id}"
    assert d.put(f"{api}/kv/colour", json="blue").status_code == 200
    fragment = d.post(f"{api}/memories", json={"content": "likes tea"}).json()["id"]
    job = d.post("/api/cron/jobs", json={"agent_id": agent_id, "name": f"forms-{uuid.uuid4().hex[:6]}",
                                         "schedule": {"kind": "every", "every_secs": 3600},
                                         "action": {"kind": "agent_turn", "message": "m"}}).json()["id"]
    trigger = d.post("/api/triggers", json={"agent_id": agent_id, "pattern": {"content_match": "x"},
                                            "prompt_template": "saw {{event}}"}).json()["id"]
    task = d.post("/api/tasks", json={"title": "a task"}).json()["id"]
    workflow = make_workflow(d, name)
    agent, memory, job_url = f"/agents/{agent_id}", f"/agents/{agent_id}/memory", f"/schedules/{job}"
    fragment_url, trigger_url = f"{memory}/fragments/{fragment}", f"/triggers/{trigger}"
    workflow_url = f"/workflows/{workflow}"
    # A tool call waiting for approval, for the approvals page's buttons.
    assert d.http.put(f"{d.url}/api/agents/{agent_id}/mode", json={"mode": "Manual"}).status_code == 200
    talk = threading.Thread(target=lambda: d.post(f"/api/agents/{agent_id}/message", json={
        "message": '[[tool:memory_store {"key": "k", "value": "v"}]]'}))
    talk.start()
    wait_until(lambda: any(a["agent_id"] == agent_id for a in d.get("/api/approvals").json()), "an approval")
    approval = next(a["id"] for a in d.get("/api/approvals").json() if a["agent_id"] == agent_id)

    def post(url: str) -> str:
        return f'method="post" action="{url}"'

    def link(url: str) -> str:  # a link to the page with the form, or to a confirmed action's question
        return f'href="{url}"'

    # page -> (what the page holds when it offers the form, the scope the form needs)
    pages = {
        agent: [(post(f"{agent}/message"), "message"), (post(f"{agent}/stop"), "message"),
                (post(f"{agent}/mode"), "manage"), (link(f"{agent}/kill"), "manage"),
                (post(f"/approvals/{approval}/approve"), "manage")],
        "/approvals": [(post(f"/approvals/{approval}/approve"), "manage"),
                       (post(f"/approvals/{approval}/reject"), "manage")],
        memory: [(post(f"{memory}/kv"), "manage"), (link(f"{memory}/kv/delete?key=colour"), "manage"),
                 (post(f"{memory}/fragments"), "manage"), (link(f"{fragment_url}/delete"), "manage"),
                 (post(f"{memory}/import"), "manage"), (post(f"{memory}/consolidate"), "manage")],
        fragment_url: [(post(fragment_url), "manage"), (link(f"{fragment_url}/delete"), "manage")],
        f"{memory}/graph": [(post(f"{memory}/graph/entities"), "manage"),
                            (post(f"{memory}/graph/relations"), "manage")],
        "/providers": [(post("/providers/openai/test"), "manage"), (post("/providers/openai/key"), "admin"),
                       (post("/providers/url"), "admin")],
        "/usage": [(post("/usage/budget"), "admin")],
        "/schedules": [(post("/schedules"), "manage"), (post(f"{job_url}/run"), "manage"),
                       (post(f"{job_url}/disable"), "manage")],
        job_url: [(post(f"{job_url}/edit"), "manage"), (post(f"{job_url}/run"), "manage"),
                  (link(f"{job_url}/delete"), "manage")],
        f"/triggers?edit={trigger}": [(post("/triggers"), "manage"), (post(f"{trigger_url}/edit"), "manage"),
                                      (post(f"{trigger_url}/disable"), "manage"),
                                      (link(f"{trigger_url}/delete"), "manage")],
        "/tasks": [(post("/tasks"), "manage"), (link(f"/tasks/{task}/delete"), "manage")],
        "/workflows": [(link("/workflows/new"), "manage")],
        workflow_url: [(post(f"{workflow_url}/run"), "manage"), (link(f"{workflow_url}/edit"), "manage")],
        "/channels/telegram": [(post("/channels/telegram/configure"), "manage")],
        "/skills": [(post("/skills/install"), "admin"), (post("/skills/reload"), "manage")],
        "/mcp-servers": [(post("/mcp-servers/reload"), "admin")],
    }
    try:
        for scopes in (["read"], ["read", "message"], ["admin"]):
            browser = signed_in(d, ADMIN if scopes == ["admin"] else new_key(d, scopes=scopes)["key"])
            for page, forms in pages.items():
                r = browser.get(d.url + page)
                assert r.status_code == 200, (scopes, page, r.status_code)
                for form, scope in forms:
                    assert (form in r.text) == (scope in scopes or scopes == ["admin"]), (scopes, page, form)
                # Where a whole form is gone, the page says which scope it needs.
                assert ("which this key does not hold" in r.text) == (scopes != ["admin"]), (scopes, page)
    finally:
        d.post(f"/api/approvals/{approval}/reject")
        talk.join(30)


def test_a_form_the_keys_scope_refuses_shows_what_was_typed(d: Daemon) -> None:
    agent_id, _ = spawn(d, "draft")
    key = new_key(d, scopes=["read", "message"])
    browser = signed_in(d, key["key"])
    page = browser.get(f"{d.url}/agents/{agent_id}").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    # The page offered the chat; the key loses the scope before the message is sent.
    assert d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"scopes": ["read"]}).status_code == 200
    draft = "a long message <worth> keeping"
    r = browser.post(f"{d.url}/agents/{agent_id}/message", data={"message": draft, "csrf_token": token},
                     allow_redirects=False)
    assert r.status_code == 403 and "is missing scope &#39;message&#39;" in r.text, r.text
    assert "a long message &lt;worth&gt; keeping" in r.text, "what was typed is shown to copy"
    assert draft not in str(d.get(f"/api/agents/{agent_id}/session").json())


def test_dashboard_keys_page(d: Daemon) -> None:
    browser = requests.Session()
    login = browser.get(f"{d.url}/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', login.text).group(1)
    assert browser.post(f"{d.url}/login", data={"api_key": ADMIN, "csrf_token": token}).status_code == 200
    page = browser.get(f"{d.url}/keys")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
    name = f"dash-{uuid.uuid4().hex[:6]}"
    made = browser.post(f"{d.url}/keys", data={"name": name, "scopes": ["read", "message"],
                                                "budget_usd_per_day": "2", "csrf_token": token})
    assert made.status_code == 200 and [r.status_code for r in made.history] == [303], made.text
    assert f"key {name} created" in made.text
    secret = re.search(r'<code id="key-value">(agd_[^<]+)</code>', made.text).group(1)
    assert as_key(d, secret, "GET", "/api/status").status_code == 200
    key_id = d.get(f"/api/keys/{name}").json()["id"]
    assert secret not in browser.get(f"{d.url}/keys").text  # shown once
    assert browser.post(f"{d.url}/keys/{key_id}/disable", data={"csrf_token": token}).status_code == 200
    assert d.get(f"/api/keys/{key_id}").json()["enabled"] is False
    # Rotating and deleting ask first (the confirmation page), and do nothing until confirmed.
    asked = browser.post(f"{d.url}/keys/{key_id}/rotate", data={"csrf_token": token})
    assert asked.status_code == 200 and [r.status_code for r in asked.history] == [303]
    assert f"<h1>Rotate key {name}?</h1>" in asked.text and 'id="key-value"' not in asked.text
    rotated = browser.post(f"{d.url}/keys/{key_id}/rotate", data={"csrf_token": token, "confirm": "yes"})
    assert rotated.status_code == 200 and secret not in rotated.text and 'id="key-value"' in rotated.text
    assert [r.status_code for r in rotated.history] == [303]
    assert 'id="key-value"' not in browser.get(f"{d.url}/keys").text, "a refresh shows no secret"
    asked = browser.post(f"{d.url}/keys/{key_id}/delete", data={"csrf_token": token})
    assert f"<h1>Delete key {name}?</h1>" in asked.text and d.get(f"/api/keys/{key_id}").status_code == 200
    deleted = browser.post(f"{d.url}/keys/{key_id}/delete", data={"csrf_token": token, "confirm": "yes"})
    assert deleted.status_code == 200 and f"key {name} deleted" in deleted.text
    assert d.get(f"/api/keys/{key_id}").status_code == 404
    usage = browser.get(f"{d.url}/usage")
    assert usage.status_code == 200 and 'id="per-key"' in usage.text
    typed = {"name": f"{name}-late", "scopes": ["read", "manage"], "agents": "helper-*", "budget_usd_per_day": "3",
             "rate_limit_per_minute": "7", "csrf_token": token}
    for expiry, error in (("tomorrow", "expires_at: expires_at is not an ISO 8601 date-time with an offset "
                                       "(2030-01-01T00:00:00Z): &#39;tomorrow&#39;"),
                          ("2030-01-01T00:00:00", "with an offset")):
        refused = browser.post(f"{d.url}/keys", data={**typed, "expires_at": expiry}, allow_redirects=False)
        assert refused.status_code == 400 and error in refused.text, refused.text[-3000:]
        assert all(f'value="{value}"' in refused.text
                   for value in (f"{name}-late", "helper-*", "3", "7", expiry)), "what was typed is kept"
        assert re.findall(r'name="scopes" value="(\w+)" checked', refused.text) == ["read", "manage"]
    assert d.get(f"/api/keys/{name}-late").status_code == 404

    edited = browser.post(f"{d.url}/keys", data={"name": f"{name}-edit", "scopes": ["read"], "agents": "helper-*",
                                                  "budget_usd_per_day": "2", "csrf_token": token})
    key_id = d.get(f"/api/keys/{name}-edit").json()["id"]
    assert f'href="/keys?edit={key_id}#edit-key">Edit</a>' in edited.text
    form = browser.get(f"{d.url}/keys?edit={key_id}").text
    form = form[form.index('id="edit-key"'):]
    assert (f'action="/keys/{key_id}/edit"' in form and f'value="{name}-edit"' in form and 'value="helper-*"' in form
            and 'name="budget_usd_per_day" inputmode="decimal" value="2"' in form)
    assert re.findall(r'name="scopes" value="(\w+)" checked', form) == ["read"]
    change = {"name": f"{name}-edited", "scopes": ["read", "message"], "agents": "", "budget_usd_per_day": "",
              "budget_usd_per_month": "9", "rate_limit_per_minute": "0", "expires_at": "", "csrf_token": token}
    refused = browser.post(f"{d.url}/keys/{key_id}/edit", data=change, allow_redirects=False)
    assert refused.status_code == 400 and "rate_limit_per_minute: Must be greater than or equal to 1" in refused.text
    assert f'value="{name}-edited"' in refused.text and 'id="edit-key"' in refused.text, "what was typed is kept"
    saved = browser.post(f"{d.url}/keys/{key_id}/edit", data={**change, "rate_limit_per_minute": "30"},
                         allow_redirects=False)
    assert saved.status_code == 303 and f"key {name}-edited saved" in browser.get(d.url + saved.headers["Location"]).text
    key = d.get(f"/api/keys/{key_id}").json()
    assert (key["name"], key["scopes"], key["agents"], key["budget_usd_per_day"], key["budget_usd_per_month"],
            key["rate_limit_per_minute"], key["expires_at"]) == (f"{name}-edited", ["read", "message"], [], None,
                                                                 9.0, 30, None)


def test_websocket_with_a_key_and_a_user(d: Daemon, fake_llm) -> None:
    import websocket

    agent_id, _ = spawn(d, "socket")
    tag = uuid.uuid4().hex[:6]
    within_one_utc_period(30, DAY)  # the spend and the refusal below, in one budget day
    key = new_key(d, budget_usd_per_day=0.000001)
    base = d.url.replace("http://", "ws://") + f"/api/agents/{agent_id}/ws?token={key['key']}"
    ws = websocket.create_connection(f"{base}&user=erin", timeout=10)
    try:
        assert json.loads(ws.recv()) == {"type": "connected", "agent_id": agent_id}
        ws.send(json.dumps({"type": "message", "content": f"{tag} erin one"}))
        frames = []
        while not frames or frames[-1]["type"] not in ("response", "error"):
            frames.append(json.loads(ws.recv()))
        assert frames[-1]["type"] == "response", frames
        ws.send(json.dumps({"type": "message", "content": f"{tag} erin two"}))
        frame = json.loads(ws.recv())
        assert frame["type"] == "error" and f"API key '{key['name']}' is over its budget" in frame["content"]
    finally:
        ws.close()
    # Erin's exchange went to her session (through this key), not the agent's own.
    assert d.get(f"/api/agents/{agent_id}/session").json()["messages"] == []
    reader = new_key(d, scopes=["read"])
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(d.url.replace("http://", "ws://") + f"/api/agents/{agent_id}/ws"
                                    f"?token={reader['key']}", timeout=10)
    assert refused.value.status_code == 403


def _socket(d: Daemon, agent_id: str, key: dict[str, Any] | None = None, query: str = ""):
    import websocket

    token = f"?token={key['key']}" if key else "?"
    ws = websocket.create_connection(d.url.replace("http://", "ws://") + f"/api/agents/{agent_id}/ws{token}{query}",
                                     timeout=10)
    assert json.loads(ws.recv())["type"] == "connected"
    return ws


def _answer(ws) -> dict[str, Any]:
    """The frame that ends what the last frame sent asked for."""
    while True:
        frame = json.loads(ws.recv())
        if frame["type"] in ("response", "error", "command_result"):
            return frame


@pytest.mark.parametrize("change, refusal", [
    ("disable", "API key '{name}' is disabled"),
    ("delete", "invalid API key"),
    ("rotate", "invalid API key"),
])
def test_an_open_socket_stops_working_when_its_key_does(d: Daemon, change: str, refusal: str) -> None:
    import websocket

    agent_id, _ = spawn(d, "sock-key")
    key = new_key(d)
    ws = _socket(d, agent_id, key)
    try:
        ws.send(json.dumps({"type": "message", "content": "before"}))
        assert _answer(ws)["type"] == "response"
        if change == "disable":
            assert d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"enabled": False}).status_code == 200
        elif change == "delete":
            assert d.delete(f"/api/keys/{key['id']}").status_code == 200
        else:
            assert d.post(f"/api/keys/{key['id']}/rotate").status_code == 200
        ws.send(json.dumps({"type": "message", "content": "after"}))
        assert _answer(ws) == {"type": "error", "content": refusal.format(name=key["name"])}
        with pytest.raises((websocket.WebSocketConnectionClosedException, ConnectionError)):
            for _ in range(5):  # the daemon closes the socket: nothing else comes
                ws.recv()
    finally:
        ws.close()
    assert [m["content"] for m in d.get(f"/api/agents/{agent_id}/session").json()["messages"]] == []


def test_a_sockets_frames_need_the_scopes_the_routes_need(d: Daemon) -> None:
    agent_id, _ = spawn(d, "sock-scope")
    d.post(f"/api/agents/{agent_id}/message", json={"message": "the admin's own"}).raise_for_status()
    key = new_key(d)  # read and message
    ws = _socket(d, agent_id, key)
    try:
        for command in ("reset", "new", "compact"):
            ws.send(json.dumps({"type": "command", "command": command}))
            assert _answer(ws) == {"type": "error",
                                   "content": f"forbidden: API key '{key['name']}' is missing scope 'manage'"}
        ws.send(json.dumps({"type": "message", "content": "mine"}))
        assert _answer(ws)["type"] == "response"
        assert d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"scopes": ["read"]}).status_code == 200
        ws.send(json.dumps({"type": "message", "content": "no longer"}))
        assert _answer(ws) == {"type": "error",
                               "content": f"forbidden: API key '{key['name']}' is missing scope 'message'"}
        assert d.http.patch(f"{d.url}/api/keys/{key['id']}",
                            json={"scopes": ["read", "message", "manage"]}).status_code == 200
        # A reset clears the session the socket talks in (the key's own), not the agent's.
        ws.send(json.dumps({"type": "command", "command": "reset"}))
        assert _answer(ws) == {"type": "command_result", "command": "reset",
                               "message": "session reset; history cleared"}
    finally:
        ws.close()
    assert as_key(d, key, "GET", f"/api/agents/{agent_id}/session").json()["messages"] == []
    assert [m["content"] for m in d.get(f"/api/agents/{agent_id}/session").json()["messages"]] == [
        "the admin's own", "echo: the admin's own"]


def test_a_stop_ends_the_run_of_the_session_it_names(d: Daemon) -> None:
    agent_id, _ = spawn(d, "stopper")
    key = new_key(d)
    outcome: dict[str, Any] = {}

    def talk(label: str, **kwargs: Any) -> None:
        outcome[label] = (as_key(d, key, "POST", f"/api/agents/{agent_id}/message", **kwargs) if label != "admin"
                          else d.post(f"/api/agents/{agent_id}/message", **kwargs))

    runs = [threading.Thread(target=talk, args=("key",), kwargs={"json": {"message": "[[slow:2.5]] key"}}),
            threading.Thread(target=talk, args=("admin",), kwargs={"json": {"message": "[[slow:2.5]] admin"}})]
    for run in runs:
        run.start()
    try:
        # Asked until the key's run is under way (a stop before then finds nothing to stop).
        stopped: list[requests.Response] = []
        wait_until(lambda: stopped.append(r := as_key(d, key, "POST", f"/api/agents/{agent_id}/stop"))
                   or r.json()["was_running"], "the key's run to be stopped", timeout=10)
        assert stopped[-1].json() == {"status": "stopped", "agent_id": agent_id, "was_running": True,
                                      "message": "run cancelled"}, stopped[-1].text
        r = as_key(d, key, "POST", f"/api/agents/{agent_id}/stop", params={"user": "nobody"})
        assert r.json()["was_running"] is False
    finally:
        for run in runs:
            run.join(30)
    assert (outcome["key"].status_code, outcome["key"].json()["error"]) == (
        409, "run cancelled: the agent was stopped before it answered")
    assert outcome["admin"].status_code == 200, "BUG: a key's stop ended the admin's run"


def test_a_key_clears_only_its_own_sessions(d: Daemon) -> None:
    agent_id, _ = spawn(d, "sessions")
    hidden_id, _ = spawn(d, "sessions-hidden")
    key = new_key(d, scopes=["read", "message", "manage"], agents=[agent_id])
    other = new_key(d)
    for who, target, extra in [(key, agent_id, {}), (key, agent_id, {"user": "ann"}), (other, agent_id, {}),
                               (None, agent_id, {"user": "ann"}), (None, hidden_id, {})]:
        r = (as_key(d, who, "POST", f"/api/agents/{target}/message", json={"message": "hi", **extra}) if who
             else d.post(f"/api/agents/{target}/message", json={"message": "hi", **extra}))
        assert r.status_code == 200, r.text
    mine = as_key(d, key, "GET", f"/api/agents/{agent_id}/session").json()["session_id"]
    my_ann = as_key(d, key, "GET", f"/api/agents/{agent_id}/session", params={"user": "ann"}).json()["session_id"]
    others = [as_key(d, other, "GET", f"/api/agents/{agent_id}/session").json()["session_id"],
              d.get(f"/api/agents/{agent_id}/session", params={"user": "ann"}).json()["session_id"],
              d.get(f"/api/agents/{agent_id}/session").json()["session_id"],
              d.get(f"/api/agents/{hidden_id}/session").json()["session_id"]]
    for session_id in others:
        r = as_key(d, key, "DELETE", f"/api/sessions/{session_id}")
        assert (r.status_code, r.json()) == (404, {"error": "session not found"}), r.text
    assert d.get(f"/api/agents/{agent_id}/session", params={"user": "ann"}).json()["message_count"] == 2
    for session_id in (mine, my_ann):
        r = as_key(d, key, "DELETE", f"/api/sessions/{session_id}")
        assert r.json() == {"status": "deleted", "session_id": session_id}, r.text
    assert as_key(d, key, "GET", f"/api/agents/{agent_id}/session").json()["message_count"] == 0
    assert d.delete(f"/api/sessions/{others[1]}").status_code == 200  # the admin clears any
    assert d.delete(f"/api/sessions/{others[3]}").status_code == 200  # of any agent


def tell_pets(d: Daemon, agent_id: str, key: dict[str, Any], other: dict[str, Any]) -> None:
    """Four exchanges remembered, one of each owner (the key, its person ann, another key, the
    admin's person bo), and one agent-wide fact; back once all five are stored."""
    for who, extra, text in [(key, {}, "the key's own pet is a parrot"), (key, {"user": "ann"}, "ann's pet is a cat"),
                             (other, {}, "the other key's pet is a dog"), (None, {"user": "bo"}, "bo's pet is a fish")]:
        r = (as_key(d, who, "POST", f"/api/agents/{agent_id}/message", json={"message": text, **extra}) if who
             else d.post(f"/api/agents/{agent_id}/message", json={"message": text, **extra}))
        assert r.status_code == 200, r.text
    assert d.post(f"/api/memory/agents/{agent_id}/memories", json={"content": "every pet here is fed at noon"}
                  ).status_code == 201
    wait_until(lambda: d.get(f"/api/memory/agents/{agent_id}/memories").json()["total"] == 5, "the exchanges stored")


def test_a_keys_recall_sees_only_its_own_exchanges_and_agent_wide_facts(d: Daemon) -> None:
    agent_id, _ = spawn(d, "recall")
    key, other = new_key(d), new_key(d)
    tell_pets(d, agent_id, key, other)
    query = {"query": "which pet", "limit": 10, "min_score": 0}

    def recalled(who: dict[str, Any] | None) -> set[str]:
        r = (as_key(d, who, "POST", f"/api/memory/agents/{agent_id}/recall", json=query) if who
             else d.post(f"/api/memory/agents/{agent_id}/recall", json=query))
        assert r.status_code == 200, r.text
        return {next(w for w in ("parrot", "cat", "dog", "fish", "noon") if w in m["content"])
                for m in r.json()["memories"]}

    assert recalled(key) == {"parrot", "cat", "noon"}
    assert recalled(other) == {"dog", "noon"}
    assert recalled(None) == {"parrot", "cat", "dog", "fish", "noon"}


def test_a_key_lists_exports_and_reaches_only_its_own_exchanges_and_agent_wide_facts(d: Daemon) -> None:
    agent_id, _ = spawn(d, "listing")
    key, other = new_key(d, scopes=["read", "message", "manage"]), new_key(d)
    tell_pets(d, agent_id, key, other)
    base = f"/api/memory/agents/{agent_id}"
    pets = ("parrot", "cat", "dog", "fish", "noon")

    def pet(text: str) -> str:
        return next(w for w in pets if w in text)

    everything = {pet(m["content"]): m["id"] for m in d.get(f"{base}/memories").json()["memories"]}
    listed = as_key(d, key, "GET", f"{base}/memories").json()
    assert listed["total"] == 3 and sorted(pet(m["content"]) for m in listed["memories"]) == ["cat", "noon", "parrot"]
    paged = as_key(d, key, "GET", f"{base}/memories", params={"limit": 2, "offset": 2}).json()
    assert paged["total"] == 3 and len(paged["memories"]) == 1
    assert sorted(pet(m["content"]) for m in as_key(d, other, "GET", f"{base}/memories").json()["memories"]) == [
        "dog", "noon"]
    exported = as_key(d, key, "GET", f"{base}/export").json()
    assert sorted(pet(m["content"]) for m in exported["memories"]) == ["cat", "noon", "parrot"]
    assert len(d.get(f"{base}/export").json()["memories"]) == 5
    absent = {"error": f"memory not found: {everything['dog']}"}
    for method, extra in (("GET", {}), ("PUT", {"json": {"content": "mine now"}}), ("DELETE", {})):
        r = as_key(d, key, method, f"{base}/memories/{everything['dog']}", **extra)
        assert (r.status_code, r.json()) == (404, absent), (method, r.text)
    assert pet(d.get(f"{base}/memories/{everything['dog']}").json()["content"]) == "dog"  # untouched
    for own in ("parrot", "cat", "noon"):
        assert as_key(d, key, "GET", f"{base}/memories/{everything[own]}").status_code == 200
    r = as_key(d, key, "PUT", f"{base}/memories/{everything['cat']}", json={"content": "ann's pet is a black cat"})
    assert r.status_code == 200 and r.json()["content"] == "ann's pet is a black cat", r.text
    assert as_key(d, key, "DELETE", f"{base}/memories/{everything['parrot']}").status_code == 200
    # The dashboard's memory page, its search, a fragment's page and the export file alike.
    browser = signed_in(d, key["key"])
    page = browser.get(f"{d.url}/agents/{agent_id}/memory", params={"q": "which pet"}).text
    assert "black cat" in page and "noon" in page and "dog" not in page and "fish" not in page
    assert browser.get(f"{d.url}/agents/{agent_id}/memory/fragments/{everything['fish']}").status_code == 404
    document = browser.get(f"{d.url}/agents/{agent_id}/memory/export").json()
    assert sorted(pet(m["content"]) for m in document["memories"]) == ["cat", "noon"]


def test_a_key_compacts_its_own_session_and_keeps_what_arrives_meanwhile(d: Daemon) -> None:
    agent_id, _ = spawn(d, "compact")
    key = new_key(d, scopes=["read", "message", "manage"])
    assert d.post(f"/api/agents/{agent_id}/message", json={"message": "the admin's turn"}).status_code == 200
    # The summary call is slow: a turn of the key's arrives while it runs.
    texts = ["[[slow:1]][[reply:SUMMARY]] first"] + [f"turn {n}" for n in range(1, 6)]
    for text in texts:
        assert as_key(d, key, "POST", f"/api/agents/{agent_id}/message", json={"message": text}).status_code == 200
    before = [m["content"] for m in as_key(d, key, "GET", f"/api/agents/{agent_id}/session").json()["messages"]]
    compacted: list[requests.Response] = []
    worker = threading.Thread(target=lambda: compacted.append(
        as_key(d, key, "POST", f"/api/agents/{agent_id}/session/compact")))
    worker.start()
    time.sleep(0.4)
    assert as_key(d, key, "POST", f"/api/agents/{agent_id}/message", json={"message": "[[reply:late]]"}
                  ).status_code == 200
    worker.join(30)
    assert compacted[0].status_code == 200, compacted[0].text
    assert (compacted[0].json()["summarized_messages"], compacted[0].json()["kept_messages"]) == (2, 10)
    after = [m["content"] for m in as_key(d, key, "GET", f"/api/agents/{agent_id}/session").json()["messages"]]
    assert after == ["[Summary of the earlier conversation]\nSUMMARY"] + before[2:] + ["[[reply:late]]", "late"]
    # The admin's session was not touched.
    own = d.get(f"/api/agents/{agent_id}/session").json()
    assert own["message_count"] == 2 and own["messages"][0]["content"] == "the admin's turn"


def test_a_keys_cron_job_runs_in_the_agents_own_session(d: Daemon) -> None:
    agent_id, _ = spawn(d, "cron-own")
    key = new_key(d, scopes=["read", "message", "manage"])
    created = as_key(d, key, "POST", "/api/cron/jobs", json={
        "agent_id": agent_id, "name": f"own-{uuid.uuid4().hex[:6]}", "schedule": {"kind": "every", "every_secs": 3600},
        "action": {"kind": "agent_turn", "message": "from the key's job"}})
    assert created.status_code == 201, created.text
    assert as_key(d, key, "POST", f"/api/cron/jobs/{created.json()['id']}/run").status_code == 202
    wait_until(lambda: d.get(f"/api/agents/{agent_id}/session").json()["message_count"] == 2, "the job's run")
    assert as_key(d, key, "GET", f"/api/agents/{agent_id}/session").json()["message_count"] == 0


def test_a_channel_of_an_agent_outside_the_list_is_out_of_reach(d: Daemon) -> None:
    inside, inside_name = spawn(d, "desk-a")
    outside, outside_name = spawn(d, "desk-b")
    key = new_key(d, scopes=["read", "manage"], agents=["desk-a-*"])
    absent = {"error": "agent not found"}
    for agent in (outside_name, "desk-a-nobody", str(uuid.uuid4())):  # (an agent that does not exist: the same)
        r = as_key(d, key, "POST", "/api/channels/webhook/configure", json={"default_agent": agent})
        assert (r.status_code, r.json()) == (404, absent), agent
    r = as_key(d, key, "POST", "/api/channels/webhook/configure", json={"allowed_users": ["u1"]})
    assert r.status_code == 400 and r.json()["error"].startswith("default_agent: ")
    r = as_key(d, key, "POST", "/api/channels/nosuch/configure", json={})
    assert r.status_code == 404 and r.json() == {"error": "unknown channel 'nosuch'"}
    assert d.post("/api/channels/webhook/configure", json={"default_agent": outside_name}).status_code == 200
    try:
        listed = next(c for c in as_key(d, key, "GET", "/api/channels").json() if c["name"] == "webhook")
        field = next(f for f in listed["fields"] if f["key"] == "default_agent")
        assert field["has_value"] is False and outside_name not in json.dumps(listed)
        admin_view = next(c for c in d.get("/api/channels").json() if c["name"] == "webhook")
        assert next(f for f in admin_view["fields"] if f["key"] == "default_agent")["value"] == outside_name
        browser = signed_in(d, key["key"])
        as_key(d, key, "POST", "/api/channels/webhook/test", json={"message": "hi"})
        d.post("/api/channels/webhook/test", json={"message": "hi"})  # fails: it names no callback_url
        page = browser.get(f"{d.url}/channels/webhook")
        assert page.status_code == 200 and outside_name not in page.text
        listing = browser.get(f"{d.url}/channels")
        assert listing.status_code == 200 and outside_name not in listing.text
        assert "Recent channel events" not in listing.text  # the audit trail is the admin's
        assert "nowhere to go" in d.get("/channels/webhook").text  # the failed test, on the admin's page
        assert "nowhere to go" not in page.text and "nowhere to go" not in listing.text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
        browser.post(f"{d.url}/channels/webhook/remove", data={"csrf_token": token, "confirm": "yes"})
        for method, path, body in [("DELETE", "/api/channels/webhook/configure", None),
                                   ("POST", "/api/channels/webhook/test", {"message": "hi"}),
                                   ("POST", "/api/channels/webhook/configure", {"default_agent": inside_name})]:
            r = as_key(d, key, method, path, json=body)
            assert (r.status_code, r.json()) == (404, absent), (method, path, r.text)
        assert d.get("/api/channels").json() and next(
            f for f in next(c for c in d.get("/api/channels").json() if c["name"] == "webhook")["fields"]
            if f["key"] == "default_agent")["value"] == outside_name
        # Its own agent's channel is the key's to manage.
        assert d.post("/api/channels/webhook/configure", json={"default_agent": inside}).status_code == 200
        listed = next(c for c in as_key(d, key, "GET", "/api/channels").json() if c["name"] == "webhook")
        assert next(f for f in listed["fields"] if f["key"] == "default_agent")["value"] == inside
        r = as_key(d, key, "POST", "/api/channels/webhook/configure", json={"default_agent": inside_name})
        assert r.status_code == 200 and r.json()["status"] == "configured", r.text
        r = as_key(d, key, "DELETE", "/api/channels/webhook/configure")
        assert r.status_code == 200 and r.json() == {"status": "removed", "channel": "webhook"}
    finally:
        d.delete("/api/channels/webhook/configure")
