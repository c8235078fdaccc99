"""Running the daemon from the dashboard in headless Chromium, at desktop and phone widths:
provider keys, base URL and test; the budget with its alert levels; killing an agent through
its confirmation; memory KV, the knowledge graph, export, import and consolidation; editing a
workflow; scoped API keys; a channel's configuration. One keyed daemon for the module, its
providers pointing at the fake LLM; every page is reached by logging in with the key."""

from __future__ import annotations

import json
import uuid
from typing import Iterator

import pytest

from browser import DESKTOP, PHONE, AVAILABLE, Browser, needs_browser, web  # noqa: F401
from conftest import LLM_ENV, llm_config
from support import Daemon, make_home

pytestmark = needs_browser

if AVAILABLE:
    from selenium.webdriver.common.by import By

ADMIN = "console-admin-key"
WIDTHS = {"desktop": DESKTOP, "phone": PHONE}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    home = make_home(tmp_path_factory.mktemp("console"), f'api_key = "{ADMIN}"\n' + llm_config(fake_llm))
    d = Daemon(home, api_key=ADMIN, env_extra={**LLM_ENV, "GROQ_API_KEY": ""}).start()
    yield d
    d.stop()


@pytest.fixture(params=list(WIDTHS))
def console(request, web: Browser, daemon: Daemon) -> Iterator[Browser]:
    """The browser at one width, logged in to `daemon`; afterwards, no script failed."""
    web.base = daemon.url
    web.driver(WIDTHS[request.param])
    web.open("/keys")
    if "/login" in web.chrome.current_url:
        fill(web.chrome, "api_key", ADMIN)
        submit(web, web.chrome.find_element(By.ID, "api_key"))
    web.chrome.get_log("browser")
    yield web
    # A refused form's 4xx page is logged as a network error, which is what it should be.
    problems = [e for e in web.chrome.get_log("browser") if e["level"] == "SEVERE" and e.get("source") != "network"]
    assert problems == []
    assert web.page_width() <= WIDTHS[request.param], "the page scrolls sideways"


def fill(driver, element_id: str, text: str) -> None:
    box = driver.find_element(By.ID, element_id)
    box.clear()
    box.send_keys(text)


def submit(web: Browser, element) -> None:
    """Submit the form `element` is in (through its button) and wait for the next page."""
    form = element if element.tag_name == "form" else element.find_element(By.XPATH, "ancestor::form")
    button = form.find_element(By.CSS_SELECTOR, "button[type=submit], button:not([type])")
    web.click_and_wait(button)


def note(web: Browser) -> list[str]:
    return web.note()


def row_of(web: Browser, text: str):
    """The provider table's row whose first cell is `text`."""
    for row in web.chrome.find_elements(By.CSS_SELECTOR, "#provider-table tbody tr"):
        if row.find_element(By.TAG_NAME, "td").text == text:
            return row
    raise AssertionError(f"no provider row {text!r}")


def spawn(d: Daemon) -> tuple[str, str]:
    name = f"c-{uuid.uuid4().hex[:8]}"
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n[model]\nprovider = "default"\n'
                                                      'model = "default"\n'})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"], name


def test_provider_key_url_test_and_remove(console: Browser, daemon: Daemon) -> None:
    web = console
    web.open("/providers")
    assert row_of(web, "Groq").find_element(By.CSS_SELECTOR, ".pill").text == "missing"
    secret = f"gsk-{uuid.uuid4().hex}"
    box = row_of(web, "Groq").find_element(By.NAME, "api_key")
    box.send_keys(secret)
    submit(web, box)
    assert note(web) == ["groq: key saved; test it with its Test button"]
    assert row_of(web, "Groq").find_element(By.CSS_SELECTOR, ".pill").text == "configured"
    assert secret not in web.chrome.page_source, "a saved key is never shown"
    assert auth(daemon, "groq") == "configured"

    # Test: the outcome is shown on the providers page after a redirect; a refresh shows the
    # page again, never a 405 and never a second test.
    submit(web, row_of(web, "OpenAI").find_element(By.XPATH, ".//button[text()='Test']"))
    assert "/providers/openai/test" not in web.chrome.current_url
    [line] = note(web)
    assert line.startswith("openai: reached in ") and line.endswith(" ms")
    web.chrome.refresh()
    assert web.chrome.find_element(By.TAG_NAME, "h1").text.startswith("Providers")
    assert note(web) == [line], "a refresh shows the same page, without running the test again"

    web.open("/providers#base-url")
    form = web.chrome.find_element(By.CSS_SELECTOR, "form[action='/providers/url']")
    form.find_element(By.CSS_SELECTOR, "select[name=provider] option[value=ollama]").click()
    url_box = form.find_element(By.NAME, "base_url")
    url_box.clear()
    url_box.send_keys("http://127.0.0.1:11999/v1")
    submit(web, form)
    assert note(web) == ["ollama: base URL set to http://127.0.0.1:11999/v1"]
    assert row_of(web, "Ollama").find_element(By.CSS_SELECTOR, ".url").text == "http://127.0.0.1:11999/v1"

    web.click_and_wait(row_of(web, "Groq").find_element(By.LINK_TEXT, "Remove…"))
    assert auth(daemon, "groq") == "configured", "the link alone removes nothing"
    submit(web, web.chrome.find_element(By.ID, "confirm"))
    assert note(web) == ["groq: key removed"]
    assert row_of(web, "Groq").find_element(By.CSS_SELECTOR, ".pill").text == "missing"
    assert auth(daemon, "groq") == "missing"


def auth(daemon: Daemon, provider: str) -> str:
    listing = daemon.get("/api/providers").json()
    rows = listing["providers"] if isinstance(listing, dict) else listing
    return next(p["auth_status"] for p in rows if p["id"] == provider)


def test_budget_limit_and_alert_levels(console: Browser, daemon: Daemon) -> None:
    web = console
    web.open("/usage")
    fill(web.chrome, "budget-limit", "12.5")
    fill(web.chrome, "budget-levels", "0.5, 90%, 1")
    submit(web, web.chrome.find_element(By.ID, "budget-levels"))
    assert note(web) == ["budget: limit set to $12.5 a month", "budget: alerts at 50%, 90%, 100% of the limit"]
    assert web.chrome.find_element(By.ID, "budget-levels").get_attribute("value") == "0.5, 0.9, 1.0"
    status = daemon.get("/api/budget").json()
    assert (status["limit_usd"], status["alert_levels"]) == (12.5, [0.5, 0.9, 1.0])

    fill(web.chrome, "budget-levels", "0.5, 2")
    submit(web, web.chrome.find_element(By.ID, "budget-levels"))
    assert web.chrome.find_element(By.ID, "page-note").get_attribute("class") == "error"
    assert note(web) == ["budget: alert levels '0.5, 2' must be 1 to 10 fractions of the limit, each above 0 "
                         "and at most 1 (e.g. 0.5, 0.8, 1)"]
    assert daemon.get("/api/budget").json()["alert_levels"] == [0.5, 0.9, 1.0], "a refused form changes nothing"

    fill(web.chrome, "budget-limit", "0")
    fill(web.chrome, "budget-levels", "0.8, 1")
    submit(web, web.chrome.find_element(By.ID, "budget-limit"))
    assert note(web) == ["budget: no limit", "budget: alerts at 80%, 100% of the limit"]
    assert daemon.get("/api/budget").json()["alert_levels"] == [0.8, 1.0]


def test_kill_an_agent_after_confirming(console: Browser, daemon: Daemon) -> None:
    web = console
    agent_id, name = spawn(daemon)
    web.open(f"/agents/{agent_id}")
    link = web.chrome.find_element(By.LINK_TEXT, "Kill agent…")
    web.chrome.execute_script("arguments[0].scrollIntoView({block: 'center'})", link)
    link.click()
    web.wait(lambda d: d.current_url.endswith(f"/agents/{agent_id}/kill"))
    assert daemon.get(f"/api/agents/{agent_id}").status_code == 200, "the link alone kills nothing"
    submit(web, web.chrome.find_element(By.XPATH, f"//button[text()='Kill {name}']"))
    assert note(web) == [f"agent {name} was killed"]
    assert daemon.get(f"/api/agents/{agent_id}").status_code == 404


def test_memory_kv_graph_export_import_consolidate(console: Browser, daemon: Daemon, tmp_path) -> None:
    web = console
    agent_id, name = spawn(daemon)
    web.open(f"/agents/{agent_id}/memory")
    fill(web.chrome, "kv-key", "colour")
    fill(web.chrome, "kv-value", '{"sky": "blue"}')
    submit(web, web.chrome.find_element(By.ID, "kv-save"))
    assert note(web) == ["key colour saved"]
    assert daemon.get(f"/api/memory/agents/{agent_id}/kv/colour").json() == {"sky": "blue"}
    web.chrome.find_element(By.CSS_SELECTOR, "#kv-table a[href*='kv_key=colour']").click()
    web.wait(lambda d: d.find_element(By.ID, "kv-key").get_attribute("value") == "colour")
    fill(web.chrome, "kv-value", "grey")
    submit(web, web.chrome.find_element(By.ID, "kv-save"))
    assert daemon.get(f"/api/memory/agents/{agent_id}/kv/colour").json() == "grey"

    web.chrome.find_element(By.LINK_TEXT, "Knowledge graph").click()
    web.wait(lambda d: d.find_elements(By.ID, "entity-add"))
    for entity, kind in (("Ann", "person"), ("Acme", "organization")):
        fill(web.chrome, "entity-name", entity)
        fill(web.chrome, "entity-type", kind)
        submit(web, web.chrome.find_element(By.ID, "entity-add"))
        assert note(web) == [f"entity {entity} saved"]
    fill(web.chrome, "relation-source", "Ann")
    fill(web.chrome, "relation-kind", "works_at")
    fill(web.chrome, "relation-target", "Acme")
    submit(web, web.chrome.find_element(By.ID, "relation-add"))
    assert note(web) == ["relation Ann works_at Acme saved"]
    assert "Ann" in web.chrome.find_element(By.ID, "relation-list").text
    web.chrome.find_element(By.CSS_SELECTOR, "#entity-table").find_element(By.LINK_TEXT, "Ann").click()
    web.wait(lambda d: d.find_elements(By.ID, "outgoing"))
    assert "Acme" in web.chrome.find_element(By.ID, "outgoing").text
    web.chrome.find_element(By.PARTIAL_LINK_TEXT, "knowledge graph of").click()
    web.wait(lambda d: d.find_elements(By.ID, "entity-table"))

    # Export (the link's file, read as the browser gets it), then import it into another agent.
    web.open(f"/agents/{agent_id}/memory")
    href = web.chrome.find_element(By.ID, "memory-export").get_attribute("href")
    exported = web.chrome.execute_async_script(
        "fetch(arguments[0]).then(r => r.text()).then(arguments[1])", href)
    document = json.loads(exported)
    assert {e["name"] for e in document["entities"]} == {"Ann", "Acme"}
    path = tmp_path / "memory.json"
    path.write_text(exported)
    other_id, _ = spawn(daemon)
    web.open(f"/agents/{other_id}/memory")
    web.chrome.find_element(By.ID, "memory-document").send_keys(str(path))
    submit(web, web.chrome.find_element(By.ID, "memory-import"))
    [line] = note(web)
    assert line.endswith("2 entit(ies), 1 relation(s)") and line.startswith("imported ")
    graph = daemon.get(f"/api/memory/agents/{other_id}/export").json()
    assert {e["name"] for e in graph["entities"]} == {"Ann", "Acme"}

    submit(web, web.chrome.find_element(By.XPATH, "//button[text()='Consolidate now']"))
    [line] = note(web)
    assert line.startswith("consolidated: ") and line.endswith(" decayed")


def test_edit_an_existing_workflow(console: Browser, daemon: Daemon) -> None:
    web = console
    _, agent = spawn(daemon)
    wf_name = f"wf-{uuid.uuid4().hex[:8]}"
    r = daemon.post("/api/workflows", json={"name": wf_name, "steps": [
        {"name": "draft", "agent_name": agent, "prompt": "draft {{input}}"}]})
    assert r.status_code == 201, r.text
    workflow_id = r.json()["workflow_id"]
    web.open(f"/workflows/{workflow_id}")
    web.chrome.find_element(By.ID, "edit-workflow").click()
    web.wait(lambda d: d.find_elements(By.ID, "wf-save"))
    assert web.chrome.find_element(By.NAME, "steps-0-prompt").get_attribute("value") == "draft {{input}}"
    fill_name(web, "steps-0-prompt", "polish {{input}}")
    submit(web, web.chrome.find_element(By.ID, "wf-save"))
    assert note(web) == [f"workflow {wf_name} saved"]
    steps = daemon.get(f"/api/workflows/{workflow_id}").json()["steps"]
    assert [s["prompt"] for s in steps] == ["polish {{input}}"]


def fill_name(web: Browser, name: str, text: str) -> None:
    box = web.chrome.find_element(By.NAME, name)
    box.clear()
    box.send_keys(text)


def test_create_a_key_see_its_secret_once_and_revoke_it(console: Browser, daemon: Daemon) -> None:
    web = console
    name = f"ci-{uuid.uuid4().hex[:6]}"
    web.open("/keys")
    fill(web.chrome, "name", name)
    submit(web, web.chrome.find_element(By.ID, "name"))
    assert note(web) == [f"key {name} created"]
    secret = web.chrome.find_element(By.ID, "key-value").text
    # A message-scoped key: signed in (403 for reading, not 401), until it is disabled.
    assert secret and daemon.get("/api/agents", headers={"Authorization": f"Bearer {secret}"}).status_code == 403
    [key] = [k for k in daemon.get("/api/keys").json() if k["name"] == name]
    # The answer came after a redirect: a refresh neither creates a second key nor shows the secret.
    web.chrome.refresh()
    assert not web.chrome.find_elements(By.ID, "key-secret") and secret not in web.chrome.page_source
    assert [k["name"] for k in daemon.get("/api/keys").json()].count(name) == 1
    row = web.chrome.find_element(By.ID, f"key-{key['id']}")
    submit(web, row.find_element(By.XPATH, ".//button[text()='Disable']"))
    assert note(web) == [f"key {name} disabled"]
    assert "disabled" in web.chrome.find_element(By.ID, f"key-{key['id']}").text
    assert daemon.get("/api/agents", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    web.click_and_wait(web.chrome.find_element(By.ID, f"key-{key['id']}").find_element(By.LINK_TEXT, "Delete…"))
    assert web.chrome.find_element(By.TAG_NAME, "h1").text == f"Delete key {name}?"
    submit(web, web.chrome.find_element(By.ID, "confirm"))
    assert note(web) == [f"key {name} deleted"]
    assert not web.chrome.find_elements(By.ID, f"key-{key['id']}")
    assert name not in [k["name"] for k in daemon.get("/api/keys").json()]


def test_configure_a_channel_field_and_its_secret(console: Browser, daemon: Daemon) -> None:
    web = console
    web.open("/channels/telegram")
    secret = web.chrome.find_element(By.CSS_SELECTOR, "[data-secret=bot_token_env]")
    assert secret.text in ("not set", "set")
    more = web.chrome.find_element(By.XPATH, "//summary[text()='More settings']")
    web.chrome.execute_script("arguments[0].scrollIntoView({block: 'center'})", more)
    more.click()
    fill(web.chrome, "f-api_url", "http://127.0.0.1:9/unreachable")
    token = f"4242:{uuid.uuid4().hex}"
    fill(web.chrome, "f-bot_token_env", token)
    submit(web, web.chrome.find_element(By.ID, "f-api_url"))
    assert note(web)[0].startswith("telegram: configuration saved")
    assert web.chrome.find_element(By.CSS_SELECTOR, "[data-secret=bot_token_env]").text == "set"
    assert token not in web.chrome.page_source, "a saved secret is never shown"
    assert web.chrome.find_element(By.ID, "f-bot_token_env").get_attribute("value") == ""
    assert web.chrome.find_element(By.ID, "f-api_url").get_attribute("value") == "http://127.0.0.1:9/unreachable"
    assert web.chrome.find_element(By.ID, "state").text == "connecting"  # nothing answers at that api_url


def test_set_a_channels_overrides(console: Browser, daemon: Daemon) -> None:
    from selenium.webdriver.support.ui import Select

    web = console
    web.open("/channels/telegram")
    if not web.chrome.find_element(By.ID, "overrides").get_attribute("open"):  # open once any is set
        opener = web.chrome.find_element(By.XPATH, "//summary[text()='Overrides for this channel']")
        web.chrome.execute_script("arguments[0].scrollIntoView({block: 'center'})", opener)
        opener.click()
    Select(web.chrome.find_element(By.ID, "f-overrides.usage_footer")).select_by_value("tokens")
    fill(web.chrome, "f-overrides.system_prompt", "Answer in French.")
    submit(web, web.chrome.find_element(By.ID, "f-overrides.usage_footer"))
    assert note(web)[0].startswith("telegram: configuration saved")
    chosen = Select(web.chrome.find_element(By.ID, "f-overrides.usage_footer")).first_selected_option
    assert chosen.get_attribute("value") == "tokens"
    assert web.chrome.find_element(By.ID, "f-overrides.system_prompt").get_attribute("value") == "Answer in French."
    config = (daemon.home / "config.toml").read_text()
    assert 'usage_footer = "tokens"' in config and 'system_prompt = "Answer in French."' in config
