"""The Schedules page through Flask's test client over a real kernel: jobs with their next due
time in the viewer's zone, last result, caps and state; enable, disable, run now and delete
as CSRF-protected forms answered with 303; one job's history."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from agentd.api import create_app
from agentd.config import parse_config
from agentd.kernel import Kernel
from support import with_test_db

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
    assert r.status_code == 303 and r.headers["Location"].endswith("/schedules")
    assert kernel.cron.get(job["id"])["enabled"] is False
    r = client.post(f"/schedules/{job['id']}/enable", data={"csrf_token": token, "back": "job"}, environ_base=LOCAL)
    assert r.status_code == 303 and r.headers["Location"].endswith(f"/schedules/{job['id']}")
    assert kernel.cron.get(job["id"])["enabled"] is True
    r = client.post(f"/schedules/{job['id']}/run", data={"csrf_token": token}, environ_base=LOCAL)
    assert r.status_code == 303
    deadline = time.monotonic() + 10
    while kernel.cron.runs(job["id"])[0]["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    page = text(client, f"/schedules/{job['id']}")
    assert "good &lt;i&gt;morning&lt;/i&gt;" in page and "run now" in page and "History" in page
    assert ">ok</span>" in text(client, "/schedules")
    r = client.post(f"/schedules/{job['id']}/delete", data={"csrf_token": token}, environ_base=LOCAL)
    assert r.status_code == 303 and kernel.cron.list() == []
    assert client.get(f"/schedules/{job['id']}", environ_base=LOCAL).status_code == 404
