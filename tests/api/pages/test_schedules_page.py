"""The Schedules page through Flask's test client over a real kernel: jobs with their next due
time in the viewer's zone, last result, caps and state; enable, disable, run now and delete
as CSRF-protected forms answered with 303; one job's history."""

from __future__ import annotations

import html as htmllib
import re
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from agentd.api import create_app
from agentd.config import parse_config
from agentd.kernel import Kernel
from support import with_test_db
from tests.api.pages.test_pages import asks_first

LOCAL = {"REMOTE_ADDR": "127.0.0.1"}


@pytest.fixture
def dash(tmp_path: Path, fake_llm, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-openai")
    data = {"api": {"rate_limit_per_second": 10000, "rate_limit_burst": 10000},
            "llm": {"timeout_secs": 3, "retries": 1},
            "default_model": {"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
            "provider_urls": {"openai": fake_llm.openai_base}}
    kernel = Kernel.open(parse_config(with_test_db(data, tmp_path), tmp_path))
    yield create_app(kernel).test_client(), kernel
    kernel.close()


def text(client, path: str) -> str:
    response = client.get(path, environ_base=LOCAL)
    assert response.status_code == 200, response.status_code
    return response.get_data(as_text=True)


def note(client, redirect) -> str:
    """The message on the page a form's 303 leads to."""
    page = text(client, redirect.headers["Location"])
    found = re.search(r'id="page-note">(.*?)</div>', page, re.S)
    return htmllib.unescape(re.sub(r"<[^>]+>", "", found.group(1))).strip() if found else ""


def csrf(html: str) -> str:
    return re.search(r'name="csrf_token" value="([0-9a-f]{64})"', html).group(1)


def test_the_schedules_page_lists_steers_and_shows_history(dash) -> None:
    client, kernel = dash
    kernel.agents.spawn('name = "paged"\n')
    job = kernel.cron.create({"name": "morning", "agent_id": "paged",
                              "schedule": {"kind": "cron", "expr": "0 9 * * *", "tz": "UTC"},
                              "action": {"kind": "agent_turn", "message": "[[reply:good <i>morning</i>]]"},
                              "max_runs_per_day": 4, "max_cost_usd_per_day": 0.25})
    html = text(client, "/schedules")
    assert ">morning</a>" in html and "<code>0 9 * * *</code> UTC" in html
    assert "4 runs/day" in html and "$0.250000/day" in html and "paged" in html
    due = job["next_run_at"]
    assert f'<time datetime="{due}">{due[:10]} 09:00:00</time>' in html
    # The viewer's zone (kept in a cookie): the same instant in Tokyo's wall time.
    tokyo = text(client, "/schedules?tz=Asia/Tokyo")
    assert f'<time datetime="{due}">' in tokyo and " 18:00:00</time>" in tokyo and "Next run (Asia/Tokyo)" in tokyo
    assert "Next run (Asia/Tokyo)" in text(client, "/schedules")
    token = csrf(html)

    refused = client.post(f"/schedules/{job['id']}/disable", data={}, environ_base=LOCAL)
    assert refused.status_code == 403 and kernel.cron.get(job["id"])["enabled"] is True
    r = client.post(f"/schedules/{job['id']}/disable", data={"csrf_token": token}, environ_base=LOCAL)
    assert r.status_code == 303 and r.headers["Location"].startswith("/schedules?note=")
    assert note(client, r) == "cron job morning paused; nothing fires until it is enabled again"
    assert kernel.cron.get(job["id"])["enabled"] is False
    r = client.post(f"/schedules/{job['id']}/enable", data={"csrf_token": token, "back": "job"}, environ_base=LOCAL)
    assert r.status_code == 303 and r.headers["Location"].startswith(f"/schedules/{job['id']}?note=")
    assert note(client, r) == f"cron job morning resumed; next run {due[:10]} 09:00:00 UTC"
    assert kernel.cron.get(job["id"])["enabled"] is True
    r = client.post(f"/schedules/{job['id']}/run", data={"csrf_token": token}, environ_base=LOCAL)
    assert r.status_code == 303 and note(client, r) == "cron job morning started; its result shows in the history"
    deadline = time.monotonic() + 10
    while kernel.cron.runs(job["id"])[0]["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    page = text(client, f"/schedules/{job['id']}")
    assert "good &lt;i&gt;morning&lt;/i&gt;" in page and "run now" in page and "History" in page
    assert ">ok</span>" in text(client, "/schedules")
    assert f'<a class="button bad" href="/schedules/{job["id"]}/delete">Delete…</a>' in page
    r = asks_first(client, f"/schedules/{job['id']}/delete", token, "Delete cron job morning?",
                   lambda: len(kernel.cron.list()) == 1)
    assert r.status_code == 303 and kernel.cron.list() == []
    assert note(client, r) == "cron job morning deleted, with its history"
    assert client.get(f"/schedules/{job['id']}", environ_base=LOCAL).status_code == 404


def test_a_job_is_added_from_the_form_and_a_refusal_keeps_what_was_typed(dash) -> None:
    client, kernel = dash
    kernel.agents.spawn('name = "former"\n')
    html = text(client, "/schedules")
    assert 'action="/schedules" class="stack" id="job-form"' in html and '<option value="former">former</option>' in html
    token = csrf(html)
    typed = {"csrf_token": token, "name": "weekday report", "agent_id": "former", "kind": "cron",
             "expr": "0 9 * * 1-5", "tz": "Mars/Olympus", "message": "Write the <report>.",
             "max_runs_per_day": "2", "max_cost_usd_per_day": "0.25"}
    r = client.post("/schedules", data=typed, environ_base=LOCAL)
    page = r.get_data(as_text=True)
    assert r.status_code == 400 and kernel.cron.list() == []
    assert '<p class="error" role="alert" id="job-error">schedule.tz: unknown time zone &#39;Mars/Olympus&#39;</p>' in page
    assert 'value="weekday report"' in page and "Write the &lt;report&gt;.</textarea>" in page
    for field, value, error in (("max_runs_per_day", "many", "max_runs_per_day: must be an integer greater than 0"),
                                ("expr", "0 9 * *", "schedule.expr: must be a 5-field cron expression"),
                                ("message", " ", "action.message: must be a non-empty string")):
        r = client.post("/schedules", data={**typed, "tz": "Europe/Berlin", field: value}, environ_base=LOCAL)
        assert r.status_code == 400 and error in r.get_data(as_text=True), field
    assert client.post("/schedules", data={**typed, "csrf_token": ""}, environ_base=LOCAL).status_code == 403

    r = client.post("/schedules", data={**typed, "tz": "Europe/Berlin"}, environ_base=LOCAL)
    [job] = kernel.cron.list()
    assert r.status_code == 303 and r.headers["Location"].startswith(f"/schedules/{job['id']}?note=")
    assert (job["name"], job["agent_id"], job["schedule"], job["action"]) == (
        "weekday report", kernel.agents.by_name("former").id,
        {"kind": "cron", "expr": "0 9 * * 1-5", "tz": "Europe/Berlin"},
        {"kind": "agent_turn", "message": "Write the <report>."})
    assert (job["max_runs_per_day"], job["max_cost_usd_per_day"], job["one_shot"]) == (2, 0.25, False)
    due = job["next_run_at"]
    assert note(client, r) == f"cron job weekday report created; next run {due[:10]} {due[11:19]} UTC"

    r = client.post("/schedules", data={"csrf_token": token, "name": "once", "agent_id": "former", "kind": "every",
                                        "every_secs": "60", "message": "tick", "one_shot": "on"}, environ_base=LOCAL)
    once = [j for j in kernel.cron.list() if j["name"] == "once"][0]
    assert r.status_code == 303 and once["schedule"] == {"kind": "every", "every_secs": 60} and once["one_shot"] is True


def test_the_triggers_on_the_schedules_page_are_shown_in_the_viewers_zone(dash) -> None:
    client, kernel = dash
    kernel.agents.spawn('name = "watched"\n')
    made = kernel.triggers.create({"agent_id": "watched", "pattern": {"content_match": "deploy"},
                                   "prompt_template": "p"})
    kernel.triggers.store.admit(made["id"], 10)  # one firing: its time is the trigger's last_fired_at
    fired = kernel.triggers.get(made["id"])["last_fired_at"]
    tokyo = datetime.fromisoformat(fired).astimezone(ZoneInfo("Asia/Tokyo")).strftime("%Y-%m-%d %H:%M:%S")
    html = text(client, "/schedules?tz=Asia/Tokyo")
    assert "Last fired (Asia/Tokyo)" in html and f'<time datetime="{fired}">{tokyo}</time>' in html
    # The triggers' own page says once that its times are UTC.
    page = text(client, "/triggers")
    assert "Times are UTC." in page and f"<td>{fired[:19].replace('T', ' ')}</td>" in page


def test_an_unknown_viewer_zone_is_said_and_not_remembered(dash) -> None:
    client, _ = dash
    html = text(client, "/schedules?tz=Nowhere/Land")
    assert "unknown time zone &#39;Nowhere/Land&#39;: times are shown in UTC" in html
    assert 'name="tz" value="UTC"' in html and 'name="tz" value="UTC"' in text(client, "/schedules")
    # A folder of the zone database is no zone either.
    assert "unknown time zone &#39;Europe&#39;: times are shown in UTC" in text(client, "/schedules?tz=Europe")


def test_a_time_with_no_wall_time_in_the_viewers_zone_is_shown_in_utc(dash) -> None:
    client, kernel = dash
    kernel.agents.spawn('name = "far"\n')
    job = kernel.cron.create({"name": "last day", "agent_id": "far",
                              "schedule": {"kind": "at", "at": "9999-12-31T23:00:00Z"},
                              "action": {"kind": "agent_turn", "message": "x"}})
    for path in ("/schedules?tz=Asia/Tokyo", f"/schedules/{job['id']}"):
        assert '<time datetime="9999-12-31T23:00:00Z">9999-12-31 23:00:00 UTC</time>' in text(client, path)


def test_the_run_history_keeps_and_answers_the_last_200_runs(dash) -> None:
    client, kernel = dash
    kernel.agents.spawn('name = "busy"\n')
    job = kernel.cron.create({"name": "busy", "agent_id": "busy", "schedule": {"kind": "every", "every_secs": 3600},
                              "action": {"kind": "agent_turn", "message": "tick"}, "enabled": False})
    for i in range(205):
        kernel.cron.store.add_run(job["id"], "test", None, "skipped", f"run {i}")
    runs = client.get(f"/api/cron/jobs/{job['id']}/runs", environ_base=LOCAL).get_json()
    assert len(runs) == 200 and {r["reason"] for r in runs} == {f"run {i}" for i in range(5, 205)}
    assert runs[0]["reason"] == "run 204"


def test_many_jobs_and_triggers_are_paged_under_the_page_budget(dash) -> None:
    client, kernel = dash
    name = "an-agent-with-a-rather-long-name-for-the-rows"
    kernel.agents.spawn(f'name = "{name}"\n')
    for i in range(45):
        kernel.cron.create({"name": f"a job with a long name: number {i:02d}", "agent_id": name,
                            "schedule": {"kind": "cron", "expr": "0 9 * * 1-5", "tz": "America/Argentina/Buenos_Aires"},
                            "action": {"kind": "agent_turn", "message": "x"}, "max_runs_per_day": 5,
                            "max_cost_usd_per_day": 0.5, "enabled": False})
        if i < 35:
            kernel.triggers.create({"agent_id": name, "prompt_template": "y" * 200 + " {{event}}",
                                    "pattern": {"channel_message": {"channel": "telegram", "match": f"(?i)urgent {i}"}},
                                    "max_runs_per_day": 5, "max_cost_usd_per_day": 0.5, "rate_limit_per_minute": 3})
    # 60 KB with the stylesheet and the scripts.
    budget = 60_000 - sum(len(client.get(f"/static/{f}").data) for f in ("app.css", "app.js"))
    for path, shown, pager in (("/schedules", "number 19<", "1–20 of 45 (page 1 of 3)"),
                               ("/schedules?page=3", "number 44<", "41–45 of 45 (page 3 of 3)"),
                               ("/schedules?page=9", "number 44<", "41–45 of 45 (page 3 of 3)"),
                               ("/triggers", "urgent 29", "1–30 of 35 (page 1 of 2)"),
                               ("/triggers?page=2", "urgent 34", "31–35 of 35 (page 2 of 2)")):
        html = text(client, path)
        assert len(html.encode()) < budget and shown in html and pager in html, (path, len(html.encode()))
    html = text(client, "/schedules")
    assert "number 20<" not in html and html.count('<tr id="trigger-') == 10 and ">All 35 triggers</a>" in html


def test_past_100_agents_and_workflows_the_forms_take_typed_names(dash) -> None:
    client, kernel = dash
    for i in range(260):
        kernel.agents.spawn(f'name = "agent-with-a-long-name-{i:04d}"\n')
    for i in range(110):
        kernel.workflows.create({"name": f"flow-with-a-long-name-{i:03d}",
                                 "steps": [{"name": "one", "agent_name": "agent-with-a-long-name-0000",
                                            "prompt": "p"}]})
    budget = 60_000 - sum(len(client.get(f"/static/{f}").data) for f in ("app.css", "app.js"))
    for path, box in (("/schedules", 'id="job-agent" name="agent_id" value=""'),
                      ("/triggers", 'id="trigger-agent" name="agent_id" value=""')):
        html = text(client, path)
        assert len(html.encode()) < budget and box in html, (path, len(html.encode()))
    assert 'id="job-workflow" name="workflow_id" value=""' in text(client, "/schedules")
    token = csrf(text(client, "/schedules"))
    r = client.post("/schedules", data={"csrf_token": token, "name": "by names", "agent_id": "",
                                        "kind": "every", "every_secs": "3600", "workflow_id": "flow-with-a-long-name-107",
                                        "input": "go"}, environ_base=LOCAL)
    [job] = kernel.cron.list()
    flow = [w for w in kernel.workflows.list() if w["name"] == "flow-with-a-long-name-107"][0]
    assert r.status_code == 303 and job["action"] == {"kind": "workflow_run", "workflow_id": flow["id"], "input": "go"}
    r = client.post("/schedules", data={"csrf_token": token, "name": "typo", "agent_id": "", "kind": "every",
                                        "every_secs": "3600", "workflow_id": "no-such-flow"}, environ_base=LOCAL)
    page = r.get_data(as_text=True)
    assert r.status_code == 400 and "action.workflow_id: no workflow &#39;no-such-flow&#39;" in page
    assert 'id="job-workflow" name="workflow_id" value="no-such-flow"' in page, "what was typed is kept"
    r = client.post("/triggers", data={"csrf_token": token, "agent_id": "agent-with-a-long-name-0201",
                                       "kind": "content_match", "pattern": "deploy", "prompt_template": "{{event}}"},
                    environ_base=LOCAL)
    [trigger] = kernel.triggers.list()
    assert r.status_code == 303 and trigger["agent_id"] == kernel.agents.by_name("agent-with-a-long-name-0201").id


def test_a_job_is_edited_from_its_page(dash) -> None:
    client, kernel = dash
    kernel.agents.spawn('name = "editor"\n')
    kernel.agents.spawn('name = "other"\n')
    job = kernel.cron.create({"name": "nightly", "agent_id": "editor",
                              "schedule": {"kind": "cron", "expr": "0 2 * * *", "tz": "Europe/Berlin"},
                              "action": {"kind": "agent_turn", "message": "Tidy <up>."}, "max_runs_per_day": 3})
    html = text(client, f"/schedules/{job['id']}")
    form = re.search(r'<form method="post" action="/schedules/[^"]+/edit" class="stack" id="job-form">.*?</form>',
                     html, re.S).group(0)
    assert ('value="nightly"' in form and '<option value="editor" selected>' in form and 'value="0 2 * * *"' in form
            and 'value="Europe/Berlin"' in form and ">Tidy &lt;up&gt;.</textarea>" in form and 'value="3"' in form)
    edited = {"csrf_token": csrf(html), "name": "nightly", "agent_id": "other", "kind": "every", "every_secs": "7200",
              "message": "Tidy again.", "max_runs_per_day": "", "max_cost_usd_per_day": "0.5", "catch_up": "once"}
    r = client.post(f"/schedules/{job['id']}/edit", data={**edited, "every_secs": "0"}, environ_base=LOCAL)
    page = r.get_data(as_text=True)
    assert r.status_code == 400 and "schedule.every_secs: must be an integer from 1" in page
    assert 'id="job-every" name="every_secs" value="0"' in page and "Tidy again.</textarea>" in page
    assert kernel.cron.get(job["id"])["schedule"]["kind"] == "cron", "a refused edit changes nothing"
    r = client.post(f"/schedules/{job['id']}/edit", data=edited, environ_base=LOCAL)
    saved = kernel.cron.get(job["id"])
    assert r.status_code == 303 and r.headers["Location"].startswith(f"/schedules/{job['id']}?note=")
    due = saved["next_run_at"]
    assert note(client, r) == f"cron job nightly saved; next run {due[:10]} {due[11:19]} UTC"
    assert (saved["agent_id"], saved["schedule"], saved["action"]) == (
        kernel.agents.by_name("other").id, {"kind": "every", "every_secs": 7200},
        {"kind": "agent_turn", "message": "Tidy again."})
    assert (saved["max_runs_per_day"], saved["max_cost_usd_per_day"], saved["catch_up"]) == (None, 0.5, "once")
    assert client.post("/schedules/00000000-0000-0000-0000-000000000000/edit", data=edited,
                       environ_base=LOCAL).status_code == 404
