"""The dashboard in a real headless Chromium against the real daemon and the fake LLM.

Needs the Debian packages `chromium` and `chromium-driver` (selenium comes with the
test extra). Without them every test here is skipped, saying so.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from conftest import LLM_ENV, llm_config
from support import FAST_API, Daemon, make_home

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = Path(os.environ.get("AGENTD_SCREENSHOTS", "/tmp"))

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and os.path.exists(CHROMEDRIVER)),
    reason="headless browser tests need Chromium and chromedriver: apt-get install chromium chromium-driver")

if CHROMIUM and os.path.exists(CHROMEDRIVER):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait


@pytest.fixture(scope="module")
def browser() -> Iterator["webdriver.Chrome"]:
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def spawn(d: Daemon, extra: str = "") -> str:
    name = f"b-{uuid.uuid4().hex[:8]}"
    toml = f'name = "{name}"\ndescription = "browser test"\n{extra}\n[model]\nprovider = "default"\nmodel = "default"\n'
    r = d.post("/api/agents", json={"manifest_toml": toml})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def wait(driver, seconds: float = 15):
    return WebDriverWait(driver, seconds, poll_frequency=0.05)


def send(driver, text: str) -> None:
    box = driver.find_element(By.ID, "message")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.ID, "send").click()


def last_reply(driver) -> str:
    replies = driver.find_elements(By.CSS_SELECTOR, "#messages li.assistant .text")
    return replies[-1].text if replies else ""


def test_chat_streams_reply_without_reload(browser, agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    browser.get(f"{d.url}/agents/{agent_id}")
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("b-")
    # A page load would wipe this marker: it proves the reply arrives in the same page.
    browser.execute_script("window.agentdMarker = 'same page';")
    send(browser, "[[chunks:8]] [[pace:150]]")
    # Token by token: part of the reply is on screen before the rest has arrived.
    wait(browser).until(lambda b: last_reply(b).startswith("w1 ") and "w8" not in last_reply(b))
    partial = last_reply(browser)
    wait(browser).until(lambda b: last_reply(b) == "w1 w2 w3 w4 w5 w6 w7 w8")
    assert partial != last_reply(browser)
    wait(browser).until(EC.text_to_be_present_in_element((By.ID, "chat-status"), "done"))
    assert browser.execute_script("return window.agentdMarker") == "same page"
    # The user's message is shown too, and the server kept both turns.
    users = browser.find_elements(By.CSS_SELECTOR, "#messages li.user .text")
    assert users[-1].text == "[[chunks:8]] [[pace:150]]"
    session = d.get(f"/api/agents/{agent_id}/session").json()
    assert [m["content"] for m in session["messages"]][-1] == "w1 w2 w3 w4 w5 w6 w7 w8"
    browser.save_screenshot(str(SHOTS / "agentd-dashboard-chat.png"))
    # After a reload the server renders the same history (no JS needed to see it).
    browser.refresh()
    assert last_reply(browser) == "w1 w2 w3 w4 w5 w6 w7 w8"


def test_chat_shows_error_inline(browser, agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    browser.get(f"{d.url}/agents/{agent_id}")
    send(browser, "[[fail:400]]")
    wait(browser).until(EC.text_to_be_present_in_element((By.ID, "chat-status"), "error"))
    errors = browser.find_elements(By.CSS_SELECTOR, "#messages li.assistant .error")
    assert errors and errors[-1].text


def test_approve_pending_tool_call_in_page(browser, agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d, 'profile = "coding"')
    assert d.put(f"/api/agents/{agent_id}/mode", json={"mode": "Manual"}).status_code == 200
    browser.get(f"{d.url}/agents/{agent_id}")
    assert browser.find_element(By.ID, "agent-mode").text == "Manual"
    send(browser, '[[tool:file_write {"path": "approved.txt", "content": "ok"}]]')
    button = wait(browser).until(EC.element_to_be_clickable(
        (By.CSS_SELECTOR, "#live-approvals button[data-decision=approve]")))
    card = browser.find_element(By.CSS_SELECTOR, "#live-approvals .approval")
    assert "file_write" in card.text and "approved.txt" in card.text
    assert [a["tool"] for a in d.get("/api/approvals").json() if a["agent_id"] == agent_id] == ["file_write"]
    browser.save_screenshot(str(SHOTS / "agentd-dashboard-approval.png"))
    button.click()
    wait(browser).until(lambda b: "wrote 2 bytes" in last_reply(b))
    tools = browser.find_elements(By.CSS_SELECTOR, "#messages li.assistant details.tool")
    assert tools and "file_write" in tools[-1].text
    assert not [a for a in d.get("/api/approvals").json() if a["agent_id"] == agent_id]


def test_reject_from_approvals_page(browser, agent_daemon) -> None:
    """The server-rendered /approvals page decides too (plain form post, 303 back)."""
    d = agent_daemon
    agent_id = spawn(d, 'profile = "coding"')
    d.put(f"/api/agents/{agent_id}/mode", json={"mode": "Manual"})
    browser.get(f"{d.url}/agents/{agent_id}")
    send(browser, '[[tool:file_write {"path": "rejected.txt", "content": "no"}]]')
    wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#live-approvals .approval")))
    browser.switch_to.new_window("tab")
    try:
        browser.get(f"{d.url}/approvals")
        row = browser.find_element(By.XPATH, f"//tr[td/a[contains(@href, '{agent_id}')]]")
        row.find_element(By.XPATH, ".//button[text()='Reject']").click()
        # The 303 brought a fresh page. Chromium may answer the staleness probe of a node of the
        # page being replaced with "unhandled inspector error" rather than "stale": ask again.
        WebDriverWait(browser, 15, poll_frequency=0.05,
                      ignored_exceptions=(WebDriverException,)).until(EC.staleness_of(row))
        assert browser.current_url.startswith(f"{d.url}/approvals?note=")
        assert browser.find_element(By.ID, "page-note").text.endswith(": file_write rejected")
        assert agent_id not in browser.page_source
    finally:
        browser.close()
        browser.switch_to.window(browser.window_handles[0])
    wait(browser).until(lambda b: "denied" in last_reply(b))


def test_phone_width_layout(browser, agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    d.post(f"/api/agents/{agent_id}/message", json={"message": "hello from a phone"})
    browser.set_window_size(390, 844)
    try:
        browser.get(f"{d.url}/agents/{agent_id}")
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= 390, f"page is {width}px wide on a 390px screen"
        box = browser.find_element(By.ID, "message").rect
        assert box["width"] > 250
        browser.save_screenshot(str(SHOTS / "agentd-dashboard-phone.png"))
        browser.get(f"{d.url}/usage")
        assert browser.find_element(By.CSS_SELECTOR, "svg.bars rect.bar")
        browser.save_screenshot(str(SHOTS / "agentd-dashboard-usage-phone.png"))
        # Wide tables scroll inside their box; the page itself never gets wider than the screen.
        for path in ("/", "/agents", "/models", "/providers", "/approvals", "/workflows", "/channels"):
            browser.get(f"{d.url}{path}")
            width = browser.execute_script("return document.documentElement.scrollWidth")
            assert width <= 390, f"{path} is {width}px wide on a 390px screen"
    finally:
        browser.set_window_size(1280, 900)


@pytest.fixture(scope="module")
def keyed_daemon(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    home = make_home(tmp_path_factory.mktemp("keyed"), 'api_key = "browser-key-123"\n' + llm_config(fake_llm))
    daemon = Daemon(home, api_key="browser-key-123", env_extra=LLM_ENV).start()
    yield daemon
    daemon.stop()


def test_login_with_key_then_chat(browser, keyed_daemon) -> None:
    d = keyed_daemon
    agent_id = spawn(d)
    browser.delete_all_cookies()
    browser.get(f"{d.url}/agents/{agent_id}")
    assert browser.current_url.startswith(f"{d.url}/login")
    browser.find_element(By.ID, "api_key").send_keys("wrong-key")
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    # (the refusal is a new page: wait for it, not for the form just submitted)
    error = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, ".error")))
    assert "invalid API key" in error.text
    browser.find_element(By.ID, "api_key").send_keys("browser-key-123")
    browser.find_element(By.CSS_SELECTOR, "main form button[type=submit]").click()
    # Back where the redirect started, signed in.
    wait(browser).until(EC.url_to_be(f"{d.url}/agents/{agent_id}"))
    cookie = browser.get_cookie("agentd_session")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert "browser-key-123" not in cookie["value"]
    # The cookie authenticates the page's own SSE call to the JSON API.
    send(browser, "[[reply:hello through the cookie]]")
    wait(browser).until(lambda b: last_reply(b) == "hello through the cookie")
    browser.find_element(By.CSS_SELECTOR, "header form button").click()
    wait(browser).until(lambda b: b.current_url.startswith(f"{d.url}/login"))
    browser.get(f"{d.url}/agents")
    assert browser.current_url.startswith(f"{d.url}/login")
