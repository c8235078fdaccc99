"""Cron jobs and triggers from the dashboard in headless Chromium, at desktop and phone
widths, without touching the API: add a job (a refusal first, said above the form), run it
now and read its history, pause and resume it, delete it; add a trigger and disable it.
The page never scrolls sideways and no script fails."""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

from browser import DESKTOP, PHONE, AVAILABLE, Browser, needs_browser, web  # noqa: F401
from conftest import LLM_ENV, llm_config
from support import Daemon, make_home

pytestmark = needs_browser

if AVAILABLE:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

WIDTHS = {"desktop": DESKTOP, "phone": PHONE}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    home = make_home(tmp_path_factory.mktemp("schedules-browser"), llm_config(fake_llm))
    d = Daemon(home, env_extra=LLM_ENV).start()
    yield d
    d.stop()


@pytest.fixture(params=list(WIDTHS))
def page(request, web: Browser, daemon: Daemon) -> Iterator[Browser]:
    web.base = daemon.url
    web.driver(WIDTHS[request.param])
    web.open("/schedules")
    web.chrome.get_log("browser")
    yield web
    problems = [e for e in web.chrome.get_log("browser") if e["level"] == "SEVERE" and e.get("source") != "network"]
    assert problems == []
    assert web.page_width() <= WIDTHS[request.param], "the page scrolls sideways"


def fill(web: Browser, element_id: str, text: str) -> None:
    box = web.chrome.find_element(By.ID, element_id)
    box.clear()
    box.send_keys(text)


def submit(web: Browser, button_id: str = "", button=None) -> None:
    button = button or web.chrome.find_element(By.ID, button_id)
    web.click_and_wait(button)


def note(web: Browser) -> list[str]:
    return web.note()


def button(web: Browser, label: str):
    return web.chrome.find_element(By.XPATH, f"//button[normalize-space()='{label}']")


def test_a_job_from_the_form_run_paused_resumed_and_deleted(page: Browser, daemon: Daemon) -> None:
    web = page
    agent = f"b-{uuid.uuid4().hex[:6]}"
    assert daemon.post("/api/agents", json={"manifest_toml": f'name = "{agent}"\n'}).status_code == 201
    web.open("/schedules")
    job = f"report {uuid.uuid4().hex[:6]}"
    fill(web, "job-name", job)
    Select(web.chrome.find_element(By.ID, "job-agent")).select_by_visible_text(agent)
    fill(web, "job-expr", "0 9 * * 1-5")
    fill(web, "job-tz", "Mars/Olympus")
    fill(web, "job-message", "[[reply:the report]]")
    submit(web, "job-submit")
    assert web.chrome.find_element(By.ID, "job-error").text == "schedule.tz: unknown time zone 'Mars/Olympus'"
    assert web.chrome.find_element(By.ID, "job-name").get_attribute("value") == job  # what was typed stays
    fill(web, "job-tz", "Europe/Berlin")
    submit(web, "job-submit")
    [line] = note(web)
    assert line.startswith(f"cron job {job} created; next run ") and line.endswith(" UTC")
    assert web.chrome.find_element(By.TAG_NAME, "h1").text.startswith(job)

    submit(web, button=button(web, "Run now"))
    assert note(web) == [f"cron job {job} started; its result shows in the history"]
    web.wait(lambda d: (d.refresh() or True) and "the report" in d.find_element(By.ID, "history").text)
    submit(web, button=button(web, "Disable"))
    assert note(web) == [f"cron job {job} paused; nothing fires until it is enabled again"]
    submit(web, button=button(web, "Enable"))
    assert note(web)[0].startswith(f"cron job {job} resumed; next run ")
    web.click_and_wait(web.chrome.find_element(By.LINK_TEXT, "Delete…"))
    assert web.chrome.find_element(By.TAG_NAME, "h1").text == f"Delete cron job {job}?"
    assert [j["name"] for j in daemon.get("/api/cron/jobs").json()].count(job) == 1, "the link alone deletes nothing"
    submit(web, button=button(web, f"Delete {job}"))
    assert note(web) == [f"cron job {job} deleted, with its history"]
    assert not web.chrome.find_elements(By.LINK_TEXT, job)
    assert [j for j in daemon.get("/api/cron/jobs").json() if j["name"] == job] == []


def test_a_trigger_from_the_form_then_disabled(page: Browser, daemon: Daemon) -> None:
    web = page
    agent = f"t-{uuid.uuid4().hex[:6]}"
    assert daemon.post("/api/agents", json={"manifest_toml": f'name = "{agent}"\n'}).status_code == 201
    web.open("/triggers")
    Select(web.chrome.find_element(By.ID, "trigger-agent")).select_by_visible_text(agent)
    Select(web.chrome.find_element(By.ID, "trigger-kind")).select_by_value("content_match")
    fill(web, "trigger-pattern", "deploy")
    fill(web, "trigger-template", "Look: {{event}}")
    fill(web, "trigger-runs-cap", "none")
    submit(web, "trigger-submit")
    assert "max_runs_per_day: must be an integer" in web.chrome.find_element(By.ID, "trigger-error").text
    fill(web, "trigger-runs-cap", "3")
    submit(web, "trigger-submit")
    assert note(web) == [f"trigger created for {agent}"]
    [made] = daemon.get("/api/triggers", params={"agent_id": agent}).json()
    assert (made["pattern"], made["prompt_template"], made["max_runs_per_day"]) == (
        {"content_match": "deploy"}, "Look: {{event}}", 3)
    row = web.chrome.find_element(By.ID, f"trigger-{made['id']}")
    submit(web, button=row.find_element(By.XPATH, ".//button[normalize-space()='Disable']"))
    assert note(web) == ["trigger disabled"]
    assert daemon.get(f"/api/triggers/{made['id']}").json()["enabled"] is False
