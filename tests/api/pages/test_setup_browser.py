"""The dashboard's own setup and management flows in headless Chromium, at desktop and
phone widths: a fresh home to a streamed reply without the API or CLI, spawning from the
form, editing an agent, the audit filters, the settings page and the live log."""

from __future__ import annotations

import os
import stat
import uuid
from typing import Iterator

import pytest

from browser import DESKTOP, PHONE, AVAILABLE, Browser, needs_browser, web  # noqa: F401
from support import FAST_API, Daemon, make_home

pytestmark = needs_browser

if AVAILABLE:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    """A daemon on an empty home: no provider key anywhere."""
    home = make_home(tmp_path_factory.mktemp("firstrun"), FAST_API)
    blank = {name: "" for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
    daemon = Daemon(home, env_extra=blank).start()
    yield daemon
    daemon.stop()


def note(web: Browser) -> str:
    return web.wait(lambda d: d.find_element(By.ID, "page-note")).text


def fill(driver, element_id: str, text: str) -> None:
    box = driver.find_element(By.ID, element_id)
    box.clear()
    box.send_keys(text)


def click(web: Browser, element_id: str) -> None:
    """Submit through the button and wait for the page the 303 leads to."""
    button = web.chrome.find_element(By.ID, element_id)
    old = web.chrome.find_element(By.TAG_NAME, "html")
    button.click()
    web.wait(lambda d: old.id != d.find_element(By.TAG_NAME, "html").id)


def spawn_from_form(web: Browser, name: str, mode: str = "Auto") -> None:
    web.open("/agents")
    fill(web.chrome, "spawn-name", name)
    Select(web.chrome.find_element(By.ID, "spawn-profile")).select_by_visible_text("minimal")
    Select(web.chrome.find_element(By.ID, "spawn-mode")).select_by_visible_text(mode)
    fill(web.chrome, "spawn-prompt", "You answer briefly.")
    click(web, "spawn-submit")


def last_reply(driver) -> str:
    replies = driver.find_elements(By.CSS_SELECTOR, "#messages li.assistant .text")
    return replies[-1].text if replies else ""


def test_first_run_to_a_streamed_reply(web: Browser, fresh: Daemon, fake_llm) -> None:
    web.base = fresh.url
    driver = web.driver(DESKTOP)
    web.open("/")
    assert driver.current_url == f"{fresh.url}/setup", "a fresh daemon opens on the setup page"
    assert "has no API key" in driver.find_element(By.ID, "setup-needed").text
    # A local OpenAI-compatible server (the fake LLM) as vLLM: its URL, no key.
    Select(driver.find_element(By.ID, "setup-provider")).select_by_value("vllm")
    fill(driver, "setup-url", fake_llm.openai_base)
    click(web, "setup-test")
    assert f"vllm: base URL set to {fake_llm.openai_base}" in note(web)
    assert "vllm: reached in" in note(web)
    assert Select(driver.find_element(By.ID, "default-provider")).first_selected_option.get_attribute("value") == "vllm"
    fill(driver, "default-model-name", "local-model")
    click(web, "setup-default")
    assert driver.current_url.startswith(f"{fresh.url}/agents")
    assert "default model set to vllm/local-model" in note(web)
    name = f"first-{uuid.uuid4().hex[:6]}"
    spawn_from_form(web, name)
    assert note(web) == f"agent {name} spawned", "a provider that works: no warning"
    assert driver.find_element(By.TAG_NAME, "h1").text.startswith(name)
    box = driver.find_element(By.ID, "message")
    box.send_keys("[[chunks:6]] [[pace:80]]")
    driver.find_element(By.ID, "send").click()
    web.wait(lambda d: last_reply(d).startswith("w1 ") and "w6" not in last_reply(d))
    web.wait(lambda d: last_reply(d) == "w1 w2 w3 w4 w5 w6")
    # The setup is no longer forced; the nav keeps its link.
    web.open("/")
    assert driver.find_element(By.TAG_NAME, "h1").text == "Overview"
    assert driver.find_element(By.CSS_SELECTOR, "nav a[href='/setup']")
    config = (fresh.home / "config.toml").read_text()
    assert '[default_model]\nprovider = "vllm"\nmodel = "local-model"' in config
    assert "[api]" in config, "the rest of config.toml is kept"


def test_key_edit_audit_settings_at_phone_width(web: Browser, fresh: Daemon, fake_llm) -> None:
    web.base = fresh.url
    driver = web.driver(PHONE)
    try:
        # A key through the setup form: saved (0600), never shown back, tested against the fake LLM.
        web.open("/setup")
        Select(driver.find_element(By.ID, "setup-provider")).select_by_value("openai")
        fill(driver, "setup-key", "sk-phone-secret-123")
        fill(driver, "setup-url", fake_llm.openai_base)
        click(web, "setup-test")
        assert "openai: key saved" in note(web) and "openai: reached in" in note(web)
        assert "sk-phone-secret-123" not in driver.page_source
        secrets = fresh.home / "secrets.env"
        assert "OPENAI_API_KEY=sk-phone-secret-123" in secrets.read_text()
        assert stat.S_IMODE(os.stat(secrets).st_mode) == 0o600
        assert web.page_width() <= PHONE
        name = f"phone-{uuid.uuid4().hex[:6]}"
        spawn_from_form(web, name, mode="Manual")
        assert driver.find_element(By.ID, "agent-mode").text == "Manual"
        assert web.page_width() <= PHONE
        # Edit: the model, then the manifest.
        driver.find_element(By.ID, "edit-agent").click()
        web.wait(lambda d: d.find_elements(By.ID, "edit-model"))
        assert web.page_width() <= PHONE
        fill(driver, "edit-model", "openai/gpt-4o")
        click(web, "save-model")
        assert note(web) == f"agent {name}: model set to openai/gpt-4o"
        agent_id = driver.current_url.split("/agents/")[1].split("?")[0]
        assert fresh.get(f"/api/agents/{agent_id}").json()["model"] == {"provider": "openai", "model": "gpt-4o"}
        web.open(f"/agents/{agent_id}/edit")
        manifest = driver.find_element(By.ID, "manifest_toml")
        text = manifest.get_attribute("value")
        assert 'provider = "openai"' in text and 'model = "gpt-4o"' in text
        manifest.clear()
        manifest.send_keys(text.replace(f'name = "{name}"', f'name = "{name}"\ndescription = "edited in the browser"'))
        click(web, "save-manifest")
        assert note(web) == f"agent {name}: manifest saved"
        assert fresh.get(f"/api/agents/{agent_id}").json()["description"] == "edited in the browser"
        # A rename is refused on the page, which keeps what was typed.
        web.open(f"/agents/{agent_id}/edit")
        manifest = driver.find_element(By.ID, "manifest_toml")
        manifest.clear()
        manifest.send_keys('name = "someone-else"')
        click(web, "save-manifest")
        assert "keeps its name" in driver.find_element(By.ID, "edit-error").text
        assert driver.find_element(By.ID, "manifest_toml").get_attribute("value") == 'name = "someone-else"'
        # Audit: this agent's events, by action.
        web.open("/audit")
        fill(driver, "audit-agent", name)
        fill(driver, "audit-action", "agent.")
        old = driver.find_element(By.TAG_NAME, "html")
        driver.find_element(By.CSS_SELECTOR, "#audit-filters button").click()
        web.wait(lambda d: old.id != d.find_element(By.TAG_NAME, "html").id)
        rows = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#audit-table tbody tr td:nth-child(2)")]
        assert rows == ["agent.update", "agent.update", "agent.spawn"]
        assert web.page_width() <= PHONE
        # Settings: shown masked, reloaded by the button.
        web.open("/settings")
        assert "sk-phone-secret-123" not in driver.page_source
        assert web.page_width() <= PHONE
        click(web, "reload")
        assert note(web).startswith("configuration reloaded: default_model, provider_urls")
    finally:
        web.driver(DESKTOP)


def test_audit_time_filter_and_live_log(web: Browser, fresh: Daemon) -> None:
    web.base = fresh.url
    driver = web.driver(DESKTOP)
    web.open("/audit?since=2999-01-01T00:00")
    assert driver.find_element(By.CSS_SELECTOR, "main p.empty").text == "No event matches."
    spawned = f"audited-{uuid.uuid4().hex[:6]}"
    assert fresh.post("/api/agents", json={"manifest_toml": f'name = "{spawned}"\n'}).status_code == 201
    web.open(f"/audit?action=agent.&until=2999-01-01T00:00&agent={spawned}")
    cells = [(row.find_element(By.CSS_SELECTOR, "td:nth-child(2)").text,
              row.find_element(By.CSS_SELECTOR, "td:nth-child(3)").text)
             for row in driver.find_elements(By.CSS_SELECTOR, "#audit-table tbody tr")]
    assert cells == [("agent.spawn", spawned)]
    # Edit and settings at desktop width too.
    agent_id = fresh.get("/api/agents").json()
    agent_id = next(a["id"] for a in agent_id if a["name"] == spawned)
    web.open(f"/agents/{agent_id}/edit")
    fill(driver, "edit-model", "openai/gpt-4o-mini")
    click(web, "save-model")
    assert note(web).startswith(f"agent {spawned}: model set to openai/gpt-4o-mini")
    web.open("/settings")
    assert driver.find_element(By.ID, "settings-table").is_displayed()
    click(web, "reload")
    assert note(web).startswith("configuration reloaded: ")
    assert web.page_width() <= DESKTOP
    web.open("/logs")
    web.wait(lambda d: d.find_element(By.ID, "log-status").text.startswith("Live"))
    name = f"logged-{uuid.uuid4().hex[:6]}"
    assert fresh.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n'}).status_code == 201
    # The daemon's "spawned agent" line arrives without a reload.
    web.wait(lambda d: f"spawned agent {name}" in d.find_element(By.ID, "log-lines").text)
