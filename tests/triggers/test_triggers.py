"""Triggers end to end: the real daemon, agents on the fake LLM, every pattern kind fired by
a real event (a KV write, POST /api/events, event_publish, a workflow run, a failed run, a
message through the webhook channel), the exact prompt, loop safety, rate limit and caps."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from typing import Any

import pytest
import requests

from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from fakes.recorder import Recorder
from support import DAY, Daemon, db_rows, free_port, make_home, wait_until, within_one_utc_period
from tests.agents.test_agents import spawn
from tests.memory.test_races import _together

SECRET = "trigger-hook-secret"


@pytest.fixture(scope="module")
def d(tmp_path_factory, fake_llm):
    home = make_home(tmp_path_factory.mktemp("triggers"), llm_config(fake_llm, NO_REMEMBERING))
    daemon = Daemon(home, env_extra={**LLM_ENV, "WEBHOOK_TRIGGER_SECRET": SECRET}).start()
    yield daemon
    daemon.stop()


def agent(d: Daemon, extra: str = "") -> tuple[str, str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    return spawn(d, name, extra), name


def trigger(d: Daemon, agent_id: str, pattern: dict, template: str = "[[reply:ok]] {{event}}", **extra) -> dict:
    r = d.post("/api/triggers", json={"agent_id": agent_id, "pattern": pattern, "prompt_template": template, **extra})
    assert r.status_code == 201, r.text
    return r.json()


def publish(d: Daemon, event_type: str, payload: dict | None = None) -> str:
    r = d.post("/api/events", json={"event_type": event_type, **({"payload": payload} if payload is not None else {})})
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "accepted"
    return r.json()["event_id"]


def prompts(d: Daemon, agent_id: str) -> list[str]:
    """The user messages of the agent's session, oldest first."""
    r = d.get(f"/api/agents/{agent_id}/session")
    assert r.status_code == 200, r.text
    return [m["content"] for m in r.json()["messages"] if m["role"] == "User"]


def answered(d: Daemon, agent_id: str, count: int) -> list[str]:
    """Wait until the agent's session holds `count` answered prompts; their texts."""
    def done() -> bool:
        messages = d.get(f"/api/agents/{agent_id}/session").json()["messages"]
        return sum(m["role"] == "Assistant" for m in messages) >= count
    wait_until(done, f"{count} answered run(s) of {agent_id}")
    return prompts(d, agent_id)


def settle(d: Daemon) -> None:
    """Every event published so far has been evaluated: the bus hears events in order, so
    once a later sentinel event fired its trigger, the earlier ones are done."""
    sentinel, _ = agent(d)
    word = f"sentinel-{uuid.uuid4().hex[:8]}"
    trigger(d, sentinel, {"content_match": word})
    publish(d, word)
    wait_until(lambda: d.get(f"/api/triggers?agent_id={sentinel}").json()[0]["fire_count"] == 1, "the sentinel")


def event_of(prompt: str, prefix: str) -> dict[str, Any]:
    assert prompt.startswith(prefix), prompt
    return json.loads(prompt[len(prefix):])


def test_crud_and_errors(d) -> None:
    a, _ = agent(d)
    made = trigger(d, a, {"content_match": "x"}, "t {{event}}", max_runs_per_day=5, max_cost_usd_per_day=0.5,
                   rate_limit_per_minute=3)
    assert uuid.UUID(made["id"])
    expected = {"id": made["id"], "trigger_id": made["id"], "agent_id": a, "pattern": {"content_match": "x"}, "prompt_template": "t {{event}}",
                "enabled": True, "source": "api", "max_runs_per_day": 5, "max_cost_usd_per_day": 0.5,
                "rate_limit_per_minute": 3, "paused": False, "paused_reason": None, "runs_today": 0,
                "cost_today_usd": 0.0, "fire_count": 0, "last_fired_at": None}
    assert {k: made[k] for k in expected} == expected
    other, _ = agent(d)
    trigger(d, other, {"agent_failed": "*"})
    assert [t["id"] for t in d.get(f"/api/triggers?agent_id={a}").json()] == [made["id"]]
    assert {made["id"]} < {t["id"] for t in d.get("/api/triggers").json()}
    # An empty agent_id is no filter, as for the cron jobs.
    every = [t["id"] for t in d.get("/api/triggers").json()]
    assert [t["id"] for t in d.get("/api/triggers?agent_id=").json()] == every
    assert d.get(f"/api/triggers/{made['id']}").json()["id"] == made["id"]
    r = d.request("PATCH", f"/api/triggers/{made['id']}", json={"enabled": False, "max_runs_per_day": None})
    assert r.status_code == 200 and r.json()["enabled"] is False and r.json()["max_runs_per_day"] is None
    for field, value in [("pattern", {"content_match": "y"}), ("agent_id", other), ("max_run_per_day", 1)]:
        r = d.request("PATCH", f"/api/triggers/{made['id']}", json={field: value, "enabled": True})
        assert (r.status_code, r.json()) == (400, {"error": f"invalid request: {field}: Unknown field."})
    kept = d.get(f"/api/triggers/{made['id']}").json()
    assert (kept["pattern"], kept["agent_id"], kept["enabled"]) == ({"content_match": "x"}, a, False)
    # A misspelt cap or an unknown field is refused at creation too, not dropped without a word.
    before = len(d.get("/api/triggers").json())
    for field in ("max_run_per_day", "colour"):
        r = d.post("/api/triggers", json={"agent_id": a, "pattern": {"content_match": "x"}, "prompt_template": "p",
                                          field: 1})
        assert (r.status_code, r.json()) == (400, {"error": f"invalid request: {field}: Unknown field."})
    assert len(d.get("/api/triggers").json()) == before
    assert d.delete(f"/api/triggers/{made['id']}").json() == {"status": "removed", "trigger_id": made["id"]}
    assert d.delete(f"/api/triggers/{made['id']}").status_code == 404
    assert d.delete("/api/triggers/nope").json() == {"error": "invalid trigger id: 'nope' is not a UUID"}
    assert d.get(f"/api/triggers?agent_id={a}").json() == []
    bad = [({"agent_id": str(uuid.uuid4()), "pattern": {"content_match": "x"}, "prompt_template": "p"}, 404),
           ({"agent_id": a, "pattern": {"nope": "x"}, "prompt_template": "p"}, 400),
           ({"agent_id": a, "pattern": {"content_match": "x", "agent_failed": "*"}, "prompt_template": "p"}, 400),
           ({"agent_id": a, "pattern": {"channel_message": {"channel": "webhook", "match": "("}},
             "prompt_template": "p"}, 400),
           ({"agent_id": a, "pattern": {"channel_message": {"channel": "webhook", "match": "a{99999999999}"}},
             "prompt_template": "p"}, 400),
           ({"agent_id": a, "pattern": {"content_match": " "}, "prompt_template": "p"}, 400),
           ({"agent_id": a, "pattern": {"content_match": "x"}, "prompt_template": "p", "max_runs_per_day": 0}, 400),
           ({"agent_id": a, "pattern": {"content_match": "x"}}, 400)]
    for body, status in bad:
        r = d.post("/api/triggers", json=body)
        assert r.status_code == status, (body, r.text)
        assert set(r.json()) == {"error"}
    # The original's max_fires: its "no limit" is taken; a limit is refused, never dropped.
    r = d.post("/api/triggers", json={"agent_id": a, "pattern": {"content_match": "x"}, "prompt_template": "p",
                                      "max_fires": 3})
    assert (r.status_code, r.json()) == (400, {"error": "invalid request: max_fires: only 0 (no limit) is taken: "
                                                        "cap a trigger with max_runs_per_day, max_cost_usd_per_day "
                                                        "or rate_limit_per_minute"})
    r = d.post("/api/triggers", json={"agent_id": a, "pattern": {"content_match": "x"}, "prompt_template": "p",
                                      "max_fires": 0})
    assert r.status_code == 201 and "max_fires" not in r.json()
    d.delete(f"/api/triggers/{r.json()['id']}")
    assert d.post("/api/events", json={"payload": {}}).status_code == 400
    assert d.post("/api/events", json={"event_type": "x", "payload": "text"}).status_code == 400


def test_content_match_fires_with_the_exact_prompt(d) -> None:
    within_one_utc_period(30, DAY)  # the runs counted below, in one UTC day
    a, _ = agent(d)
    t = trigger(d, a, {"content_match": "Deploy-Done"}, "[[reply:ok]] got {{event}} and {single} {{other}}")
    event_id = publish(d, "deploy-done", {"service": "web"})
    [prompt] = answered(d, a, 1)
    prefix = "[[reply:ok]] got "
    assert prompt.startswith(prefix) and prompt.endswith(" and {single} {{other}}"), prompt
    event = json.loads(prompt[len(prefix):-len(" and {single} {{other}}")])
    assert set(event) == {"id", "type", "agent_id", "payload", "timestamp"}
    assert (event["id"], event["type"], event["agent_id"], event["payload"]) == (
        event_id, "deploy-done", None, {"service": "web"})
    # The payload is searched too; a non-matching event fires nothing.
    publish(d, "other", {"note": "the DEPLOY-DONE signal"})
    publish(d, "unrelated", {"note": "nothing here"})
    answered(d, a, 2)
    settle(d)
    got = d.get(f"/api/triggers/{t['id']}").json()
    assert got["fire_count"] == 2 and got["runs_today"] == 2 and got["last_fired_at"]
    fired = [e for e in d.get("/api/audit/recent?limit=500&event=trigger.fire").json()
             if e["detail"]["trigger_id"] == t["id"]]
    assert len(fired) == 2 and fired[-1]["detail"]["event_id"] == event_id


def test_memory_key_pattern_fires_on_the_agents_own_keys(d) -> None:
    a, _ = agent(d)
    b, _ = agent(d)
    trigger(d, a, {"memory_key_pattern": "inbox.*"}, "[[reply:ok]] kv {{event}}")
    assert d.put(f"/api/memory/agents/{b}/kv/inbox.1", json="not yours").status_code == 200
    assert d.put(f"/api/memory/agents/{a}/kv/outbox.1", json="no match").status_code == 200
    assert d.put(f"/api/memory/agents/{a}/kv/inbox.1", json={"n": 1}).status_code == 200
    [prompt] = answered(d, a, 1)
    event = event_of(prompt, "[[reply:ok]] kv ")
    assert event["type"] == "memory_key_changed" and event["agent_id"] == a
    assert event["payload"] == {"agent_id": a, "key": "inbox.1", "value": {"n": 1}, "operation": "set"}
    # The same value again is no change; a deletion is one.
    assert d.put(f"/api/memory/agents/{a}/kv/inbox.1", json={"n": 1}).status_code == 200
    assert d.delete(f"/api/memory/agents/{a}/kv/inbox.1").status_code == 200
    prompts_ = answered(d, a, 2)
    assert event_of(prompts_[1], "[[reply:ok]] kv ")["payload"]["operation"] == "delete"
    settle(d)
    assert len(prompts(d, a)) == 2


def test_a_trigger_run_does_not_fire_its_own_agents_triggers(d) -> None:
    a, _ = agent(d)
    listener, _ = agent(d)
    word = f"loop-{uuid.uuid4().hex[:6]}"
    # A's run, started by its trigger, writes the key it watches and publishes an event that
    # both A and the listener watch: only the listener fires.
    store = json.dumps({"key": "loop.x", "value": "from the run"})
    shout = json.dumps({"event_type": word})
    t = trigger(d, a, {"memory_key_pattern": "loop.*"}, f"[[tools:memory_store {store} | event_publish {shout}]]")
    mine = trigger(d, a, {"content_match": word})
    theirs = trigger(d, listener, {"content_match": word}, "[[reply:heard]] {{event}}")
    assert d.put(f"/api/memory/agents/{a}/kv/loop.x", json="from the api").status_code == 200
    [heard] = answered(d, listener, 1)
    event = event_of(heard, "[[reply:heard]] ")
    assert event["type"] == word and event["agent_id"] == a
    settle(d)
    assert d.get(f"/api/memory/agents/{a}/kv/loop.x").json() == "from the run"
    assert [d.get(f"/api/triggers/{x['id']}").json()["fire_count"] for x in (t, mine, theirs)] == [1, 0, 1]
    assert len(prompts(d, a)) == 1
    published = [e for e in d.get("/api/audit/recent?limit=500&event=tool.event_publish").json()
                 if e["detail"]["agent_id"] == a]
    assert published and published[0]["detail"]["event_type"] == word


def test_rate_limit_per_trigger(d) -> None:
    a, _ = agent(d)
    word = f"burst-{uuid.uuid4().hex[:6]}"
    t = trigger(d, a, {"content_match": word}, rate_limit_per_minute=2)
    for _ in range(5):
        publish(d, word)
    settle(d)
    got = d.get(f"/api/triggers/{t['id']}").json()
    assert got["fire_count"] == 2 and got["paused"] is False
    assert len(answered(d, a, 2)) == 2


def test_caps_pause_with_reason_and_audit(d) -> None:
    within_one_utc_period(30, DAY)  # the runs and spend counted below, in one UTC day
    a, name = agent(d)
    word = f"cap-{uuid.uuid4().hex[:6]}"
    runs = trigger(d, a, {"content_match": word}, max_runs_per_day=1)
    publish(d, word)
    publish(d, word)
    settle(d)
    got = d.get(f"/api/triggers/{runs['id']}").json()
    assert got["fire_count"] == 1 and got["paused"] is True
    assert got["paused_reason"] == "max_runs_per_day reached: 1 of 1 run(s) today (resumes at 00:00 UTC)"
    assert len(answered(d, a, 1)) == 1
    paused = [e for e in d.get("/api/audit/recent?limit=500&event=trigger.paused").json()
              if e["detail"]["trigger_id"] == runs["id"]]
    assert [e["detail"]["reason"] for e in paused] == [got["paused_reason"]]
    # Resuming clears the pause; the cap still holds for today.
    r = d.request("PATCH", f"/api/triggers/{runs['id']}", json={"enabled": True, "max_runs_per_day": 2})
    assert r.json()["paused"] is False and r.json()["paused_reason"] is None
    # Spend: the first run's cost reaches the cap and pauses the trigger.
    b, _ = agent(d)
    word2 = f"spend-{uuid.uuid4().hex[:6]}"
    spend = trigger(d, b, {"content_match": word2}, max_cost_usd_per_day=0.000001)
    publish(d, word2)
    wait_until(lambda: d.get(f"/api/triggers/{spend['id']}").json()["paused"], "the cost cap")
    got = d.get(f"/api/triggers/{spend['id']}").json()
    assert got["paused_reason"].startswith("max_cost_usd_per_day reached: $") and got["cost_today_usd"] > 0.000001
    publish(d, word2)
    settle(d)
    assert d.get(f"/api/triggers/{spend['id']}").json()["fire_count"] == 1


def test_a_firing_the_global_budget_refuses_does_not_count(d) -> None:
    within_one_utc_period(30, DAY)  # the day's runs counted below, in one UTC day
    a, name = agent(d)
    assert d.post(f"/api/agents/{a}/message", json={"message": "spend"}).json()["cost_usd"] > 0.000001
    word = f"broke-{uuid.uuid4().hex[:6]}"
    capped = trigger(d, a, {"content_match": word}, max_runs_per_day=1)
    assert d.put("/api/budget", json={"limit_usd": 0.000001}).status_code == 200
    try:
        event = publish(d, word)

        def refusal() -> list[dict[str, Any]]:
            return [e for e in d.get("/api/audit/recent", params={"limit": 500}).json()
                    if e["event"] == "trigger.refused" and e["detail"].get("event_id") == event]

        wait_until(refusal, "the refused firing")
    finally:
        d.put("/api/budget", json={"limit_usd": 0})
    assert refusal()[0]["subject"] == name and "budget" in refusal()[0]["detail"]["error"]
    got = d.get(f"/api/triggers/{capped['id']}").json()
    assert (got["fire_count"], got["runs_today"], got["last_fired_at"]) == (0, 0, None)
    assert (got["paused"], got["paused_reason"]) == (False, None)
    # With the budget lifted the next event fires it, and that run reaches the cap.
    publish(d, word)
    assert len(answered(d, a, 2)) == 2
    got = d.get(f"/api/triggers/{capped['id']}").json()
    assert (got["fire_count"], got["runs_today"], got["paused"]) == (1, 1, True)
    paused = [e for e in d.get("/api/audit/recent?limit=500&event=trigger.paused").json()
              if e["detail"]["trigger_id"] == capped["id"]]
    assert len(paused) == 1


def test_workflow_completed_and_agent_failed(d) -> None:
    worker, worker_name = agent(d)
    watcher, _ = agent(d)
    r = d.post("/api/workflows", json={"name": "wf", "description": "",
                                       "steps": [{"name": "one", "agent_name": worker_name,
                                                  "prompt": "[[reply:done]] {{input}}"}]})
    workflow_id = r.json()["workflow_id"]
    trigger(d, watcher, {"workflow_completed": workflow_id}, "[[reply:ok]] wf {{event}}")
    run = d.post(f"/api/workflows/{workflow_id}/run", json={"input": "go"}).json()
    assert run["status"] == "completed"
    [prompt] = answered(d, watcher, 1)
    event = event_of(prompt, "[[reply:ok]] wf ")
    assert event["type"] == "workflow_completed"
    assert event["payload"] == {"workflow_id": workflow_id, "workflow_name": "wf", "run_id": run["run_id"],
                                "status": "completed", "output": "done"}
    failing, failing_name = agent(d)
    trigger(d, watcher, {"agent_failed": failing}, "[[reply:ok]] failed {{event}}")
    r = d.post(f"/api/agents/{failing}/message", json={"message": "[[fail:400]]"})
    assert r.status_code >= 400
    prompts_ = answered(d, watcher, 2)
    event = event_of(prompts_[1], "[[reply:ok]] failed ")
    assert event["type"] == "agent_failed" and event["agent_id"] == failing
    assert event["payload"]["agent_name"] == failing_name and event["payload"]["run_origin"] == "api"


def test_channel_message_through_the_webhook_channel(d) -> None:
    watcher, _ = agent(d)
    callback = Recorder()
    port = free_port()
    r = d.post("/api/channels/webhook/configure", json={"listen_port": port, "callback_url": callback.url + "/cb",
                                                        "secret_env": "WEBHOOK_TRIGGER_SECRET"})
    assert r.status_code == 200, r.text
    wait_until(lambda: next(c for c in d.get("/api/channels").json() if c["name"] == "webhook")["active"],
               "webhook active")
    trigger(d, watcher, {"channel_message": {"channel": "webhook", "match": r"order #\d+"}},
            "[[reply:ok]] chan {{event}}")
    try:
        for text in ("no number here", "new order #42 please"):
            body = json.dumps({"sender_id": "u-7", "sender_name": "Ann", "message": text}).encode()
            sig = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
            assert requests.post(f"http://127.0.0.1:{port}/", data=body, timeout=5,
                                 headers={"X-Webhook-Signature": sig,
                                          "Content-Type": "application/json"}).status_code == 202
        [prompt] = answered(d, watcher, 1)
        event = event_of(prompt, "[[reply:ok]] chan ")
        assert event["type"] == "channel_message"
        assert {k: event["payload"][k] for k in ("channel", "sender_id", "text")} == {
            "channel": "webhook", "sender_id": "u-7", "text": "new order #42 please"}
        settle(d)
        assert len(prompts(d, watcher)) == 1
    finally:
        d.delete("/api/channels/webhook/configure")
        callback.close()


def test_manifest_proactive_conditions_and_kill(d) -> None:
    extra = ('[schedule.proactive]\nconditions = [\n'
             '  { content_match = "mf-signal", prompt = "[[reply:ok]] manifest {{event}}", max_runs_per_day = 3 },\n'
             '  { memory_key_pattern = "todo.*" },\n]\n')
    a, _ = agent(d, extra)
    made = d.get(f"/api/triggers?agent_id={a}").json()
    assert [(t["pattern"], t["source"], t["max_runs_per_day"]) for t in made] == [
        ({"content_match": "mf-signal"}, "manifest", 3), ({"memory_key_pattern": "todo.*"}, "manifest", None)]
    assert made[1]["prompt_template"] == "An event you watch for happened: {{event}}"
    publish(d, "mf-signal")
    assert answered(d, a, 1)[0].startswith("[[reply:ok]] manifest {")
    other, _ = agent(d)
    kept = trigger(d, other, {"agent_failed": a})
    assert d.delete(f"/api/agents/{a}").status_code == 200
    assert d.get(f"/api/triggers?agent_id={a}").json() == []
    assert d.get(f"/api/triggers/{kept['id']}").status_code == 200
    # A malformed condition refuses the spawn, naming it.
    r = d.post("/api/agents", json={"manifest_toml": 'name = "bad-proactive"\n[schedule.proactive]\n'
                                                     'conditions = [{ content_match = "" }]\n'})
    assert r.status_code == 400
    assert r.json()["error"] == ("invalid manifest format: schedule.proactive.conditions[0].content_match: "
                                 "must be a non-empty string")


def test_creates_racing_the_agents_deletion_leave_no_trigger_behind(d) -> None:
    for round_ in range(14):
        agent_id, _ = agent(d)
        answers: list[tuple[str, int, Any]] = []

        def work(i: int, s: requests.Session) -> None:
            if i == 0:
                time.sleep(0.005 * (round_ % 4))  # a few creates land first in some rounds
                answers.append(("kill", s.delete(f"{d.url}/api/agents/{agent_id}").status_code, None))
                return
            for _ in range(6):
                r = s.post(f"{d.url}/api/triggers", json={"agent_id": agent_id, "pattern": {"content_match": "x"},
                                                          "prompt_template": "t {{event}}"})
                answers.append(("create", r.status_code, r.json()))

        _together(6, work)
        assert [a for a in answers if a[0] == "kill"] == [("kill", 200, None)]
        assert all(status == 201 or (status == 404 and body == {"error": "agent not found"})
                   for what, status, body in answers if what == "create"), answers
        assert db_rows(d.home, "SELECT COUNT(*) FROM triggers WHERE agent_id = ?", (agent_id,)) == [(0,)], \
            "BUG: a trigger created while its agent was deleted outlives the agent"


def test_triggers_and_their_counters_survive_a_restart(d) -> None:
    within_one_utc_period(30, DAY)  # the runs counted below, in one UTC day
    a, _ = agent(d)
    word = f"restart-{uuid.uuid4().hex[:6]}"
    t = trigger(d, a, {"content_match": word}, "[[reply:ok]] after {{event}}", max_runs_per_day=5)
    publish(d, word)
    answered(d, a, 1)
    d.stop()
    d.start()
    got = d.get(f"/api/triggers/{t['id']}").json()
    assert (got["pattern"], got["fire_count"], got["runs_today"], got["max_runs_per_day"]) == (
        {"content_match": word}, 1, 1, 5)
    publish(d, word)
    assert len(answered(d, a, 2)) == 2

