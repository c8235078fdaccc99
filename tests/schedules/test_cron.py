"""Cron jobs through the real daemon with one-second intervals: the API's shapes and
refusals, firing counts, no overlap, one-shot, caps that pause, provider failures that back
off, run now, workflow actions, delivery to a signed webhook and to a fake ntfy server,
manifest schedules kept with their agent, the tools, and the WebSocket broadcast."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest
import requests
import websocket

from channel_fixtures import CHANNEL_ENV, wait_for
from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from fakes.ntfy import FakeNtfy
from support import DAY, Daemon, make_home, run_cli, stop_shared, within_one_utc_period

SECRET = "cron-webhook-secret"


class Receiver:
    """A local webhook endpoint: records each POST; answers `status`."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.posts.append({"path": self.path, "body": body, "headers": dict(self.headers)})
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def on(self, path: str) -> list[dict[str, Any]]:
        return [p for p in self.posts if p["path"] == path]


@pytest.fixture(scope="module")
def env(tmp_path_factory, fake_llm) -> Iterator[tuple[Daemon, Receiver, FakeNtfy]]:
    receiver = Receiver()
    ntfy = FakeNtfy(CHANNEL_ENV["NTFY_TOKEN"]).start()
    extra = ('\n[schedules]\nmisfire_grace_secs = 30\ndelivery_attempts = 2\n'
             f'\n[channels.ntfy]\ntopic = "cron-out"\nserver_url = "{ntfy.url}"\ntoken_env = "NTFY_TOKEN"\n')
    home = make_home(tmp_path_factory.mktemp("cron"), llm_config(fake_llm, extra + NO_REMEMBERING))
    daemon = Daemon(home, env_extra={**LLM_ENV, **CHANNEL_ENV, "CRON_SECRET": SECRET}).start()
    yield daemon, receiver, ntfy
    stop_shared(daemon)
    ntfy.stop()
    receiver.server.shutdown()


def spawn(d: Daemon, name: str, extra: str = "") -> str:
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n{extra}'})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def job(d: Daemon, **fields: Any) -> dict[str, Any]:
    body = {"schedule": {"kind": "every", "every_secs": 1}, **fields}
    r = d.post("/api/cron/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def runs(d: Daemon, job_id: str) -> list[dict[str, Any]]:
    r = d.get(f"/api/cron/jobs/{job_id}/runs")
    assert r.status_code == 200, r.text
    return r.json()


def ran(d: Daemon, job_id: str, status: str = "ok") -> list[dict[str, Any]]:
    return [r for r in runs(d, job_id) if r["status"] == status]


def turn(message: str) -> dict[str, str]:
    return {"kind": "agent_turn", "message": message}


def test_jobs_api_shapes_and_refusals(env) -> None:
    d, _, _ = env
    agent_id = spawn(d, "shapes")
    created = job(d, name="nightly report", agent_id="shapes",
                  schedule={"kind": "cron", "expr": "30 2 * * *", "tz": "Europe/Berlin"},
                  action=turn("write the report"), max_runs_per_day=2, max_cost_usd_per_day=0.5)
    assert created["agent_id"] == agent_id  # a name is accepted and stored as the id
    assert created["schedule"] == {"kind": "cron", "expr": "30 2 * * *", "tz": "Europe/Berlin"}
    assert created["delivery"] == {"kind": "none"}
    assert (created["enabled"], created["one_shot"], created["catch_up"]) == (True, False, "skip")
    assert (created["max_runs_per_day"], created["max_cost_usd_per_day"]) == (2, 0.5)
    assert created["last_run"] is None and created["paused_reason"] is None
    assert created["next_run_at"].endswith(("00:30:00Z", "01:30:00Z"))  # 02:30 in Berlin, in UTC
    assert d.get(f"/api/cron/jobs/{created['id']}").json() == created
    assert created["id"] in [j["id"] for j in d.get("/api/cron/jobs").json()]
    assert [j["id"] for j in d.get("/api/cron/jobs", params={"agent_id": "shapes"}).json()] == [created["id"]]
    # An empty agent_id is no filter, as for the triggers.
    every = [j["id"] for j in d.get("/api/cron/jobs").json()]
    assert [j["id"] for j in d.get("/api/cron/jobs?agent_id=").json()] == every

    paused = d.request("PATCH", f"/api/cron/jobs/{created['id']}", json={"enabled": False})
    assert paused.status_code == 200 and paused.json()["enabled"] is False and paused.json()["next_run_at"] is None
    resumed = d.request("PATCH", f"/api/cron/jobs/{created['id']}", json={"enabled": True}).json()
    assert resumed["enabled"] is True and resumed["next_run_at"] == created["next_run_at"]

    bad = [({"name": "x", "agent_id": "shapes", "schedule": {"kind": "cron", "expr": "bad"}, "action": turn("m")},
            "schedule.expr"),
           ({"name": "x", "agent_id": "nobody", "schedule": {"kind": "every", "every_secs": 1}, "action": turn("m")},
            "agent_id"),
           ({"name": "x", "agent_id": "shapes", "schedule": {"kind": "every", "every_secs": 0}, "action": turn("m")},
            "schedule.every_secs"),
           ({"name": "x", "agent_id": "shapes", "schedule": {"kind": "at", "at": "2001-01-01T00:00:00Z"},
             "action": turn("m")}, "schedule.at"),
           ({"name": "x", "agent_id": "shapes", "schedule": {"kind": "every", "every_secs": 5},
             "action": {"kind": "agent_turn", "message": " "}}, "action.message"),
           ({"name": "x", "schedule": {"kind": "every", "every_secs": 5},
             "action": {"kind": "workflow_run", "workflow_id": "missing"}}, "action.workflow_id"),
           ({"name": "x", "agent_id": "shapes", "schedule": {"kind": "every", "every_secs": 5}, "action": turn("m"),
             "delivery": {"kind": "webhook", "url": "http://example.com/hook", "secret_env": "S"}}, "delivery.url"),
           ({"name": "x", "agent_id": "shapes", "schedule": {"kind": "every", "every_secs": 5}, "action": turn("m"),
             "delivery": {"kind": "channel", "channel": "telegram"}}, "delivery.channel"),
           ({"name": "x", "agent_id": "shapes", "schedule": {"kind": "every", "every_secs": 5}, "action": turn("m"),
             "catch_up": "all"}, "catch_up"),
           ({"name": "x", "agent_id": "shapes", "schedule": {"kind": "every", "every_secs": 5}, "action": turn("m"),
             "max_runs_per_day": 0}, "max_runs_per_day"),
           ({"agent_id": "shapes", "schedule": {"kind": "every", "every_secs": 5}, "action": turn("m")}, "name"),
           ({"name": "x", "agent_id": "shapes", "schedule": {"kind": "every", "every_secs": 5}, "action": turn("m"),
             "colour": "red"}, "colour")]
    for body, field in bad:
        r = d.post("/api/cron/jobs", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"].startswith(field + ":"), (field, r.json())
    # The cron nicknames are taken as written; six fields are not a standard expression.
    nick = job(d, name="nick", agent_id="shapes", schedule={"kind": "cron", "expr": "@daily", "tz": "Asia/Tokyo"},
               action=turn("m"))
    assert nick["schedule"] == {"kind": "cron", "expr": "@daily", "tz": "Asia/Tokyo"}
    assert nick["next_run_at"].endswith("T15:00:00Z")  # midnight in Tokyo
    r = d.post("/api/cron/jobs", json={"name": "six", "agent_id": "shapes", "action": turn("m"),
                                       "schedule": {"kind": "cron", "expr": "0 0 9 * * *"}})
    assert r.status_code == 400 and r.json()["error"].endswith("'0 0 9 * * *' has 6 fields"), r.text
    # croniter's own additions (last day, nearest weekday, nth weekday, `?`) are no standard cron.
    for expr, says in (("0 0 L * *", "'L' in field 2"), ("0 0 1W * *", "'1W' in field 2"),
                       ("0 0 * * 1#2", "'1#2' in field 4"), ("0 0 ? * *", "'?' in field 2")):
        r = d.post("/api/cron/jobs", json={"name": "extended", "agent_id": "shapes", "action": turn("m"),
                                           "schedule": {"kind": "cron", "expr": expr}})
        assert (r.status_code, r.json()["error"]) == (
            400, "schedule.expr: must be a 5-field cron expression (minute hour day month weekday) or one of "
                 f"@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly; {says} is not standard cron")
    # A folder of the zone database is an unknown zone (a 400, not an internal error), here
    # and in a manifest; an `at` without an offset is read in its `tz`.
    r = d.post("/api/cron/jobs", json={"name": "tz", "agent_id": "shapes", "action": turn("m"),
                                       "schedule": {"kind": "cron", "expr": "0 9 * * *", "tz": "Europe"}})
    assert (r.status_code, r.json()) == (400, {"error": "schedule.tz: unknown time zone 'Europe'"})
    r = d.post("/api/agents", json={"manifest_toml": 'name = "zoned"\n'
                                                     'schedule = {periodic = {cron = "0 9 * * *", tz = "America"}}\n'})
    assert (r.status_code, r.json()["error"]) == (
        400, "invalid manifest format: schedule: periodic.tz: unknown time zone 'America'"), r.text
    # The host's own zone is no IANA zone: what it means differs from host to host.
    r = d.post("/api/cron/jobs", json={"name": "tz", "agent_id": "shapes", "action": turn("m"),
                                       "schedule": {"kind": "cron", "expr": "0 9 * * *", "tz": "localtime"}})
    assert (r.status_code, r.json()) == (400, {"error": "schedule.tz: unknown time zone 'localtime'"})
    manifest = 'name = "zoned"\nschedule = {periodic = {cron = "0 9 * * *", tz = "localtime"}}\n'
    r = d.post("/api/agents", json={"manifest_toml": manifest})
    assert (r.status_code, r.json()["error"]) == (
        400, "invalid manifest format: schedule: periodic.tz: unknown time zone 'localtime'"), r.text
    for url in ("https://[invalid", "https://hooks.example.com:99999/x", "https://exa mple.com/x"):
        r = d.post("/api/cron/jobs", json={"name": "hook", "agent_id": "shapes", "action": turn("m"),
                                           "delivery": {"kind": "webhook", "url": url, "secret_env": "S"},
                                           "schedule": {"kind": "every", "every_secs": 60}})
        assert (r.status_code, r.json()["error"]) == (
            400, "delivery.url: must be an https:// URL (http:// only to a loopback address)"), url
    r = d.post("/api/cron/jobs", json={"name": "far", "agent_id": "shapes", "action": turn("m"),
                                       "schedule": {"kind": "at", "at": "9999-12-31T23:59:59-23:59"}})
    assert (r.status_code, r.json()) == (400, {"error": "schedule.at: must be a time from year 1 to year 9999 in UTC"})
    at = job(d, name="at berlin", agent_id="shapes", action=turn("m"),
             schedule={"kind": "at", "at": "2031-07-01T09:00:00", "tz": "Europe/Berlin"})
    assert at["schedule"] == {"kind": "at", "at": "2031-07-01T07:00:00Z"}
    assert at["next_run_at"] == "2031-07-01T07:00:00Z"
    # A null delivery is no delivery, as the served document says.
    body = d.get("/api/openapi.json").json()["paths"]["/api/cron/jobs"]["post"]["requestBody"]
    delivery = body["content"]["application/json"]["schema"]["properties"]["delivery"]["oneOf"]
    assert {"type": "null", "description": 'The same as {"kind": "none"}'} in delivery
    assert job(d, name="no delivery", agent_id="shapes", action=turn("m"), delivery=None,
               enabled=False)["delivery"] == {"kind": "none"}
    # Past what the database column holds: a 400 naming the bound, on create and on change.
    huge = {"name": "x", "agent_id": "shapes", "schedule": {"kind": "every", "every_secs": 5}, "action": turn("m"),
            "max_runs_per_day": 10 ** 23}
    r = d.post("/api/cron/jobs", json=huge)
    assert (r.status_code, r.json()) == (400, {"error": "max_runs_per_day: must be at most 1000000, or null"})
    r = d.request("PATCH", f"/api/cron/jobs/{created['id']}", json={"max_runs_per_day": 2 ** 31})
    assert (r.status_code, r.json()) == (400, {"error": "max_runs_per_day: must be at most 1000000, or null"})
    r = d.post("/api/cron/jobs", json={**huge, "max_runs_per_day": 1, "schedule": {"kind": "every",
                                                                                   "every_secs": 366 * 86400 + 1}})
    assert (r.status_code, r.json()) == (400, {"error": "schedule.every_secs: must be an integer from 1 to "
                                                        "31622400 (366 days)"})
    unknown = "00000000-0000-4000-8000-000000000000"
    for method, path in [("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/run"), ("GET", "/runs")]:
        r = d.request(method, f"/api/cron/jobs/{unknown}{path}", json={} if method in ("PATCH", "POST") else None)
        assert r.status_code == 404 and r.json() == {"error": "cron job not found"}, (method, path, r.text)
    assert d.delete(f"/api/cron/jobs/{created['id']}").json() == {"status": "removed", "job_id": created["id"]}
    assert d.get(f"/api/cron/jobs/{created['id']}").status_code == 404


def test_every_second_fires_once_per_due_time_through_the_run_path(env) -> None:
    d, _, _ = env
    agent_id = spawn(d, "ticker")
    created = job(d, name="tick", agent_id=agent_id, action=turn("[[reply:tock]]"))
    wait_for(lambda: len(ran(d, created["id"])) >= 2, 10, what="two runs")
    d.request("PATCH", f"/api/cron/jobs/{created['id']}", json={"enabled": False})
    done = ran(d, created["id"])
    assert all(r["output"] == "tock" and r["error"] is None and r["cost_usd"] > 0 for r in done)
    dues = [r["due_at"] for r in runs(d, created["id"])]
    assert len(dues) == len(set(dues))  # each due time once
    # The runs are the agent's like any other: its session, the audit trail.
    session = d.get(f"/api/agents/{agent_id}/session").json()["messages"]
    assert session[:2] == [{"role": "User", "content": "[[reply:tock]]", "source": "cron"},
                           {"role": "Assistant", "content": "tock"}]
    audit = d.get("/api/audit/recent", params={"event": "cron.run", "limit": 200}).json()
    assert any(e["detail"].get("job_id") == created["id"] and e["detail"].get("source") == "cron" for e in audit)
    time.sleep(0.3)  # a run that had started when the job was paused ends
    count = len(runs(d, created["id"]))
    time.sleep(1.2)
    assert len(runs(d, created["id"])) == count  # paused: nothing more
    last = d.get(f"/api/cron/jobs/{created['id']}").json()["last_run"]
    assert last["status"] == "ok"
    # The metrics see them too: runs of origin `schedule`, and how late each due time started.
    scraped = d.get("/metrics").text
    # (On a shared database every series also carries the daemon's id.)
    scheduled = [line for line in scraped.splitlines() if line.startswith("agentd_runs_total{")
                 and 'origin="schedule"' in line and 'outcome="completed"' in line]
    assert scheduled and float(scheduled[0].split()[-1]) >= len(done)
    lag = [line for line in scraped.splitlines() if line.startswith("agentd_scheduler_lag_seconds_count")]
    assert lag and float(lag[0].split()[-1]) >= len(done)


def test_overlapped_due_times_are_recorded_skipped(env) -> None:
    d, _, _ = env
    spawn(d, "overlap")
    created = job(d, name="overlap", agent_id="overlap", action=turn("[[slow:1.6]] slow answer"))
    wait_for(lambda: ran(d, created["id"], "ok"), 10, what="the slow run")
    d.request("PATCH", f"/api/cron/jobs/{created['id']}", json={"enabled": False})
    history = runs(d, created["id"])
    skipped = [r for r in history if r["status"] == "skipped"]
    assert skipped and all(r["reason"] == "previous run still running" for r in skipped)
    starts = sorted((r["started_at"], r["finished_at"]) for r in history if r["status"] in ("ok", "running"))
    assert all(a[1] is None or a[1] <= b[0] for a, b in zip(starts, starts[1:]))  # never two at once


def test_a_one_shot_job_runs_once_then_is_disabled(env) -> None:
    d, _, _ = env
    spawn(d, "once")
    created = job(d, name="once", agent_id="once", action=turn("[[reply:done once]]"), one_shot=True)
    wait_for(lambda: ran(d, created["id"]), 10, what="the run")
    time.sleep(1.1)
    assert [r["output"] for r in runs(d, created["id"])] == ["done once"]
    after = d.get(f"/api/cron/jobs/{created['id']}").json()
    assert after["enabled"] is False and after["next_run_at"] is None


def test_a_one_shot_job_run_now_is_its_one_run(env) -> None:
    d, _, _ = env
    spawn(d, "once now")
    created = job(d, name="once now", agent_id="once now", action=turn("[[reply:done now]]"), one_shot=True,
                  schedule={"kind": "every", "every_secs": 3})
    assert d.post(f"/api/cron/jobs/{created['id']}/run").status_code == 202
    after = d.get(f"/api/cron/jobs/{created['id']}").json()
    assert after["enabled"] is False and after["next_run_at"] is None
    wait_for(lambda: ran(d, created["id"]), 10, what="the run")
    time.sleep(3.5)  # past the due time it had
    assert [(r["reason"], r["output"]) for r in runs(d, created["id"])] == [("run now", "done now")]


def test_max_runs_per_day_pauses_the_job_with_the_reason(env) -> None:
    d, _, _ = env
    within_one_utc_period(30, DAY)  # the runs counted below, in one UTC day
    spawn(d, "capped")
    created = job(d, name="capped", agent_id="capped", action=turn("[[reply:ok]]"), max_runs_per_day=2)
    paused = wait_for(lambda: (j := d.get(f"/api/cron/jobs/{created['id']}").json())["paused_reason"] and j, 10,
                      what="the pause")
    assert paused["enabled"] is False and paused["next_run_at"] is None
    assert paused["paused_reason"] == "max_runs_per_day reached (2 runs today, UTC)"
    assert len(ran(d, created["id"])) == 2
    # The due time the cap stopped is a skipped run with the pause's reason.
    assert [r["reason"] for r in ran(d, created["id"], "skipped")] == [paused["paused_reason"]]
    # The audit entry is written just after the pause it reports.
    wait_for(lambda: any(e["detail"] == {"job_id": created["id"], "reason": paused["paused_reason"]}
                         for e in d.get("/api/audit/recent", params={"event": "cron.job_paused"}).json()),
             10, what="the pause's audit entry")
    # Run now refuses too; resuming does not reset today's count.
    r = d.post(f"/api/cron/jobs/{created['id']}/run")
    assert r.status_code == 409 and "max_runs_per_day" in r.json()["error"]


def test_max_cost_per_day_pauses_the_job(env) -> None:
    d, _, _ = env
    within_one_utc_period(30, DAY)  # the spend counted below, in one UTC day
    spawn(d, "spender")
    created = job(d, name="spender", agent_id="spender", action=turn("[[reply:costly]]"),
                  max_cost_usd_per_day=0.00001)
    paused = wait_for(lambda: (j := d.get(f"/api/cron/jobs/{created['id']}").json())["paused_reason"] and j, 10,
                      what="the pause")
    assert paused["paused_reason"].startswith("max_cost_usd_per_day reached ($0.0000")
    assert len(ran(d, created["id"])) == 1
    # The run that crossed the cap is followed by a skipped run with the pause's reason.
    assert [r["reason"] for r in ran(d, created["id"], "skipped")] == [paused["paused_reason"]]
    wait_for(lambda: any(e["detail"] == {"job_id": created["id"], "reason": paused["paused_reason"]}
                         for e in d.get("/api/audit/recent", params={"event": "cron.job_paused"}).json()),
             10, what="the pause's audit entry")


def test_provider_failures_in_a_row_back_off(env) -> None:
    d, _, _ = env
    spawn(d, "failing")
    created = job(d, name="failing", agent_id="failing", action=turn("[[fail:400]] broken"))
    wait_for(lambda: ran(d, created["id"], "skipped"), 15, what="a due time skipped")
    d.request("PATCH", f"/api/cron/jobs/{created['id']}", json={"enabled": False})
    history = list(reversed(runs(d, created["id"])))
    assert [r["status"] for r in history[:3]] == ["failed"] * 3
    assert all(r["error"] for r in history[:3])
    assert history[3]["status"] == "skipped"
    assert history[3]["reason"].startswith("backing off after 3 failed runs in a row (until ")
    # Resuming clears the backoff.
    resumed = d.request("PATCH", f"/api/cron/jobs/{created['id']}", json={"enabled": True})
    assert resumed.status_code == 200
    d.request("PATCH", f"/api/cron/jobs/{created['id']}", json={"enabled": False})


def test_run_now_and_a_workflow_action(env) -> None:
    d, _, _ = env
    spawn(d, "flowing")
    wf = d.post("/api/workflows", json={"name": "wf", "steps": [
        {"name": "one", "agent": {"name": "flowing"}, "prompt": "[[reply:workflow says hi]] {{input}}"}]})
    assert wf.status_code == 201, wf.text
    created = job(d, name="wf job", schedule={"kind": "cron", "expr": "0 0 1 1 *"},
                  action={"kind": "workflow_run", "workflow_id": wf.json()["workflow_id"], "input": "x"})
    assert created["agent_id"] is None
    started = d.post(f"/api/cron/jobs/{created['id']}/run")
    assert started.status_code == 202, started.text
    assert started.json()["status"] == "running" and started.json()["reason"] == "run now"
    done = wait_for(lambda: ran(d, created["id"]), 10, what="the workflow run")
    assert done[0]["output"] == "workflow says hi" and done[0]["id"] == started.json()["id"]
    # The run costs what its steps cost, and that spend counts toward the job's cap.
    [wf_run] = d.get(f"/api/workflows/{wf.json()['workflow_id']}/runs").json()
    [step] = d.get(f"/api/workflows/runs/{wf_run['id']}").json()["step_results"]
    assert step["cost_usd"] > 0 and done[0]["cost_usd"] == step["cost_usd"]
    capped = job(d, name="wf capped", schedule={"kind": "cron", "expr": "0 0 1 1 *"},
                 action={"kind": "workflow_run", "workflow_id": wf.json()["workflow_id"]},
                 max_cost_usd_per_day=step["cost_usd"] / 2)
    assert d.post(f"/api/cron/jobs/{capped['id']}/run").status_code == 202
    paused = wait_for(lambda: (j := d.get(f"/api/cron/jobs/{capped['id']}").json())["paused_reason"] and j, 10,
                      what="the cost cap")
    assert paused["enabled"] is False and paused["paused_reason"].startswith("max_cost_usd_per_day reached ($")


def test_a_run_past_its_timeout_fails_saying_so(env) -> None:
    d, _, _ = env
    agent_id = spawn(d, "sluggish")
    created = job(d, name="sluggish", agent_id="sluggish", schedule={"kind": "cron", "expr": "0 0 1 1 *"},
                  action={"kind": "agent_turn", "message": "[[slow:4]] late answer", "timeout_secs": 1})
    started = d.post(f"/api/cron/jobs/{created['id']}/run")
    assert started.status_code == 202, started.text
    [failed] = wait_for(lambda: ran(d, created["id"], "failed"), 10, what="the timed-out run")
    assert failed["error"] == "timed out after 1 s (action.timeout_secs)" and failed["output"] is None
    took = (datetime.fromisoformat(failed["finished_at"]) - datetime.fromisoformat(failed["started_at"]))
    assert took.total_seconds() < 3.5
    # The agent is free again for its next message.
    r = d.post(f"/api/agents/{agent_id}/message", json={"message": "[[reply:awake]]"})
    assert r.status_code == 200 and r.json()["response"] == "awake"


def test_run_now_pressed_at_once_from_many_clients_starts_one_run(env) -> None:
    d, _, _ = env
    spawn(d, "pressed")
    created = job(d, name="pressed job", agent_id="pressed", schedule={"kind": "cron", "expr": "0 0 1 1 *"},
                  action=turn("[[slow:1]] [[reply:once]]"))
    barrier = threading.Barrier(8)
    answers: list[int] = []

    def press() -> None:
        barrier.wait()
        answers.append(d.post(f"/api/cron/jobs/{created['id']}/run").status_code)

    pressers = [threading.Thread(target=press) for _ in range(8)]
    for t in pressers:
        t.start()
    for t in pressers:
        t.join()
    assert sorted(answers) == [202] + [409] * 7
    done = wait_for(lambda: ran(d, created["id"]), 10, what="the run")
    assert [r["status"] for r in done] == ["ok"]

    # Deleted from many clients at once: one removes it, the others hear it is gone.
    barrier = threading.Barrier(6)
    answers.clear()

    def delete() -> None:
        barrier.wait()
        answers.append(d.delete(f"/api/cron/jobs/{created['id']}").status_code)

    deleters = [threading.Thread(target=delete) for _ in range(6)]
    for t in deleters:
        t.start()
    for t in deleters:
        t.join()
    assert sorted(answers) == [200] + [404] * 5


def test_creates_from_many_clients_at_once_stop_at_the_agents_cap(env) -> None:
    d, _, _ = env
    spawn(d, "crowded")
    never = {"kind": "cron", "expr": "0 0 1 1 *"}
    barrier = threading.Barrier(8)
    answers: list[tuple[int, Any]] = []

    def create(i: int) -> None:
        with requests.Session() as s:
            barrier.wait()
            for j in range(8):
                r = s.post(f"{d.url}/api/cron/jobs", json={"name": f"c{i}-{j}", "agent_id": "crowded",
                                                           "schedule": never, "action": turn("x")})
                answers.append((r.status_code, r.json() if r.status_code != 201 else None))

    creators = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in creators:
        t.start()
    for t in creators:
        t.join()
    full = {"error": "the agent has 50 cron jobs already (max_jobs_per_agent)"}
    assert sorted(answers, key=lambda a: a[0]) == [(201, None)] * 50 + [(409, full)] * 14, \
        "BUG: jobs created at once pass the agent's cap together"
    assert len(d.get("/api/cron/jobs?agent_id=crowded").json()) == 50


def test_creates_racing_the_agents_deletion_leave_no_job_behind(env) -> None:
    d, _, _ = env
    never = {"kind": "cron", "expr": "0 0 1 1 *"}
    for round_ in range(10):
        agent_id = spawn(d, f"doomed-{round_}")
        barrier = threading.Barrier(6)
        answers: list[tuple[str, int, Any]] = []

        def work(i: int) -> None:
            with requests.Session() as s:
                barrier.wait()
                if i == 0:
                    time.sleep(0.02)  # a few creates land first
                    answers.append(("kill", s.delete(f"{d.url}/api/agents/{agent_id}").status_code, None))
                    return
                for j in range(6):
                    r = s.post(f"{d.url}/api/cron/jobs", json={"name": f"j{i}-{j}", "agent_id": agent_id,
                                                               "schedule": never, "action": turn("x")})
                    answers.append(("create", r.status_code, r.json()))

        workers = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        gone = [{"error": f"agent_id: no agent {agent_id!r}"}, {"error": "agent not found"}]
        assert [a for a in answers if a[0] == "kill"] == [("kill", 200, None)]
        assert all(status == 201 or (status in (400, 404) and body in gone)
                   for what, status, body in answers if what == "create"), answers
        assert d.get(f"/api/cron/jobs?agent_id={agent_id}").json() == []
        assert [j for j in d.get("/api/cron/jobs").json() if j["agent_id"] == agent_id] == [], \
            "BUG: a job created while its agent was deleted outlives the agent"


def test_the_global_budget_refuses_an_unattended_run(env) -> None:
    d, _, _ = env
    agent_id = spawn(d, "thrifty")
    assert d.post(f"/api/agents/{agent_id}/message", json={"message": "spend"}).json()["cost_usd"] > 0.000001
    created = job(d, name="thrifty job", agent_id="thrifty", schedule={"kind": "cron", "expr": "0 0 1 1 *"},
                  action=turn("more"))
    assert d.put("/api/budget", json={"limit_usd": 0.000001}).status_code == 200
    try:
        assert d.post(f"/api/cron/jobs/{created['id']}/run").status_code == 202
        [failed] = wait_for(lambda: ran(d, created["id"], "failed"), 10, what="the refused run")
    finally:
        d.put("/api/budget", json={"limit_usd": 0})
    assert failed["error"].startswith("message delivery failed: quota exceeded: monthly budget reached: ")
    assert failed["cost_usd"] is None and failed["output"] is None


def test_results_go_to_a_signed_webhook_and_failures_are_retried_without_a_rerun(env) -> None:
    d, receiver, _ = env
    spawn(d, "hooked")
    created = job(d, name="hooked", agent_id="hooked", action=turn("[[reply:for the hook]]"), one_shot=True,
                  delivery={"kind": "webhook", "url": f"{receiver.url}/hook", "secret_env": "CRON_SECRET"})
    post = wait_for(lambda: receiver.on("/hook"), 10, what="the webhook post")[0]
    expected = "sha256=" + hmac.new(SECRET.encode(), post["body"], hashlib.sha256).hexdigest()
    assert post["headers"]["X-Agentd-Signature"] == expected
    body = json.loads(post["body"])
    assert body["output"] == "for the hook" and body["job"] == {"id": created["id"], "name": "hooked",
                                                                 "agent_id": created["agent_id"]}
    assert body["run"]["status"] == "ok"
    run = wait_for(lambda: (r := ran(d, created["id"])) and r[0]["delivery"]["status"] == "delivered" and r[0],
                   5, what="delivery recorded")
    assert run["delivery"] == {"status": "delivered", "attempts": 1, "error": None}
    # The body's run is the stored run, to the microsecond.
    assert body["run"] == {key: run[key] for key in ("id", "status", "started_at", "finished_at", "cost_usd")}

    receiver.status = 500
    failing = job(d, name="hook fails", agent_id="hooked", action=turn("[[reply:again]]"), one_shot=True,
                  delivery={"kind": "webhook", "url": f"{receiver.url}/down", "secret_env": "CRON_SECRET"})
    run = wait_for(lambda: (r := ran(d, failing["id"])) and r[0]["delivery"]["status"] == "failed" and r[0],
                   15, what="delivery given up")
    assert run["delivery"] == {"status": "failed", "attempts": 2, "error": "webhook answered HTTP 500"}
    assert len(receiver.on("/down")) == 2 and len(runs(d, failing["id"])) == 1  # retried, not re-run
    receiver.status = 200


def test_a_delivery_cut_off_by_a_restart_is_resumed_without_a_rerun(tmp_path, fake_llm) -> None:
    receiver = Receiver()
    receiver.status = 503
    home = make_home(tmp_path, llm_config(fake_llm, "\n[schedules]\ndelivery_attempts = 6\n" + NO_REMEMBERING))
    d = Daemon(home, env_extra={**LLM_ENV, "CRON_SECRET": SECRET}).start()
    try:
        spawn(d, "interrupted")
        created = job(d, name="interrupted", agent_id="interrupted", schedule={"kind": "cron", "expr": "0 0 1 1 *"},
                      action=turn("[[reply:worth waiting for]]"),
                      delivery={"kind": "webhook", "url": f"{receiver.url}/flaky", "secret_env": "CRON_SECRET"})
        assert d.post(f"/api/cron/jobs/{created['id']}/run").status_code == 202
        wait_for(lambda: len(receiver.on("/flaky")) >= 2, 10, what="two failed attempts")
        d.stop()
        before = len(receiver.on("/flaky"))
        receiver.status = 200
        d = Daemon(home, env_extra={**LLM_ENV, "CRON_SECRET": SECRET}).start()
        run = wait_for(lambda: (r := ran(d, created["id"])) and r[0]["delivery"]["status"] == "delivered" and r[0],
                       15, what="the delivery resumed")
        # The attempts count on from where the stopped daemon left them; the agent ran once.
        assert run["delivery"] == {"status": "delivered", "attempts": before + 1, "error": None}
        assert len(receiver.on("/flaky")) == before + 1 and len(runs(d, created["id"])) == 1
        assert json.loads(receiver.on("/flaky")[-1]["body"])["output"] == "worth waiting for"
        assert d.get(f"/api/cron/jobs/{created['id']}").json()["last_run"]["delivery"] == run["delivery"]
    finally:
        d.stop()
        receiver.server.shutdown()


def test_a_webhook_naming_an_unset_variable_is_refused_at_creation_and_change(env) -> None:
    """Every delivery would fail: the daemon reads its environment only when it starts."""
    d, receiver, _ = env
    spawn(d, "unsigned")
    refusal = {"error": "delivery.secret_env: environment variable CRON_UNSET_SECRET is not set "
                        "(the daemon reads its environment when it starts)"}
    unset = {"kind": "webhook", "url": f"{receiver.url}/unset", "secret_env": "CRON_UNSET_SECRET"}
    body = {"name": "unsigned", "agent_id": "unsigned", "action": turn("m"),
            "schedule": {"kind": "cron", "expr": "0 0 1 1 *"}}
    r = d.post("/api/cron/jobs", json={**body, "delivery": unset})
    assert (r.status_code, r.json()) == (400, refusal)
    assert d.get("/api/cron/jobs", params={"agent_id": "unsigned"}).json() == []

    signed = {**unset, "secret_env": "CRON_SECRET"}
    made = job(d, **body, delivery=signed)
    r = d.request("PATCH", f"/api/cron/jobs/{made['id']}", json={"delivery": unset})
    assert (r.status_code, r.json()) == (400, refusal)
    assert d.get(f"/api/cron/jobs/{made['id']}").json()["delivery"] == signed


def test_a_webhook_whose_variable_is_gone_at_start_is_named_in_the_log_and_in_the_last_run(
        tmp_path, fake_llm) -> None:
    receiver = Receiver()
    home = make_home(tmp_path, llm_config(fake_llm, "\n[schedules]\ndelivery_attempts = 1\n" + NO_REMEMBERING))
    d = Daemon(home, env_extra={**LLM_ENV, "CRON_SECRET": SECRET, "CRON_LOST_SECRET": SECRET}).start()
    try:
        spawn(d, "forgetful")
        created = job(d, name="lost hook", agent_id="forgetful", schedule={"kind": "cron", "expr": "0 0 1 1 *"},
                      action=turn("[[reply:for nobody]]"),
                      delivery={"kind": "webhook", "url": f"{receiver.url}/lost", "secret_env": "CRON_LOST_SECRET"})
        job(d, name="kept hook", agent_id="forgetful", schedule={"kind": "cron", "expr": "0 0 1 1 *"},
            action=turn("x"), delivery={"kind": "webhook", "url": f"{receiver.url}/kept", "secret_env": "CRON_SECRET"})
        assert "CRON_LOST_SECRET" not in d.log()
        d.stop()
        # Started again without the variable (a service whose environment file lost it).
        before = len(d.log())
        d = Daemon(home, env_extra={**LLM_ENV, "CRON_SECRET": SECRET}).start()
        warned = [line for line in d.log()[before:].splitlines() if "secret_env" in line]
        assert len(warned) == 1 and warned[0].endswith(
            "WARNING agentd.schedules: cron job lost hook: its webhook's secret_env CRON_LOST_SECRET is not set in "
            "the daemon's environment; every delivery fails until the daemon starts with it"), warned
        assert d.post(f"/api/cron/jobs/{created['id']}/run").status_code == 202
        run = wait_for(lambda: (r := ran(d, created["id"])) and r[0]["delivery"]["status"] == "failed" and r[0],
                       10, what="the delivery given up")
        failure = {"status": "failed", "attempts": 1,
                   "error": "the environment variable CRON_LOST_SECRET (secret_env) is not set"}
        assert run["delivery"] == failure and run["output"] == "for nobody"
        last = d.get(f"/api/cron/jobs/{created['id']}").json()["last_run"]
        assert last["run_id"] == run["id"] and last["delivery"] == failure
        assert receiver.on("/lost") == []
        assert SECRET not in d.log()
    finally:
        d.stop()
        receiver.server.shutdown()


def test_results_go_to_a_channel_through_its_sender(env) -> None:
    d, _, ntfy = env
    spawn(d, "announcer")
    job(d, name="announce", agent_id="announcer", action=turn("[[think]] [[reply:news of the day]]"),
        one_shot=True, delivery={"kind": "channel", "channel": "ntfy"})
    sent = wait_for(lambda: [m for m in ntfy.messages if "news of the day" in m["message"]], 10,
                    what="the ntfy message")
    assert sent[0]["topic"] == "cron-out" and "secret reasoning" not in sent[0]["message"]


def test_manifest_schedules_follow_the_agent(env) -> None:
    d, _, _ = env
    agent_id = spawn(d, "watcher", '[schedule.continuous]\ncheck_interval_secs = 1\nmessage = "[[reply:all quiet]]"\n')
    jobs = d.get("/api/cron/jobs", params={"agent_id": agent_id}).json()
    assert [(j["name"], j["schedule"], j["origin"]) for j in jobs] == [
        ("watcher:continuous", {"kind": "every", "every_secs": 1}, "manifest")]
    wait_for(lambda: ran(d, jobs[0]["id"]), 10, what="a continuous run")
    periodic = spawn(d, "reporter", 'schedule = {periodic = {cron = "0 9 * * 1-5", tz = "Asia/Tokyo"}}\n')
    [report] = d.get("/api/cron/jobs", params={"agent_id": periodic}).json()
    assert report["name"] == "reporter:periodic"
    assert report["schedule"] == {"kind": "cron", "expr": "0 9 * * 1-5", "tz": "Asia/Tokyo"}
    assert report["action"]["message"].startswith("Scheduled check (cron 0 9 * * 1-5)")
    # Its name is how each start finds it again: renaming it is refused, other changes are taken.
    r = d.request("PATCH", f"/api/cron/jobs/{report['id']}", json={"name": "renamed-periodic"})
    assert (r.status_code, r.json()) == (400, {"error": "name: a manifest schedule's job keeps the name its "
                                                        "agent's manifest gives it ('reporter:periodic')"})
    r = d.request("PATCH", f"/api/cron/jobs/{report['id']}", json={"name": "reporter:periodic", "max_runs_per_day": 3})
    assert (r.status_code, r.json()["name"], r.json()["max_runs_per_day"]) == (200, "reporter:periodic", 3)
    # Killing an agent removes all its jobs, the API's too.
    extra = job(d, name="extra", agent_id=agent_id, schedule={"kind": "cron", "expr": "0 0 1 1 *"},
                action=turn("x"))
    assert d.delete(f"/api/agents/{agent_id}").status_code == 200
    assert d.get(f"/api/cron/jobs/{extra['id']}").status_code == 404
    assert d.get(f"/api/cron/jobs/{jobs[0]['id']}").status_code == 404
    bad = d.post("/api/agents", json={"manifest_toml": 'name = "bad"\nschedule = {periodic = {cron = "nope"}}\n'})
    assert bad.status_code == 400 and "periodic.cron" in bad.json()["error"]


def test_a_changed_manifest_replaces_the_agents_schedule(env) -> None:
    d, _, _ = env
    agent_id = spawn(d, "shifting", '[schedule.continuous]\ncheck_interval_secs = 3600\n')
    [continuous] = d.get("/api/cron/jobs", params={"agent_id": agent_id}).json()
    kept = job(d, name="kept", agent_id=agent_id, schedule={"kind": "cron", "expr": "0 0 1 1 *"}, action=turn("x"))

    def change(schedule: str) -> None:
        r = d.request("PUT", f"/api/agents/{agent_id}/manifest",
                      json={"manifest_toml": f'name = "shifting"\n{schedule}'})
        assert r.status_code == 200, r.text

    def mine() -> list[tuple[str, dict[str, Any]]]:
        return sorted((j["name"], j["schedule"]) for j in d.get("/api/cron/jobs", params={"agent_id": agent_id}).json())

    change('schedule = {periodic = {cron = "30 8 * * *", tz = "Europe/Paris"}}\n')
    assert mine() == [("kept", {"kind": "cron", "expr": "0 0 1 1 *", "tz": "UTC"}),
                      ("shifting:periodic", {"kind": "cron", "expr": "30 8 * * *", "tz": "Europe/Paris"})]
    assert d.get(f"/api/cron/jobs/{continuous['id']}").status_code == 404
    change('[schedule.proactive]\nconditions = [{ content_match = "shift-signal" }]\n')
    assert mine() == [("kept", {"kind": "cron", "expr": "0 0 1 1 *", "tz": "UTC"})]
    assert [(t["pattern"], t["source"]) for t in d.get("/api/triggers", params={"agent_id": agent_id}).json()] == [
        ({"content_match": "shift-signal"}, "manifest")]
    change("")
    assert d.get("/api/triggers", params={"agent_id": agent_id}).json() == []
    assert [j["id"] for j in d.get("/api/cron/jobs", params={"agent_id": agent_id}).json()] == [kept["id"]]


def test_an_agent_schedules_its_own_follow_up_with_the_tools(env) -> None:
    d, _, _ = env
    agent_id = spawn(d, "planner", 'profile = "full"\n')
    args = json.dumps({"description": "remind me about the meeting", "schedule": "tomorrow at 9:00"})
    r = d.post(f"/api/agents/{agent_id}/message", json={"message": f"[[tool:schedule_create {args}]]"})
    assert r.status_code == 200, r.text
    [created] = d.get("/api/cron/jobs", params={"agent_id": agent_id}).json()
    assert created["origin"] == "tool" and created["schedule"]["kind"] == "at" and created["one_shot"] is True
    assert created["action"] == {"kind": "agent_turn", "message": "remind me about the meeting"}
    assert created["next_run_at"].endswith("T09:00:00Z")
    cron = json.dumps({"name": "digest", "schedule": {"kind": "cron", "expr": "0 7 * * *"},
                       "action": {"kind": "agent_turn", "message": "digest"}})
    d.post(f"/api/agents/{agent_id}/message", json={"message": f"[[tool:cron_create {cron}]]"})
    listed = d.post(f"/api/agents/{agent_id}/message", json={"message": "[[tool:cron_list {}]]"}).json()
    assert "digest" in listed["response"] and "remind me" in listed["response"]
    digest = [j for j in d.get("/api/cron/jobs", params={"agent_id": agent_id}).json() if j["name"] == "digest"][0]
    gone = d.post(f"/api/agents/{agent_id}/message",
                  json={"message": f"[[tool:cron_cancel {json.dumps({'job_id': digest['id']})}]]"}).json()
    assert "cancelled cron job" in gone["response"]
    assert d.get(f"/api/cron/jobs/{digest['id']}").status_code == 404
    # Observe mode: none of the tools is offered.
    d.request("PUT", f"/api/agents/{agent_id}/mode", json={"mode": "Observe"})
    tools = d.get(f"/api/agents/{agent_id}").json()["capabilities"]["tools"]
    assert not [t for t in tools if t.startswith(("schedule_", "cron_"))]


def test_the_tools_are_refused_in_observe_mode_and_outside_the_capability_list(env) -> None:
    d, _, _ = env
    watcher = spawn(d, "onlooker", 'profile = "full"\n')
    assert d.request("PUT", f"/api/agents/{watcher}/mode", json={"mode": "Observe"}).status_code == 200
    narrow = spawn(d, "narrow", '[capabilities]\ntools = ["file_read"]\n')
    calls = {"schedule_create": {"description": "ping", "schedule": "every 5 minutes"},
             "cron_create": {"name": "sneaky", "schedule": {"kind": "every", "every_secs": 60},
                             "action": {"kind": "agent_turn", "message": "ping"}}}
    for agent_id, why in [(watcher, " (Observe mode: read-only tools)"), (narrow, "")]:
        for name, args in calls.items():
            r = d.post(f"/api/agents/{agent_id}/message", json={"message": f"[[tool:{name} {json.dumps(args)}]]"})
            assert r.status_code == 200, r.text
            assert r.json()["response"] == (f"tool said: permission denied: tool '{name}' is not available to "
                                            f"this agent{why}")
        assert d.get("/api/cron/jobs", params={"agent_id": agent_id}).json() == []


def test_a_cron_run_is_broadcast_to_the_agents_websockets(env) -> None:
    d, _, _ = env
    agent_id = spawn(d, "social")
    ws = websocket.create_connection(f"ws://127.0.0.1:{d.port}/api/agents/{agent_id}/ws", timeout=10)
    # A socket talking in a person's session is not shown a run written to the agent's own.
    elsewhere = websocket.create_connection(f"ws://127.0.0.1:{d.port}/api/agents/{agent_id}/ws?user=ann", timeout=10)
    try:
        assert json.loads(ws.recv())["type"] == "connected"
        assert json.loads(elsewhere.recv())["type"] == "connected"
        created = job(d, name="chatter", agent_id=agent_id, action=turn("[[reply:hello sockets]]"), one_shot=True)
        frames = []
        while not frames or frames[-1]["type"] != "response":
            frames.append(json.loads(ws.recv()))
        elsewhere.send(json.dumps({"type": "ping"}))
        assert json.loads(elsewhere.recv()) == {"type": "pong"}
    finally:
        ws.close()
        elsewhere.close()
    assert frames[0] == {"type": "message", "content": "[[reply:hello sockets]]", "source": "cron",
                         "job_id": created["id"], "job_name": "chatter"}
    assert frames[1] == {"type": "typing", "state": "start"}
    assert frames[-2] == {"type": "typing", "state": "stop"}
    assert frames[-1]["content"] == "hello sockets"


def test_the_cli_adds_runs_pauses_resumes_and_removes_a_job(env) -> None:
    d, _, _ = env
    spawn(d, "clied")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return run_cli(d.home, "cron", *args, port=d.port)

    added = cli("add", "cli job", "--agent", "clied", "--cron", "0 6 * * *", "--tz", "Europe/Paris",
                "--message", "[[reply:from the cli]]", "--max-runs-per-day", "5")
    assert added.returncode == 0, added.stderr
    [created] = [j for j in d.get("/api/cron/jobs", params={"agent_id": "clied"}).json()]
    assert added.stdout.startswith(f"created cron job {created['id']}")
    assert created["action"] == {"kind": "agent_turn", "message": "[[reply:from the cli]]"}
    assert created["schedule"] == {"kind": "cron", "expr": "0 6 * * *", "tz": "Europe/Paris"}
    assert created["max_runs_per_day"] == 5
    assert "cli job" in cli("list").stdout
    assert cli("run", "cli job").stdout.startswith("started run ")
    wait_for(lambda: ran(d, created["id"]), 10, what="the run")
    assert cli("pause", "cli job").stdout.strip() == "paused"
    assert d.get(f"/api/cron/jobs/{created['id']}").json()["enabled"] is False
    assert cli("resume", created["id"]).stdout.startswith("resumed (next run ")
    assert cli("rm", "cli job").stdout.strip() == "removed"
    refused = cli("add", "bad", "--agent", "clied", "--every", "5")
    assert refused.returncode == 1 and "--message is required" in refused.stderr
    # A workflow by its name, as `agentd workflow run` takes it.
    flow = d.post("/api/workflows", json={"name": "cli flow", "steps": [
        {"name": "only", "agent_name": "clied", "prompt": "{{input}}"}]}).json()["workflow_id"]
    added = cli("add", "cli flow job", "--workflow", "cli flow", "--input", "go", "--every", "3600")
    assert added.returncode == 0, added.stderr
    [flowed] = [j for j in d.get("/api/cron/jobs").json() if j["name"] == "cli flow job"]
    assert flowed["action"] == {"kind": "workflow_run", "workflow_id": flow, "input": "go"}
    zero = cli("add", "x", "--agent", "clied", "--every", "0", "--message", "m")
    assert zero.returncode == 1 and "schedule.every_secs: must be an integer from 1" in zero.stderr
    missing = cli("add", "x", "--workflow", "no such flow", "--every", "3600")
    assert missing.returncode == 1 and "no workflow named 'no such flow'" in missing.stderr
    assert cli("rm", "cli flow job").returncode == 0
