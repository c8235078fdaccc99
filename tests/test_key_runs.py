"""Cron jobs and triggers created with a scoped API key run as that key, through the real
daemon: the spend of their runs is the key's (exactly the runs' cost), and a key deleted,
disabled, over its budget or no longer reaching the agent gets its job's run failed with
the reason in the run history (its trigger's firing refused in the audit trail) while the
admin's jobs run on."""

from __future__ import annotations

import json
import uuid
from typing import Any, Iterator

import pytest

from conftest import LLM_ENV, llm_config
from fakes.ntfy import FakeNtfy
from tests.api.test_keys import as_key, make_workflow, spawn
from tests.api.test_keys import new_key as keys_new_key
from support import DAY, Daemon, make_home, stop_shared, wait_until, within_one_utc_period

ADMIN = "admin-secret-for-key-runs"
WEBHOOK_SECRETS = {"AGENTD_WEBHOOK_REPORT": "report-secret", "CRON_SECRET": "admins-secret"}
NEVER = {"kind": "cron", "expr": "0 0 1 1 *"}  # due once a year: these jobs run when told to


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    home = make_home(tmp_path_factory.mktemp("key-runs"), f'api_key = "{ADMIN}"\n' + llm_config(fake_llm))
    daemon = Daemon(home, api_key=ADMIN, env_extra={**LLM_ENV, **WEBHOOK_SECRETS}).start()
    yield daemon
    stop_shared(daemon)


def new_key(d: Daemon, **fields: Any) -> dict[str, Any]:
    """A key that may create jobs and triggers (`manage`)."""
    return keys_new_key(d, **{"scopes": ["read", "manage"], **fields})


def make_job(d: Daemon, key: dict[str, Any] | None, agent: str, message: str = "hello") -> dict[str, Any]:
    body = {"name": f"j-{uuid.uuid4().hex[:6]}", "agent_id": agent, "schedule": NEVER,
            "action": {"kind": "agent_turn", "message": message}}
    r = as_key(d, key, "POST", "/api/cron/jobs", json=body) if key else d.post("/api/cron/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def run_now(d: Daemon, job: dict[str, Any]) -> dict[str, Any]:
    """Run the job now (as the admin) and wait for the run to end; the run record."""
    r = d.post(f"/api/cron/jobs/{job['id']}/run")
    assert r.status_code == 202, r.text
    run_id = r.json()["id"]

    def ended() -> dict[str, Any] | None:
        found = [x for x in d.get(f"/api/cron/jobs/{job['id']}/runs").json() if x["id"] == run_id]
        return found[0] if found and found[0]["status"] != "running" else None

    wait_until(ended, "the job's run to end", timeout=20)
    return ended()  # type: ignore[return-value]


def spent(d: Daemon, key: dict[str, Any]) -> tuple[float, int]:
    usage = d.get("/api/usage", params={"key": key["id"]}).json()
    return usage["total_cost_usd"], usage["requests"]


def test_a_keys_job_runs_as_the_key_and_is_refused_once_it_is_revoked(d: Daemon) -> None:
    agent_id, _ = spawn(d, "nightly")
    key = new_key(d)
    job = make_job(d, key, agent_id)
    assert job["key_id"] == key["id"]
    assert d.get(f"/api/cron/jobs/{job['id']}").json()["key_id"] == key["id"]
    admins = make_job(d, None, agent_id)
    assert admins["key_id"] is None

    run = run_now(d, job)
    assert run["status"] == "ok" and run["cost_usd"] > 0, run
    # The run's spend is the key's, to the last digit the API keeps.
    assert d.get(f"/api/keys/{key['id']}").json()["spent_usd_today"] == round(run["cost_usd"], 10)
    total, requests_ = spent(d, key)
    assert requests_ == 1 and total == pytest.approx(run["cost_usd"], rel=1e-9, abs=1e-12)
    # The admin's job is nobody's spend but the daemon's.
    assert run_now(d, admins)["status"] == "ok"
    assert spent(d, key)[1] == 1

    # Disabled: the run is refused, saying why, and costs nothing.
    assert d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"enabled": False}).status_code == 200
    refused = run_now(d, job)
    assert (refused["status"], refused["error"], refused["cost_usd"], refused["output"]) == (
        "failed", f"API key '{key['name']}' is disabled", None, None)
    assert d.get(f"/api/cron/jobs/{job['id']}").json()["last_run"]["error"] == refused["error"]
    assert spent(d, key)[1] == 1
    assert d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"enabled": True}).status_code == 200
    assert run_now(d, job)["status"] == "ok"
    assert spent(d, key)[1] == 2

    # Without `manage` (the scope that made the job) or the agent in its list, refused too.
    d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"scopes": ["read"]})
    assert run_now(d, job)["error"] == f"forbidden: API key '{key['name']}' is missing scope 'manage'"
    d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"scopes": ["manage"], "agents": ["elsewhere-*"]})
    agent_name = d.get(f"/api/agents/{agent_id}").json()["name"]
    assert run_now(d, job)["error"] == f"API key '{key['name']}' may not reach agent '{agent_name}'"
    assert spent(d, key)[1] == 2

    # Deleted: refused for good; the admin's job runs on.
    assert d.delete(f"/api/keys/{key['id']}").status_code == 200
    gone = run_now(d, job)
    assert (gone["status"], gone["error"]) == ("failed", f"the API key that created it was deleted (key id {key['id']})")
    assert run_now(d, admins)["status"] == "ok"
    refusals = [e["detail"]["reason"] for e in d.get("/api/audit/recent", params={"limit": 200}).json()
                if e["event"] == "key.refused" and e["detail"].get("key_id") == key["id"]]
    assert {"disabled", "scope", "agent"} <= set(refusals), refusals


def test_a_keys_job_over_its_budget_is_refused_while_other_jobs_run(d: Daemon) -> None:
    agent_id, _ = spawn(d, "thrifty")
    within_one_utc_period(30, DAY)  # the spend and the refusal below, in one budget day
    key = new_key(d, budget_usd_per_day=0.000001)
    job = make_job(d, key, agent_id)
    first = run_now(d, job)
    assert first["status"] == "ok" and first["cost_usd"] > 0.000001
    second = run_now(d, job)
    assert second["status"] == "failed", second
    assert second["error"].startswith(f"message delivery failed: quota exceeded: API key '{key['name']}' is over its budget: ")
    assert spent(d, key) == (pytest.approx(first["cost_usd"], rel=1e-9, abs=1e-12), 1)
    assert run_now(d, make_job(d, new_key(d), agent_id))["status"] == "ok"


def test_a_keys_workflow_job_is_the_keys_and_only_on_its_agents(d: Daemon) -> None:
    _, mine = spawn(d, "flow-own")
    _, foreign = spawn(d, "flow-foreign")

    own, other = make_workflow(d, mine), make_workflow(d, foreign)
    key = new_key(d, agents=[mine])

    def body(workflow_id: str) -> dict[str, Any]:
        return {"name": f"wj-{uuid.uuid4().hex[:6]}", "schedule": NEVER,
                "action": {"kind": "workflow_run", "workflow_id": workflow_id, "input": "go"}}

    r = as_key(d, key, "POST", "/api/cron/jobs", json=body(other))
    assert r.status_code == 400 and r.json() == {"error": f"action.workflow_id: no workflow '{other}'"}, r.text
    r = as_key(d, key, "POST", "/api/cron/jobs", json=body(own))
    assert r.status_code == 201 and r.json()["key_id"] == key["id"], r.text
    run = run_now(d, r.json())
    assert run["status"] == "ok", run
    total, requests_ = spent(d, key)
    assert requests_ == 1 and total > 0
    # A step moved to an agent outside the key's list afterwards: the run is refused.
    moved = d.http.put(f"{d.url}/api/workflows/{own}", json={
        "name": f"wf-{uuid.uuid4().hex[:6]}", "steps": [{"name": "one", "agent_name": foreign, "prompt": "x"}]})
    assert moved.status_code == 200, moved.text
    refused = run_now(d, r.json())
    assert refused["error"] == f"API key '{key['name']}' may not reach agent '{foreign}'"
    assert spent(d, key)[1] == 1


def test_a_keys_trigger_runs_as_the_key_and_is_refused_once_disabled(d: Daemon) -> None:
    agent_id, name = spawn(d, "watcher")
    key = new_key(d)
    word = f"deploy-{uuid.uuid4().hex[:6]}"
    r = as_key(d, key, "POST", "/api/triggers", json={"agent_id": agent_id, "pattern": {"content_match": word},
                                                       "prompt_template": "saw {{event}}"})
    assert r.status_code == 201 and r.json()["key_id"] == key["id"], r.text
    trigger = r.json()
    assert d.get(f"/api/triggers/{trigger['id']}").json()["key_id"] == key["id"]

    assert d.post("/api/events", json={"event_type": word}).status_code == 202
    wait_until(lambda: spent(d, key)[1] == 1, "the trigger's run paid by the key")
    assert d.get(f"/api/keys/{key['id']}").json()["spent_usd_today"] > 0

    assert d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"enabled": False}).status_code == 200
    event = d.post("/api/events", json={"event_type": word}).json()["event_id"]

    def refusal() -> list[dict[str, Any]]:
        return [e for e in d.get("/api/audit/recent", params={"limit": 100}).json()
                if e["event"] == "trigger.refused" and e["detail"].get("event_id") == event]

    wait_until(refusal, "the refused firing")
    assert refusal()[0]["subject"] == name
    assert refusal()[0]["detail"]["error"] == f"API key '{key['name']}' is disabled"
    assert spent(d, key)[1] == 1
    assert d.get(f"/api/triggers/{trigger['id']}").json()["fire_count"] == 1  # a refusal is no firing
    # Over its budget: refused the same way.
    d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"enabled": True, "budget_usd_per_day": 0.000001})
    event = d.post("/api/events", json={"event_type": word}).json()["event_id"]
    wait_until(refusal, "the firing refused for the budget")
    assert refusal()[0]["detail"]["error"].startswith(f"message delivery failed: quota exceeded: API key '{key['name']}' is over its "
                                                      "budget: ")
    assert d.get(f"/api/triggers/{trigger['id']}").json()["fire_count"] == 1


def spawn_full(d: Daemon, prefix: str) -> tuple[str, str]:
    """An agent offered every tool (the schedule and agent tools among them)."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\nprofile = "full"\n'})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"], name


def tool_turn(d: Daemon, key: dict[str, Any], agent_id: str, tool: str, args: dict[str, Any]) -> str:
    """The agent's answer to a message, sent with `key`, whose model calls `tool` once."""
    r = as_key(d, key, "POST", f"/api/agents/{agent_id}/message",
               json={"message": f"[[tool:{tool} {json.dumps(args)}]]"})
    assert r.status_code == 200, r.text
    return r.json()["response"]


def cron_entries(d: Daemon, job_id: str) -> list[dict[str, Any]]:
    return [e for e in d.get("/api/audit/recent", params={"limit": 200, "prefix": "cron."}).json()
            if e["detail"].get("job_id") == job_id and e["event"] in ("cron.create", "cron.update", "cron.delete")]


def test_a_job_a_keys_run_makes_with_its_tools_is_the_keys(d: Daemon) -> None:
    agent_id, name = spawn_full(d, "planner")
    key = new_key(d, scopes=["read", "message", "manage"])
    said = tool_turn(d, key, agent_id, "cron_create", {"name": "digest", "schedule": NEVER,
                                                         "action": {"kind": "agent_turn", "message": "digest"}})
    job_id = json.loads(said.removeprefix("tool said: "))["id"]
    job = d.get(f"/api/cron/jobs/{job_id}").json()
    assert (job["key_id"], job["origin"], job["agent_id"]) == (key["id"], "tool", agent_id)
    listed = as_key(d, key, "GET", "/api/cron/jobs", params={"agent_id": agent_id}).json()
    assert [(j["id"], j["key_id"]) for j in listed] == [(job_id, key["id"])]
    before = spent(d, key)[1]

    run = run_now(d, job)
    assert run["status"] == "ok" and run["cost_usd"] > 0, run
    total, requests_ = spent(d, key)
    assert requests_ == before + 1
    # Disabled: the job's firing is refused, as the API's own job of the key would be.
    assert d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"enabled": False}).status_code == 200
    refused = run_now(d, job)
    assert (refused["status"], refused["error"]) == ("failed", f"API key '{key['name']}' is disabled")
    assert spent(d, key) == (total, requests_)

    # schedule_create makes the key's job too.
    assert d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"enabled": True}).status_code == 200
    said = tool_turn(d, key, agent_id, "schedule_create", {"description": "stand-up", "schedule": "daily at 9am"})
    made = json.loads(said.removeprefix("tool said: "))
    assert d.get(f"/api/cron/jobs/{made['id']}").json()["key_id"] == key["id"]
    [created] = cron_entries(d, job_id)
    assert (created["event"], created["subject"], created["detail"]) == (
        "cron.create", "digest", {"job_id": job_id, "agent_id": agent_id, "by": key["name"], "key_id": key["id"],
                                  "origin": "tool"})
    # The admin's run of the same tool makes the admin's job, as before.
    r = d.post(f"/api/agents/{agent_id}/message", json={"message": '[[tool:schedule_create {"description": '
                                                                   '"mine", "schedule": "hourly"}]]'})
    admins = json.loads(r.json()["response"].removeprefix("tool said: "))
    assert d.get(f"/api/cron/jobs/{admins['id']}").json()["key_id"] is None


def test_a_keys_run_may_not_schedule_what_the_key_may_not_do(d: Daemon) -> None:
    agent_id, name = spawn_full(d, "scheduler")
    _, outside = spawn(d, "outside")
    workflow = make_workflow(d, outside)
    key = new_key(d, scopes=["message", "manage"], agents=[name])
    said = tool_turn(d, key, agent_id, "schedule_create", {"description": "x", "schedule": "hourly",
                                                           "agent": outside})
    # The API's words for an agent outside the key's list: as if there were none.
    assert said == f"tool said: error: agent_id: no agent '{outside}'"
    said = tool_turn(d, key, agent_id, "cron_create", {
        "name": "flow", "schedule": NEVER, "action": {"kind": "workflow_run", "workflow_id": workflow}})
    assert said == f"tool said: error: action.workflow_id: no workflow '{workflow}'"
    assert d.get("/api/cron/jobs", params={"agent_id": outside}).json() == []
    # A key that may only message makes no jobs at all (they need `manage`).
    talker = new_key(d, scopes=["message"])
    said = tool_turn(d, talker, agent_id, "schedule_create", {"description": "x", "schedule": "hourly"})
    assert said == f"tool said: error: forbidden: API key '{talker['name']}' is missing scope 'manage'"
    assert [j for j in d.get("/api/cron/jobs", params={"agent_id": agent_id}).json()] == []


def test_an_agent_send_from_a_keys_run_is_the_keys_run(d: Daemon) -> None:
    sender, name = spawn_full(d, "sender")
    _, helper = spawn(d, "helper")
    _, outside = spawn(d, "aside")
    key = new_key(d, scopes=["message"], agents=[name, helper])
    said = tool_turn(d, key, sender, "agent_send", {"agent_id": helper, "message": "hi there"})
    assert said == "tool said: echo: hi there"
    # Two model calls of the sender and one of the helper, all paid by the key.
    assert spent(d, key)[1] == 3
    said = tool_turn(d, key, sender, "agent_send", {"agent_id": outside, "message": "hi"})
    assert said == f"tool said: error: no agent with id or name '{outside}'"
    assert spent(d, key)[1] == 5  # the sender's two calls; no run of the agent outside the list
    d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"budget_usd_per_day": 0.000001})
    r = d.post(f"/api/agents/{sender}/message",
               json={"message": f"[[tool:agent_send {json.dumps({'agent_id': helper, 'message': 'hi'})}]]"})
    assert r.json()["response"] == "tool said: echo: hi"  # the admin's send pays no key


def test_cron_jobs_created_changed_and_deleted_are_audited_with_who_did_it(d: Daemon) -> None:
    agent_id, _ = spawn(d, "audited")
    key = new_key(d)
    job = make_job(d, key, agent_id)
    r = as_key(d, key, "PATCH", f"/api/cron/jobs/{job['id']}", json={"enabled": False, "max_runs_per_day": 3})
    assert r.status_code == 200, r.text
    assert d.delete(f"/api/cron/jobs/{job['id']}").status_code == 200
    by_key = {"job_id": job["id"], "agent_id": agent_id, "by": key["name"], "key_id": key["id"]}
    assert [(e["event"], e["subject"], e["detail"]) for e in cron_entries(d, job["id"])] == [
        ("cron.delete", job["name"], {"job_id": job["id"], "agent_id": agent_id, "by": "admin"}),
        ("cron.update", job["name"], {**by_key, "fields": ["enabled", "max_runs_per_day"]}),
        ("cron.create", job["name"], {**by_key, "origin": "api"})]


def test_the_schedule_of_an_agent_a_key_spawns_or_changes_is_the_keys(d: Daemon) -> None:
    key = new_key(d, scopes=["read", "message", "manage"])
    name = f"daily-{uuid.uuid4().hex[:6]}"
    periodic = f'name = "{name}"\n[schedule.periodic]\ncron = "0 0 1 1 *"\n'
    r = as_key(d, key, "POST", "/api/agents", json={"manifest_toml": periodic})
    assert r.status_code == 201, r.text
    agent_id = r.json()["agent_id"]
    [job] = d.get("/api/cron/jobs", params={"agent_id": agent_id}).json()
    assert (job["name"], job["origin"], job["key_id"]) == (f"{name}:periodic", "manifest", key["id"])
    run = run_now(d, job)
    assert run["status"] == "ok" and spent(d, key) == (pytest.approx(run["cost_usd"], rel=1e-9, abs=1e-12), 1)
    assert d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"enabled": False}).status_code == 200
    assert run_now(d, job)["error"] == f"API key '{key['name']}' is disabled"
    assert d.http.patch(f"{d.url}/api/keys/{key['id']}", json={"enabled": True}).status_code == 200

    # The manifest's jobs act as whoever wrote the manifest last: the admin's change makes it the admin's.
    changed = periodic.replace("0 0 1 1 *", "0 0 2 1 *")
    assert d.http.put(f"{d.url}/api/agents/{agent_id}/manifest", json={"manifest_toml": changed}).status_code == 200
    [job] = d.get("/api/cron/jobs", params={"agent_id": agent_id}).json()
    assert (job["schedule"]["expr"], job["key_id"]) == ("0 0 2 1 *", None)
    r = as_key(d, key, "PUT", f"/api/agents/{agent_id}/manifest", json={"manifest_toml": periodic})
    assert r.status_code == 200, r.text
    assert d.get(f"/api/cron/jobs/{job['id']}").json()["key_id"] == key["id"]

    # A manifest's proactive conditions become triggers of the key.
    watcher = f'name = "watch-{uuid.uuid4().hex[:6]}"\n[schedule.proactive]\nconditions = [{{ content_match = "x" }}]\n'
    r = as_key(d, key, "POST", "/api/agents", json={"manifest_toml": watcher})
    assert r.status_code == 201, r.text
    [trigger] = d.get("/api/triggers", params={"agent_id": r.json()["agent_id"]}).json()
    assert (trigger["source"], trigger["key_id"]) == ("manifest", key["id"])

    # An agent a key's run spawns with the agent_spawn tool: its manifest's job is the key's too.
    spawner = f"spawner-{uuid.uuid4().hex[:6]}"
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{spawner}"\nprofile = "full"\n'
                                                     '[capabilities]\nagent_spawn = true\n'})
    child = f"child-{uuid.uuid4().hex[:6]}"
    said = tool_turn(d, key, r.json()["agent_id"], "agent_spawn",
                     {"manifest_toml": f'name = "{child}"\n[schedule.continuous]\ncheck_interval_secs = 86400\n'})
    child_id = json.loads(said.removeprefix("tool said: "))["agent_id"]
    [job] = d.get("/api/cron/jobs", params={"agent_id": child_id}).json()
    assert (job["name"], job["key_id"]) == (f"{child}:continuous", key["id"])
    # The admin's spawn makes the admin's job, as before.
    r = d.post("/api/agents", json={"manifest_toml": periodic.replace(name, f"{name}-admin")})
    assert d.get("/api/cron/jobs", params={"agent_id": r.json()["agent_id"]}).json()[0]["key_id"] is None


def test_a_keys_run_lists_and_kills_only_the_keys_agents(d: Daemon) -> None:
    boss, name = spawn_full(d, "boss")
    _, mine = spawn(d, "minion")
    _, outside = spawn(d, "bystander")
    key = new_key(d, scopes=["message"], agents=[name, "minion-*"])
    listed = tool_turn(d, key, boss, "agent_list", {})
    assert f'"name": "{name}"' in listed and f'"name": "{mine}"' in listed, listed
    assert listed.count('"name": ') == 2 and outside not in listed, listed
    assert tool_turn(d, key, boss, "agent_kill", {"agent_id": outside}) == (
        f"tool said: error: no agent with id or name '{outside}'")
    assert any(a["name"] == outside for a in d.get("/api/agents").json())
    assert tool_turn(d, key, boss, "agent_kill", {"agent_id": mine}) == f"tool said: killed agent {mine}"
    assert not any(a["name"] == mine for a in d.get("/api/agents").json())


def test_an_agent_a_key_spawned_keeps_its_jobs_the_keys_across_restarts(tmp_path, fake_llm) -> None:
    """The manifest's job, deleted through the API, is made again at the next start: as the
    key that spawned the agent, not as the admin; once that key is deleted, still as the key,
    so its runs are refused saying why."""
    home = make_home(tmp_path, f'api_key = "{ADMIN}"\n' + llm_config(fake_llm))
    daemon = Daemon(home, api_key=ADMIN, env_extra=LLM_ENV).start()
    try:
        key = new_key(daemon, scopes=["read", "message", "manage"])
        periodic = 'name = "{}"\n[schedule.periodic]\ncron = "0 0 1 1 *"\n'
        r = as_key(daemon, key, "POST", "/api/agents", json={"manifest_toml": periodic.format("keys-daily")})
        assert r.status_code == 201, r.text
        agent_id = r.json()["agent_id"]
        admins_agent = daemon.post("/api/agents", json={"manifest_toml": periodic.format("admins-daily")}).json()

        def manifest_job(agent: str) -> dict[str, Any]:
            [job] = daemon.get("/api/cron/jobs", params={"agent_id": agent}).json()
            return job

        for _ in range(2):  # the second time, the job made again at the first restart
            assert daemon.delete(f"/api/cron/jobs/{manifest_job(agent_id)['id']}").status_code == 200
            assert daemon.delete(f"/api/cron/jobs/{manifest_job(admins_agent['agent_id'])['id']}").status_code == 200
            daemon.stop()
            daemon.start()
            job = manifest_job(agent_id)
            assert (job["name"], job["origin"], job["key_id"]) == ("keys-daily:periodic", "manifest", key["id"])
            assert manifest_job(admins_agent["agent_id"])["key_id"] is None
            listed = as_key(daemon, key, "GET", "/api/cron/jobs", params={"agent_id": agent_id}).json()
            assert [j["id"] for j in listed] == [job["id"]]
        run = run_now(daemon, job)
        assert run["status"] == "ok" and spent(daemon, key) == (pytest.approx(run["cost_usd"], rel=1e-9,
                                                                              abs=1e-12), 1)

        # The key deleted: the job made again is still the key's, and refused for it.
        assert daemon.delete(f"/api/keys/{key['id']}").status_code == 200
        assert daemon.delete(f"/api/cron/jobs/{job['id']}").status_code == 200
        daemon.stop()
        daemon.start()
        job = manifest_job(agent_id)
        assert job["key_id"] == key["id"]
        gone = run_now(daemon, job)
        assert (gone["status"], gone["error"]) == (
            "failed", f"the API key that created it was deleted (key id {key['id']})")
    finally:
        stop_shared(daemon)


def test_a_keys_webhook_delivery_signs_only_with_a_variable_of_its_own(d: Daemon) -> None:
    """A scoped key may name only an AGENTD_WEBHOOK_ variable as a webhook's `secret_env`
    (else it could have any secret of the daemon's environment sign a body for a URL of its
    choosing); the admin names any, and a key's change may keep the job's webhook as it is."""
    agent_id, name = spawn_full(d, "reporter")
    key = new_key(d, scopes=["read", "message", "manage"])
    hook = {"kind": "webhook", "url": "https://hooks.example.com/agentd"}
    refusal = {"error": "delivery.secret_env: a scoped API key may only name a variable starting with "
                        "AGENTD_WEBHOOK_ (other variables only the admin may name)"}
    body = {"name": "report", "agent_id": agent_id, "schedule": NEVER, "action": {"kind": "agent_turn", "message": "x"}}
    for variable in ("OPENAI_API_KEY", "PATH", "agentd_webhook_lower", "X_AGENTD_WEBHOOK_"):
        r = as_key(d, key, "POST", "/api/cron/jobs", json={**body, "delivery": {**hook, "secret_env": variable}})
        assert (r.status_code, r.json()) == (400, refusal), variable
    assert d.get("/api/cron/jobs", params={"agent_id": agent_id}).json() == []
    # A variable of its own that the daemon's environment does not hold would fail every delivery.
    r = as_key(d, key, "POST", "/api/cron/jobs", json={**body, "delivery": {**hook, "secret_env": "AGENTD_WEBHOOK_NONE"}})
    assert (r.status_code, r.json()) == (400, {"error": "delivery.secret_env: environment variable AGENTD_WEBHOOK_NONE "
                                                        "is not set (the daemon reads its environment when it starts)"})
    mine = {**hook, "secret_env": "AGENTD_WEBHOOK_REPORT"}
    r = as_key(d, key, "POST", "/api/cron/jobs", json={**body, "delivery": mine})
    assert r.status_code == 201 and r.json()["delivery"]["secret_env"] == "AGENTD_WEBHOOK_REPORT", r.text
    own = r.json()

    # The admin names any variable; a key's change may keep it, not name another.
    admins = d.post("/api/cron/jobs", json={**body, "name": "admins",
                                            "delivery": {**hook, "secret_env": "CRON_SECRET"}})
    assert admins.status_code == 201, admins.text
    kept = {**hook, "secret_env": "CRON_SECRET"}
    r = as_key(d, key, "PATCH", f"/api/cron/jobs/{admins.json()['id']}", json={"delivery": kept, "enabled": False})
    assert r.status_code == 200 and r.json()["delivery"] == kept, r.text
    # Not to another URL: the admin's secret would sign what goes to the key's address.
    moved = {**kept, "url": "https://hooks.example.com/moved"}
    r = as_key(d, key, "PATCH", f"/api/cron/jobs/{admins.json()['id']}", json={"delivery": moved})
    assert (r.status_code, r.json()) == (400, refusal)
    assert d.get(f"/api/cron/jobs/{admins.json()['id']}").json()["delivery"] == kept
    r = as_key(d, key, "PATCH", f"/api/cron/jobs/{own['id']}", json={"delivery": {**hook, "secret_env": "HOME"}})
    assert (r.status_code, r.json()) == (400, refusal)
    assert d.get(f"/api/cron/jobs/{own['id']}").json()["delivery"]["secret_env"] == "AGENTD_WEBHOOK_REPORT"

    # The same rule for the cron_create tool in a run the key started; the admin's run names any.
    tool = {"name": "by-tool", "schedule": NEVER, "action": {"kind": "agent_turn", "message": "x"},
            "delivery": {**hook, "secret_env": "OPENAI_API_KEY"}}
    assert tool_turn(d, key, agent_id, "cron_create", tool) == f"tool said: error: {refusal['error']}"
    r = d.post(f"/api/agents/{agent_id}/message", json={"message": f"[[tool:cron_create {json.dumps(tool)}]]"})
    made = json.loads(r.json()["response"].removeprefix("tool said: "))
    assert d.get(f"/api/cron/jobs/{made['id']}").json()["delivery"]["secret_env"] == "OPENAI_API_KEY"


def watch(d: Daemon, agent_id: str, pattern: dict[str, Any], owner: dict[str, Any] | None = None) -> str:
    """A trigger of `agent_id` (created by `owner`, else the admin); its id."""
    body = {"agent_id": agent_id, "pattern": pattern, "prompt_template": "[[reply:ok]] {{event}}"}
    r = as_key(d, owner, "POST", "/api/triggers", json=body) if owner else d.post("/api/triggers", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def fire_counts(d: Daemon, triggers: dict[str, str], agent_id: str) -> dict[str, int]:
    """Once every event so far was evaluated (the bus hears them in order: a later admin's
    event fired a sentinel trigger of `agent_id`), each trigger's firings."""
    word = f"sentinel-{uuid.uuid4().hex[:6]}"
    sentinel = watch(d, agent_id, {"content_match": word})
    assert d.post("/api/events", json={"event_type": word}).status_code == 202
    wait_until(lambda: d.get(f"/api/triggers/{sentinel}").json()["fire_count"] == 1, "the sentinel event")
    assert d.delete(f"/api/triggers/{sentinel}").status_code == 200
    return {name: d.get(f"/api/triggers/{tid}").json()["fire_count"] for name, tid in triggers.items()}


def test_a_keys_events_fire_only_triggers_of_agents_the_key_reaches(d: Daemon) -> None:
    """An event a scoped key publishes (POST /api/events, event_publish in its run, a workflow
    run of the key completing) fires the triggers of the key's agents only, whoever owns them;
    the admin's events fire every trigger."""
    sender, sender_name = spawn_full(d, "announcer")
    inside, inside_name = spawn(d, "listener")
    outside, _ = spawn(d, "stranger")
    key = new_key(d, scopes=["message", "manage"], agents=[sender_name, inside_name])
    other = new_key(d)  # another owner: a key that reaches every agent
    word = f"release-{uuid.uuid4().hex[:6]}"
    workflow = make_workflow(d, inside_name)

    watchers = {"inside": watch(d, inside, {"content_match": word}),
                "outside": watch(d, outside, {"content_match": word}),
                "other's": watch(d, outside, {"content_match": word}, other),
                "inside, workflow": watch(d, inside, {"workflow_completed": workflow}),
                "outside, workflow": watch(d, outside, {"workflow_completed": workflow})}

    def fired() -> dict[str, int]:
        return fire_counts(d, watchers, inside)

    assert as_key(d, key, "POST", "/api/events", json={"event_type": word}).status_code == 202
    said = tool_turn(d, key, sender, "event_publish", {"event_type": word})
    assert said.startswith("tool said: "), said
    run = as_key(d, key, "POST", f"/api/workflows/{workflow}/run", json={"input": "go"})
    assert run.status_code == 200 and run.json()["status"] == "completed", run.text
    assert fired() == {"inside": 2, "outside": 0, "other's": 0, "inside, workflow": 1, "outside, workflow": 0}

    assert d.post("/api/events", json={"event_type": word}).status_code == 202
    assert d.post(f"/api/workflows/{workflow}/run", json={"input": "go"}).status_code == 200
    assert fired() == {"inside": 3, "outside": 1, "other's": 1, "inside, workflow": 2, "outside, workflow": 1}


def test_a_keys_job_delivers_only_to_channels_of_the_keys_agents(d: Daemon) -> None:
    """A job of a key limited to some agents may send its result only to a channel that
    answers as the key's agents; another is refused as an unknown channel would be."""
    _, mine = spawn(d, "courier")
    _, theirs = spawn(d, "desk")
    ntfy = FakeNtfy("ntfy-token-for-key-runs").start()
    try:
        r = d.post("/api/channels/ntfy/configure", json={
            "topic": "key-runs", "server_url": ntfy.url, "default_agent": theirs,
            "secrets": {"token_env": "ntfy-token-for-key-runs"}})
        assert r.status_code == 200, r.text
        key = new_key(d, agents=[mine])
        body = {"name": "courier", "agent_id": mine, "schedule": NEVER,
                "action": {"kind": "agent_turn", "message": "[[reply:parcel]]"},
                "delivery": {"kind": "channel", "channel": "ntfy"}}
        r = as_key(d, key, "POST", "/api/cron/jobs", json=body)
        assert (r.status_code, r.json()) == (400, {"error": "delivery.channel: channel 'ntfy' is not configured"})
        r = as_key(d, key, "POST", "/api/cron/jobs", json={**body, "delivery": {"kind": "none"}})
        assert r.status_code == 201, r.text
        r = as_key(d, key, "PATCH", f"/api/cron/jobs/{r.json()['id']}", json={"delivery": body["delivery"]})
        assert (r.status_code, r.json()) == (400, {"error": "delivery.channel: channel 'ntfy' is not configured"})

        # Once the channel answers as the key's agent, the key's job delivers to it.
        r = d.post("/api/channels/ntfy/configure", json={"topic": "key-runs", "server_url": ntfy.url,
                                                         "default_agent": mine})
        assert r.status_code == 200, r.text
        r = as_key(d, key, "POST", "/api/cron/jobs", json={**body, "name": "courier-2"})
        assert r.status_code == 201, r.text
        assert run_now(d, r.json())["status"] == "ok"
        wait_until(lambda: any(m["message"] == "parcel" for m in ntfy.messages), "the delivery to ntfy")
    finally:
        d.delete("/api/channels/ntfy/configure")
        ntfy.stop()


def test_a_keys_triggers_hear_only_events_of_the_keys_agents(d: Daemon) -> None:
    """A trigger of a key limited to some agents does not fire (with the event in its prompt)
    for another agent's failure or published event, a workflow on another agent, or a
    message of a channel answering as another agent; the admin's trigger hears them all."""
    listener, listener_name = spawn(d, "ear")
    friend_id, friend = spawn(d, "ear-friend")
    outsider, outsider_name = spawn_full(d, "loudmouth")
    key = new_key(d, agents=[listener_name, friend])
    word = f"gossip-{uuid.uuid4().hex[:6]}"
    ntfy = FakeNtfy("ntfy-token-for-key-ears").start()
    patterns = {"failed": {"agent_failed": "*"}, "workflow": {"workflow_completed": "*"},
                "channel": {"channel_message": {"channel": "ntfy", "match": "psst"}}, "event": {"content_match": word}}
    triggers = {name: watch(d, listener, pattern, key) for name, pattern in patterns.items()}
    admins = {f"admin's {name}": watch(d, listener, pattern) for name, pattern in patterns.items()}
    try:
        def channel_answers_as(agent: str) -> None:
            r = d.post("/api/channels/ntfy/configure", json={
                "topic": "ears", "server_url": ntfy.url, "default_agent": agent,
                "secrets": {"token_env": "ntfy-token-for-key-ears"}})
            assert r.status_code == 200, r.text
            wait_until(lambda: ntfy.subscriptions, "the channel's subscription")
            ntfy.subscriptions.clear()

        def everything_happens_on(agent_id: str, name: str) -> None:
            r = d.post(f"/api/agents/{agent_id}/message", json={"message": "[[fail:400]]"})
            assert r.status_code >= 400
            assert d.post(f"/api/workflows/{make_workflow(d, name)}/run", json={"input": "go"}).status_code == 200
            channel_answers_as(name)
            ntfy.publish("ears", "psst")

        everything_happens_on(outsider, outsider_name)
        r = d.post(f"/api/agents/{outsider}/message",
                   json={"message": f"[[tool:event_publish {json.dumps({'event_type': word})}]]"})
        assert r.status_code == 200, r.text
        assert fire_counts(d, {**triggers, **admins}, listener) == {
            "failed": 0, "workflow": 0, "channel": 0, "event": 0,
            "admin's failed": 1, "admin's workflow": 1, "admin's channel": 1, "admin's event": 1}

        everything_happens_on(friend_id, friend)
        assert d.post("/api/events", json={"event_type": word}).status_code == 202
        assert fire_counts(d, {**triggers, **admins}, listener) == {
            "failed": 1, "workflow": 1, "channel": 1, "event": 1,
            "admin's failed": 2, "admin's workflow": 2, "admin's channel": 2, "admin's event": 2}
    finally:
        d.delete("/api/channels/ntfy/configure")
        ntfy.stop()


def test_a_key_that_rewrites_the_admins_job_or_trigger_makes_it_its_own(d: Daemon) -> None:
    """A scoped key changing what an admin's job does (or a trigger's template) makes it the
    key's: its runs are paid by the key and reach only the key's agents, instead of running
    the key's words as the admin. Pausing it or changing its caps leaves it the admin's."""
    agent_id, name = spawn_full(d, "errand")
    outside, outside_name = spawn(d, "vault")
    key = new_key(d, agents=[name])
    job = make_job(d, None, agent_id)
    r = as_key(d, key, "PATCH", f"/api/cron/jobs/{job['id']}", json={"enabled": False, "max_runs_per_day": 5,
                                                                     "action": job["action"]})
    assert r.status_code == 200 and r.json()["key_id"] is None, r.text
    send = {"agent_id": outside_name, "message": "open up"}
    r = as_key(d, key, "PATCH", f"/api/cron/jobs/{job['id']}", json={
        "enabled": True, "action": {"kind": "agent_turn", "message": f"[[tool:agent_send {json.dumps(send)}]]"}})
    assert r.status_code == 200 and r.json()["key_id"] == key["id"], r.text
    run = run_now(d, job)
    assert (run["status"], run["output"]) == ("ok", f"tool said: error: no agent with id or name '{outside_name}'")
    assert d.get(f"/api/agents/{outside}/session").json()["messages"] == []
    assert spent(d, key)[1] == 2  # the two model calls of the run

    word = f"chime-{uuid.uuid4().hex[:6]}"
    trigger = watch(d, agent_id, {"content_match": word})
    r = as_key(d, key, "PATCH", f"/api/triggers/{trigger}", json={"max_runs_per_day": 9,
                                                                  "prompt_template": "[[reply:ok]] {{event}}"})
    assert r.status_code == 200 and r.json()["key_id"] is None, r.text
    r = as_key(d, key, "PATCH", f"/api/triggers/{trigger}", json={"prompt_template": "[[reply:mine]] {{event}}"})
    assert r.status_code == 200 and r.json()["key_id"] == key["id"], r.text
    assert d.post("/api/events", json={"event_type": word}).status_code == 202
    wait_until(lambda: spent(d, key)[1] == 3, "the trigger's run paid by the key")
