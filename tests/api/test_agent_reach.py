"""A scoped key's agent list over cron jobs and triggers, through the real daemon: the items
of an agent outside the list are absent from lists, 404 like unknown ones on every route and
dashboard page, and naming such an agent in a body is refused as naming an unknown one."""

from __future__ import annotations

import re
import uuid
from typing import Any, Iterator

import pytest
import requests

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, stop_shared

ADMIN = "admin-secret-for-reach"
EVERY_HOUR = {"kind": "every", "every_secs": 3600}


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    home = make_home(tmp_path_factory.mktemp("reach"), f'api_key = "{ADMIN}"\n' + llm_config(fake_llm))
    daemon = Daemon(home, api_key=ADMIN, env_extra=LLM_ENV).start()
    yield daemon
    stop_shared(daemon)


def _spawn(d: Daemon, name: str) -> str:
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n'})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def test_jobs_and_triggers_of_agents_outside_the_list_are_absent(d: Daemon) -> None:
    mine, theirs = f"mine-{uuid.uuid4().hex[:6]}", f"theirs-{uuid.uuid4().hex[:6]}"
    _spawn(d, mine)
    _spawn(d, theirs)
    key = d.post("/api/keys", json={"name": f"k-{uuid.uuid4().hex[:6]}", "scopes": ["read", "manage"],
                                    "agents": [mine]}).json()["key"]

    def as_key(method: str, path: str, **kwargs: Any) -> requests.Response:
        return requests.request(method, d.url + path, headers={"Authorization": f"Bearer {key}"}, timeout=30,
                                **kwargs)

    turn = {"kind": "agent_turn", "message": "hello"}
    hidden = d.post("/api/cron/jobs", json={"name": "theirs", "agent_id": theirs, "schedule": EVERY_HOUR,
                                            "action": turn}).json()
    hidden_trigger = d.post("/api/triggers", json={"agent_id": theirs, "pattern": {"content_match": "x"},
                                                   "prompt_template": "{{event}}"}).json()
    r = as_key("POST", "/api/cron/jobs", json={"name": "own", "agent_id": mine, "schedule": EVERY_HOUR,
                                               "action": turn})
    assert r.status_code == 201, r.text
    own = r.json()
    assert [j["id"] for j in as_key("GET", "/api/cron/jobs").json()] == [own["id"]]
    assert as_key("GET", "/api/cron/jobs", params={"agent_id": theirs}).json() == []
    for method, path in (("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/run"), ("GET", "/runs")):
        r = as_key(method, f"/api/cron/jobs/{hidden['id']}{path}", json={} if method == "PATCH" else None)
        assert (r.status_code, r.json()) == (404, {"error": "cron job not found"}), (method, path)
    r = as_key("POST", "/api/cron/jobs", json={"name": "sneak", "agent_id": theirs, "schedule": EVERY_HOUR,
                                               "action": turn})
    assert (r.status_code, r.json()) == (400, {"error": f"agent_id: no agent '{theirs}'"})
    r = as_key("PATCH", f"/api/cron/jobs/{own['id']}", json={"agent_id": theirs})
    assert (r.status_code, r.json()) == (400, {"error": f"agent_id: no agent '{theirs}'"})
    assert d.get(f"/api/cron/jobs/{hidden['id']}").status_code == 200  # the admin sees everything

    r = as_key("POST", "/api/triggers", json={"agent_id": theirs, "pattern": {"content_match": "x"},
                                              "prompt_template": "{{event}}"})
    assert (r.status_code, r.json()) == (404, {"error": "agent not found"})
    assert as_key("GET", "/api/triggers").json() == []
    for method in ("GET", "PATCH", "DELETE"):
        r = as_key(method, f"/api/triggers/{hidden_trigger['id']}", json={} if method == "PATCH" else None)
        assert (r.status_code, r.json()) == (404, {"error": "trigger not found"}), method

    # The dashboard, logged in with the key, shows and steers only the key's agents' items.
    web = requests.Session()
    assert web.post(d.url + "/login", data={"api_key": key}, allow_redirects=False).status_code == 303
    page = web.get(d.url + "/schedules").text
    assert ">own</a>" in page and ">theirs</a>" not in page and theirs not in page
    assert web.get(d.url + f"/schedules/{hidden['id']}").status_code == 404
    token = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page).group(1)
    r = web.post(d.url + f"/schedules/{hidden['id']}/delete", data={"csrf_token": token}, allow_redirects=False)
    assert r.status_code == 404 and d.get(f"/api/cron/jobs/{hidden['id']}").status_code == 200
    r = web.post(d.url + "/schedules", data={"csrf_token": token, "name": "sneak", "agent_id": theirs,
                                             "kind": "every", "every_secs": "60", "message": "x"})
    assert r.status_code == 400 and f"agent_id: no agent &#39;{theirs}&#39;" in r.text
    r = web.post(d.url + f"/triggers/{hidden_trigger['id']}/delete", data={"csrf_token": token},
                 allow_redirects=False)
    assert r.status_code == 404 and d.get(f"/api/triggers/{hidden_trigger['id']}").status_code == 200
    assert hidden_trigger["id"] not in web.get(d.url + "/triggers").text


def test_tasks_of_agents_outside_the_list_are_absent(d: Daemon) -> None:
    mine, theirs = f"mine-{uuid.uuid4().hex[:6]}", f"theirs-{uuid.uuid4().hex[:6]}"
    mine_id, theirs_id = _spawn(d, mine), _spawn(d, theirs)
    key = d.post("/api/keys", json={"name": f"k-{uuid.uuid4().hex[:6]}", "scopes": ["read", "manage"],
                                    "agents": [mine]}).json()["key"]

    def as_key(method: str, path: str, **kwargs: Any) -> requests.Response:
        return requests.request(method, d.url + path, headers={"Authorization": f"Bearer {key}"}, timeout=30,
                                **kwargs)

    hidden = d.post("/api/tasks", json={"title": "for them", "assigned_to": theirs}).json()
    open_task = d.post("/api/tasks", json={"title": "for anyone"}).json()
    taken = d.post("/api/tasks", json={"title": "taken by them"}).json()
    assert d.post(f"/api/tasks/{taken['id']}/claim", json={"agent_id": theirs}).status_code == 200
    r = as_key("POST", "/api/tasks", json={"title": "mine", "assigned_to": mine})
    assert r.status_code == 201, r.text
    own = r.json()
    listed = [t["id"] for t in as_key("GET", "/api/tasks").json()]
    assert open_task["id"] in listed and own["id"] in listed
    assert hidden["id"] not in listed and taken["id"] not in listed
    assert as_key("GET", "/api/tasks", params={"assigned_to": theirs_id}).json() == []
    for method, path, body in (("GET", "", None), ("DELETE", "", None), ("POST", "/claim", {"agent_id": mine}),
                               ("POST", "/complete", {"result": "x"})):
        for task in (hidden, taken):
            r = as_key(method, f"/api/tasks/{task['id']}{path}", json=body)
            assert (r.status_code, r.json()) == (404, {"error": "task not found"}), (method, path)
    for method, path, body in (("POST", "", {"title": "sneak", "assigned_to": theirs}),
                               ("POST", f"/{open_task['id']}/claim", {"agent_id": theirs}),
                               ("POST", f"/{own['id']}/complete", {"result": "x", "agent_id": theirs_id})):
        r = as_key(method, f"/api/tasks{path}", json=body)
        ref = theirs_id if "complete" in path else theirs
        assert (r.status_code, r.json()) == (404, {"error": f"no agent with id or name '{ref}'"}), path
    assert d.get(f"/api/tasks/{open_task['id']}").json()["status"] == "pending"
    r = as_key("POST", f"/api/tasks/{open_task['id']}/claim", json={"agent_id": mine_id})
    assert (r.status_code, r.json()["claimed_by"]) == (200, mine_id)
    assert d.get(f"/api/tasks/{hidden['id']}").status_code == 200  # the admin sees everything

    web = requests.Session()
    assert web.post(d.url + "/login", data={"api_key": key}, allow_redirects=False).status_code == 303
    page = web.get(d.url + "/tasks").text
    assert "for anyone" in page and "for them" not in page and "taken by them" not in page
    token = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page).group(1)
    r = web.post(d.url + f"/tasks/{hidden['id']}/delete", data={"csrf_token": token}, allow_redirects=False)
    assert r.status_code == 404 and d.get(f"/api/tasks/{hidden['id']}").status_code == 200
    r = web.post(d.url + "/tasks", data={"csrf_token": token, "title": "sneak", "assigned_to": theirs_id})
    assert r.status_code == 404 and "sneak" not in [t["title"] for t in d.get("/api/tasks").json()]
