"""Managing workflows, memory and chat attachments in a real headless Chromium, at a desktop
(1280x900) and a phone (390x844) width, against the real daemon and the fake LLM.

Needs the Debian packages `chromium` and `chromium-driver` (selenium comes with the test
extra); without them every test here is skipped, saying so.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from support import Daemon

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTHS = {"desktop": (1280, 900), "phone": (390, 844)}

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and os.path.exists(CHROMEDRIVER)),
    reason="headless browser tests need Chromium and chromedriver: apt-get install chromium chromium-driver")

if CHROMIUM and os.path.exists(CHROMEDRIVER):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait


@pytest.fixture(scope="module")
def driver() -> Iterator["webdriver.Chrome"]:
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    chrome = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    chrome.set_page_load_timeout(30)
    yield chrome
    chrome.quit()


@pytest.fixture(params=list(WIDTHS))
def browser(request, driver):
    driver.set_window_size(*WIDTHS[request.param])
    yield driver
    # Whatever the test did, no script failed on the way (the CSP refuses inline script too); a
    # refused form's 4xx page is logged as a network error, which is what it should be.
    problems = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and e.get("source") != "network"]
    assert problems == []


def wait(driver, seconds: float = 15):
    # The page a form leaves may still be shown when the wait starts: an element found on it
    # goes stale as the next page loads, and is looked for again there.
    return WebDriverWait(driver, seconds, poll_frequency=0.05, ignored_exceptions=[StaleElementReferenceException])


def spawn(d: Daemon) -> tuple[str, str]:
    name = f"b-{uuid.uuid4().hex[:8]}"
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n[model]\nprovider = "default"\n'
                                                      'model = "default"\n'})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"], name


def fill(driver, name: str, text: str) -> None:
    box = driver.find_element(By.NAME, name)
    box.clear()
    box.send_keys(text)


def submit(driver, button_id: str) -> None:
    button = driver.find_element(By.ID, button_id)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
    button.click()


def note(driver) -> str:
    return wait(driver).until(lambda d: EC.visibility_of_element_located((By.ID, "page-note"))(d) and
                              d.find_element(By.ID, "page-note").text)


def states(driver) -> list[str]:
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#run-steps [data-role=state]")]


def test_create_with_an_error_at_the_step_run_with_live_steps_and_cancel(browser, agent_daemon) -> None:
    d = agent_daemon
    _, agent = spawn(d)
    browser.get(f"{d.url}/workflows/new")
    fill(browser, "name", f"wf-{agent}")
    fill(browser, "steps-0-name", "draft")
    fill(browser, "steps-0-agent_name", agent)
    fill(browser, "steps-0-prompt", "[[slow:0.8]] draft {{input}}")
    fill(browser, "steps-1-name", "polish")
    fill(browser, "steps-1-agent_name", agent)
    fill(browser, "steps-1-prompt", "polish {{summary}}")
    submit(browser, "wf-save")
    error = wait(browser).until(EC.visibility_of_element_located((By.ID, "step-1-error")))
    assert error.text == ("invalid workflow: step 2 ('polish'): prompt: '{{summary}}' is used before any earlier "
                          "step defines it (output_var)")
    # The message sits inside the refused step's fieldset, and what was typed is still there.
    assert error.find_element(By.XPATH, "..").get_attribute("id") == "step-1"
    assert browser.find_element(By.NAME, "steps-0-prompt").get_attribute("value") == "[[slow:0.8]] draft {{input}}"
    fill(browser, "steps-0-output_var", "summary")
    submit(browser, "wf-save")
    assert note(browser) == f"workflow wf-{agent} created"

    fill(browser, "input", "go")
    browser.find_element(By.CSS_SELECTOR, "#run button[type=submit]").click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "run-steps")))
    browser.execute_script("window.agentdMarker = 'same page';")
    # The first step is seen running, then both complete, all in the same page.
    wait(browser).until(lambda b: states(b)[0] == "running")
    wait(browser).until(lambda b: b.find_element(By.ID, "run-status").text == "completed")
    assert states(browser) == ["completed", "completed"]
    assert browser.find_element(By.ID, "run-output").text == "echo: polish echo: draft go"
    assert browser.execute_script("return window.agentdMarker") == "same page"
    assert not browser.find_element(By.ID, "cancel-form").is_displayed()

    # Cancel a run while its first step runs.
    browser.back()
    wait(browser).until(EC.presence_of_element_located((By.ID, "input")))
    fill(browser, "input", "[[slow:10]] stop")  # long enough to be cancelled on a loaded machine
    browser.find_element(By.CSS_SELECTOR, "#run button[type=submit]").click()
    wait(browser).until(lambda b: states(b) and states(b)[0] == "running")
    submit(browser, "cancel-run")
    assert note(browser) == "run cancelled"
    assert browser.find_element(By.ID, "run-status").text == "failed"
    assert states(browser) == ["failed", "not run"]
    assert browser.find_element(By.ID, "run-error").text == "step 1 ('draft') failed: run cancelled"


def test_memory_search_add_edit_delete(browser, agent_daemon) -> None:
    d = agent_daemon
    agent_id, _ = spawn(d)
    browser.get(f"{d.url}/agents/{agent_id}/memory")
    for text in ("The user drinks green tea every morning", "Volcanoes erupt molten rock"):
        fill(browser, "content", text)
        submit(browser, "memory-remember")
        assert note(browser) == "fragment remembered"
    fill(browser, "q", "what does the user like to drink")
    submit(browser, "memory-search")
    first = wait(browser).until(EC.visibility_of_element_located((By.CSS_SELECTOR, "#found-table tbody tr")))
    assert first.find_element(By.CSS_SELECTOR, ".text").text == "The user drinks green tea every morning"
    first.find_element(By.LINK_TEXT, "Edit").click()
    fill(browser, "content", "The user drinks coffee now")
    submit(browser, "fragment-save")
    assert note(browser) == "fragment saved"
    rows = browser.find_elements(By.CSS_SELECTOR, "#memory-table tbody tr")
    assert sorted(r.find_element(By.CSS_SELECTOR, ".text").text for r in rows) == [
        "The user drinks coffee now", "Volcanoes erupt molten rock"]
    coffee = next(r for r in rows if "coffee" in r.text)
    link = coffee.find_element(By.LINK_TEXT, "Delete…")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", link)
    link.click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "confirm")))
    assert len(d.get(f"/api/memory/agents/{agent_id}/memories").json()["memories"]) == 2, "the link deletes nothing"
    submit(browser, "confirm")
    assert note(browser) == "fragment deleted"
    listed = d.get(f"/api/memory/agents/{agent_id}/memories").json()["memories"]
    assert [m["content"] for m in listed] == ["Volcanoes erupt molten rock"]


def test_attach_a_file_to_a_chat_message(browser, agent_daemon, tmp_path: Path) -> None:
    d = agent_daemon
    agent_id, _ = spawn(d)
    notes = tmp_path / "notes.txt"
    notes.write_text("line one\nline two")
    browser.get(f"{d.url}/agents/{agent_id}")
    browser.execute_script("window.agentdMarker = 'same page';")
    browser.find_element(By.ID, "attachment").send_keys(str(notes))
    fill(browser, "message", "[[chunks:3]]")
    submit(browser, "send")
    wait(browser).until(EC.text_to_be_present_in_element((By.ID, "chat-status"), "done"))
    user = browser.find_elements(By.CSS_SELECTOR, "#messages li.user")[-1]
    assert user.find_element(By.CSS_SELECTOR, "a.attached").text == "attached: notes.txt"
    assert browser.find_elements(By.CSS_SELECTOR, "#messages li.assistant .text")[-1].text == "w1 w2 w3"
    assert browser.execute_script("return window.agentdMarker") == "same page"
    assert browser.find_element(By.ID, "attachment").get_attribute("value") == ""
    messages = d.get(f"/api/agents/{agent_id}/session").json()["messages"]
    assert messages[-2]["content"] == "[[chunks:3]]\n[attached file notes.txt]\nline one\nline two"
