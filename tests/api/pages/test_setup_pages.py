"""The dashboard's setup, agent-edit, audit, log and settings pages over plain HTTP (no
JavaScript): the daemon's own app in process over a real kernel, the fake LLM as the
provider. Every POST is a form post answered with 303 (a refresh never re-submits), its
message travelling to the next page; every dashboard page stays under 60 KB with no inline
script. The same flows in a browser are tests/api/pages/test_setup_browser.py."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import pytest
import requests

from agentd.api import create_app
from agentd.config import parse_config
from agentd.kernel import Kernel
from agentd.settings import MASK, Settings
from support import FAST_API, Daemon, make_home, run_cli, with_test_db

LOCAL = {"REMOTE_ADDR": "127.0.0.1"}
PAGE_BUDGET = 60_000
KEY_VARS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GROQ_API_KEY")


def open_kernel(home: Path, **extra) -> Kernel:
    data = {"api": {"rate_limit_per_second": 10000, "rate_limit_burst": 10000}, **extra}
    return Kernel.open(parse_config(with_test_db(data, home), home))


class Web:
    """A form-posting client: the CSRF token from the last page, 303s followed by hand."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.client = create_app(kernel).test_client()
        self.token = ""

    def get(self, path: str):
        r = self.client.get(path, environ_base=LOCAL)
        match = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', r.get_data(as_text=True))
        if match:
            self.token = match.group(1)
        return r

    def post(self, path: str, data: dict):
        if not self.token:
            self.get("/agents")
        return self.client.post(path, data={"csrf_token": self.token, **data}, environ_base=LOCAL)

    def follow(self, r) -> tuple[str, str]:
        """(the path a 303 leads to, the message that page shows)."""
        assert r.status_code == 303, r.get_data(as_text=True)[:500]
        target = r.headers["Location"]
        html = self.get(target).get_data(as_text=True)
        shown = re.search(r'<div class="(notice|error)" role="status" id="page-note">(.*?)</div>', html, re.S)
        lines = re.findall(r"<p>(.*?)</p>", shown.group(2)) if shown else []
        return urlsplit(target).path, " | ".join(lines).replace("&#39;", "'").replace("&#34;", '"')


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Web]:
    """A kernel on an empty home; no provider key in the environment (restored afterwards:
    saving a key puts it into os.environ)."""
    for name in KEY_VARS:
        monkeypatch.setenv(name, "")
    kernel = open_kernel(tmp_path)
    yield Web(kernel)
    kernel.close()


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Web]:
    patch = pytest.MonkeyPatch()
    for name in KEY_VARS:
        patch.setenv(name, "")
    patch.setenv("OPENAI_API_KEY", "test-openai")
    kernel = open_kernel(tmp_path_factory.mktemp("setup-pages"), llm={"timeout_secs": 5, "retries": 1},
                         default_model={"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
                         provider_urls={"openai": fake_llm.openai_base})
    yield Web(kernel)
    kernel.close()
    patch.undo()


# -- first run ------------------------------------------------------------------------------

def test_a_fresh_home_is_sent_to_setup_until_a_local_provider_is_the_default(fresh: Web, fake_llm) -> None:
    r = fresh.get("/")
    assert r.status_code == 303 and r.headers["Location"] == "/setup"
    html = fresh.get("/setup").get_data(as_text=True)
    assert "anthropic/claude-sonnet-4-20250514" in html and "has no API key" in html
    for name, port in (("Ollama", 11434), ("vLLM", 8000), ("LM Studio", 1234)):
        assert re.search(rf"{name} <code class=\"url\">http://localhost:{port}/v1</code>", html), name
    # A server answering where Ollama is expected is offered with a one-click form.
    fresh.kernel.providers.set_url("ollama", fake_llm.openai_base)
    html = fresh.get("/setup").get_data(as_text=True)
    assert re.search(r'<span class="pill ok">answering</span>\s*Ollama', html)
    assert "Use Ollama</button>" in html and "Use vLLM</button>" not in html
    assert fresh.follow(fresh.post("/setup/provider", {"provider": ""})) == ("/setup", "choose a provider")
    path, shown = fresh.follow(fresh.post("/setup/provider", {"provider": "ollama"}))
    assert path == "/setup" and re.fullmatch(r"ollama: reached in \d+ ms; now make one of its models the default",
                                             shown)
    path, shown = fresh.follow(fresh.post("/setup/default", {"provider": "ollama", "model": "llama3.2"}))
    assert (path, shown) == ("/agents", "default model set to ollama/llama3.2; spawn an agent below")
    assert '[default_model]\nprovider = "ollama"\nmodel = "llama3.2"\n' in (fresh.kernel.config.config_path.read_text())
    assert (fresh.kernel.config.default_model.provider, fresh.kernel.config.default_model.model) == ("ollama", "llama3.2")
    r = fresh.get("/")
    assert r.status_code == 200 and "<h1>Overview</h1>" in r.get_data(as_text=True)
    assert '<a href="/setup">Setup</a>' in r.get_data(as_text=True), "the setup page keeps a link"
    assert "is <code>ollama/llama3.2</code>" in fresh.get("/setup").get_data(as_text=True)


def test_a_local_default_chosen_on_the_setup_page_holds_after_a_restart(tmp_path: Path, fake_llm) -> None:
    # The fake LLM stands where LM Studio is expected; no provider key anywhere.
    home = make_home(tmp_path, FAST_API + f'[provider_urls]\nlmstudio = "{fake_llm.openai_base}"\n')
    daemon = Daemon(home, env_extra={name: "" for name in KEY_VARS}).start()
    browser = requests.Session()

    def post(path: str, form: dict) -> requests.Response:
        page = browser.get(f"{daemon.url}/setup", timeout=30).text
        token = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page).group(1)
        return browser.post(daemon.url + path, data={"csrf_token": token, **form}, allow_redirects=False,
                            timeout=30)

    assert "Use LM Studio</button>" in browser.get(f"{daemon.url}/setup", timeout=30).text
    assert post("/setup/provider", {"provider": "lmstudio"}).status_code == 303
    assert post("/setup/default", {"provider": "lmstudio", "model": "fake-model"}).status_code == 303
    r = daemon.post("/api/agents", json={"manifest_toml": 'name = "local"\n'})
    assert r.status_code == 201 and r.json()["warnings"] == [], r.text
    agent_id = r.json()["agent_id"]
    r = daemon.post(f"/api/agents/{agent_id}/message", json={"message": "[[reply:before]] hi"})
    assert (r.status_code, r.json().get("response")) == (200, "before"), r.text
    daemon.stop()
    daemon.start()
    r = daemon.post(f"/api/agents/{agent_id}/message", json={"message": "[[reply:after]] hi"})
    assert (r.status_code, r.json().get("response")) == (200, "after"), r.text
    r = daemon.post("/api/agents", json={"manifest_toml": 'name = "later"\n'})
    assert r.status_code == 201 and r.json()["warnings"] == [], r.text
    assert browser.get(f"{daemon.url}/", allow_redirects=False, timeout=30).status_code == 200
    checks = {c["check"]: c for c in json.loads(run_cli(home, "doctor", "--json", port=daemon.port).stdout)}
    assert checks["provider_keys"]["status"] == "ok" and "ANTHROPIC" not in checks["provider_keys"]["message"]
    daemon.stop()


def test_a_key_is_saved_private_tested_and_never_shown(fresh: Web, fake_llm) -> None:
    secret = "sk-setup-secret-0123"
    r = fresh.post("/setup/provider", {"provider": "openai", "api_key": secret, "base_url": fake_llm.openai_base})
    path, shown = fresh.follow(r)
    assert path == "/setup"
    assert shown.startswith(f"openai: base URL set to {fake_llm.openai_base} | openai: key saved | openai: reached in ")
    secrets = fresh.kernel.config.secrets_path
    assert f"OPENAI_API_KEY={secret}\n" in secrets.read_text()
    assert stat.S_IMODE(os.stat(secrets).st_mode) == 0o600
    assert secret not in r.headers["Location"]
    for page in ("/setup", "/providers", "/settings", "/logs"):
        assert secret not in fresh.get(page).get_data(as_text=True), page
    assert not [line for _, line in fresh.kernel.log_tail.last(1000) if secret in line]
    # The chosen provider carries on to the default-model form.
    html = fresh.get("/setup?provider=openai").get_data(as_text=True)
    assert '<option value="openai" selected>' in html and '<option value="gpt-4o">' in html
    # Failures say what is wrong, on the setup page, and change nothing.
    assert fresh.follow(fresh.post("/setup/provider", {"provider": "groq"})) == (
        "/setup", "groq: no API key for groq: set GROQ_API_KEY or POST /api/providers/groq/key")
    r = fresh.post("/setup/provider", {"provider": "groq", "base_url": "not a url", "api_key": "gsk-typed-secret"})
    path, shown = fresh.follow(r)
    assert shown == "groq: base_url must be an http:// or https:// URL with a host, got 'not a url'"
    html = fresh.get(r.headers["Location"]).get_data(as_text=True)
    assert re.search(r'<input id="setup-url" [^>]*value="not a url">', html)
    assert "gsk-typed-secret" not in html and "gsk-typed-secret" not in r.headers["Location"], "a key is never kept"
    r = fresh.post("/setup/default", {"provider": "groq", "model": "has spaces"})
    assert 'value="has spaces"' in fresh.get(r.headers["Location"]).get_data(as_text=True), "what was typed is kept"
    assert fresh.follow(fresh.post("/setup/provider", {"provider": "nope"})) == ("/setup", "nope: provider not found: nope")
    assert fresh.follow(fresh.post("/setup/default", {"provider": "openai", "model": ""})) == (
        "/setup", "default model: model must be a model name without spaces")
    assert fresh.kernel.config.default_model.provider == "anthropic"


# -- agents ---------------------------------------------------------------------------------

def test_spawn_form_fields_mode_and_warnings(web: Web) -> None:
    prompt = 'Answer "briefly".\nNever guess.'
    r = web.post("/agents", {"name": "formed", "model": "anthropic/claude-opus-4-6", "profile": "coding",
                             "mode": "Observe", "system_prompt": prompt})
    handle = web.kernel.agents.by_name("formed")
    assert web.follow(r) == (f"/agents/{handle.id}", "agent formed spawned | provider anthropic has no API key: "
                             "set ANTHROPIC_API_KEY or POST /api/providers/anthropic/key")
    assert (handle.mode, handle.provider, handle.model) == ("Observe", "anthropic", "claude-opus-4-6")
    assert handle.manifest.data["profile"] == "coding" and handle.manifest.data["model"]["system_prompt"] == prompt
    r = web.post("/agents", {"name": "plain", "model": "default", "profile": "", "mode": "Auto", "system_prompt": ""})
    handle = web.kernel.agents.by_name("plain")
    assert web.follow(r) == (f"/agents/{handle.id}", "agent plain spawned")
    assert (handle.provider, handle.model, handle.manifest.data["profile"]) == ("openai", "gpt-4o", None)
    # Refusals re-render the list with the error and what was typed (400, nothing spawned).
    for form, error in (({"name": "", "model": "default"}, "name is required (or give a TOML manifest)"),
                        ({"name": "odd", "model": "nonsense"}, "model: expected provider/model or default, got &#39;nonsense&#39;"),
                        ({"name": "odd", "model": "default", "mode": "Sideways"}, "mode must be one of Auto, Manual, Observe"),
                        ({"name": "bad name!", "model": "default"}, "invalid manifest format: name")):
        r = web.post("/agents", {"profile": "", "system_prompt": "kept text", **form})
        html = r.get_data(as_text=True)
        assert r.status_code == 400 and error in html and ">kept text</textarea>" in html, form
    assert web.kernel.agents.by_name("odd") is None
    # The raw TOML manifest wins over the fields.
    r = web.post("/agents", {"name": "ignored", "model": "default", "manifest_toml": 'name = "from-toml"\n'})
    assert web.follow(r)[1] == "agent from-toml spawned" and web.kernel.agents.by_name("ignored") is None


def test_edit_model_and_manifest_keep_the_conversation(web: Web) -> None:
    handle = web.kernel.agents.spawn('name = "editable"\n# a comment that stays\n[model]\nprovider = "default"\n'
                                     'model = "default"\n')
    r = web.client.post(f"/api/agents/{handle.id}/message", json={"message": "[[reply:kept]] hi"}, environ_base=LOCAL)
    assert r.status_code == 200
    html = web.get(f"/agents/{handle.id}/edit").get_data(as_text=True)
    assert "# a comment that stays" in html and 'value="openai/gpt-4o"' in html
    assert web.follow(web.post(f"/agents/{handle.id}/model", {"model": "deepseek/deepseek-chat"})) == (
        f"/agents/{handle.id}", "agent editable: model set to deepseek/deepseek-chat | provider deepseek has no "
        "API key: set DEEPSEEK_API_KEY or POST /api/providers/deepseek/key")
    assert "# a comment that stays" in handle.manifest.toml_text
    assert web.follow(web.post(f"/agents/{handle.id}/model", {"model": "gpt-4o"})) == (
        f"/agents/{handle.id}/edit", "model: expected provider/model or default, got 'gpt-4o'")
    assert web.follow(web.post(f"/agents/{handle.id}/model", {"model": "nope/x"})) == (
        f"/agents/{handle.id}/edit", "invalid manifest format: model.provider: unknown provider 'nope' "
                                     "(set model.base_url for a custom endpoint)")
    new = 'name = "editable"\ndescription = "now described"\n[model]\nprovider = "openai"\nmodel = "gpt-4o"\n'
    assert web.follow(web.post(f"/agents/{handle.id}/manifest", {"manifest_toml": new})) == (
        f"/agents/{handle.id}", "agent editable: manifest saved")
    assert handle.manifest.data["description"] == "now described" and handle.model == "gpt-4o"
    r = web.post(f"/agents/{handle.id}/manifest", {"manifest_toml": 'name = "renamed"\n'})
    assert r.status_code == 400 and "an agent keeps its name (&#39;editable&#39;)" in r.get_data(as_text=True)
    assert '>name = &#34;renamed&#34;\n</textarea>' in r.get_data(as_text=True)
    # The same calls through the JSON API.
    api = web.client
    r = api.put(f"/api/agents/{handle.id}/model", json={"model": "openai/gpt-4o-mini"}, environ_base=LOCAL)
    assert r.status_code == 200 and r.get_json() == {"status": "updated", "agent_id": handle.id,
                                                      "model_provider": "openai", "model_name": "gpt-4o-mini",
                                                      "warnings": []}
    r = api.put(f"/api/agents/{handle.id}/manifest", json={"manifest_toml": new + "colour = 1\n"}, environ_base=LOCAL)
    assert r.status_code == 200 and r.get_json()["model_name"] == "gpt-4o" and len(r.get_json()["warnings"]) == 1
    r = api.put(f"/api/agents/{handle.id}/manifest", json={"manifest_toml": 'name = "renamed"\n'}, environ_base=LOCAL)
    assert r.status_code == 400 and "keeps its name" in r.get_json()["error"]
    r = api.put(f"/api/agents/{handle.id}/model", json={"model": "gpt 4"}, environ_base=LOCAL)
    assert (r.status_code, r.get_json()) == (400, {"error": "invalid request: model: must be provider/model or default"})
    r = api.put("/api/agents/00000000-0000-4000-8000-000000000000/model", json={"model": "default"},
                environ_base=LOCAL)
    assert r.status_code == 404
    session = api.get(f"/api/agents/{handle.id}/session", environ_base=LOCAL).get_json()
    assert [m["content"] for m in session["messages"]] == ["[[reply:kept]] hi", "kept"]
    events = [e["event"] for e in web.kernel.audit.recent(10, "agent.", "editable")]
    assert events == ["agent.update"] * 4 + ["agent.spawn"]


# -- audit, log, settings ---------------------------------------------------------------------

def test_audit_filters_on_the_page_and_the_api(web: Web) -> None:
    for name in ("audited-a", "audited-b"):
        web.kernel.agents.spawn(f'name = "{name}"\n')
    api = web.client
    rows = api.get("/api/audit/recent?subject=audited-a", environ_base=LOCAL).get_json()
    assert [(r["event"], r["subject"]) for r in rows] == [("agent.spawn", "audited-a")]
    assert api.get("/api/audit/recent?subject=audited-a&since=2999-01-01T00:00:00Z",
                   environ_base=LOCAL).get_json() == []
    assert len(api.get("/api/audit/recent?subject=audited-a&until=2999-01-01T00:00:00%2B00:00",
                       environ_base=LOCAL).get_json()) == 1
    for bad in ("yesterday", "", "2026-01-31", "2026-01-31T09:00:00"):
        r = api.get(f"/api/audit/recent?since={bad}", environ_base=LOCAL)
        assert r.status_code == 400 and r.get_json() == {
            "error": f"since: must be an RFC 3339 time such as 2026-01-31T09:00:00Z, got {bad!r}"}, bad
    html = web.get("/audit?agent=audited-b&action=agent.").get_data(as_text=True)
    assert re.findall(r"<td>(audited-[ab])</td>", html) == ["audited-b"]
    assert '<option value="audited-a">' in html, "the agent filter offers the agents"
    html = web.get("/audit?agent=audited-b&since=2999-01-01T00:00").get_data(as_text=True)
    assert "No event matches." in html
    # The page's JSON link carries every filter the page applies, so it shows the same rows.
    for times, shown in (("since=2999-01-01T00:00", 0), ("until=2999-01-01T00:00:30", 1),
                         ("since=2000-01-01T00:00&until=2001-01-01T00:00", 0)):
        html = web.get(f"/audit?agent=audited-b&action=agent.&{times}").get_data(as_text=True)
        link = re.search(r'href="(/api/audit/recent\?[^"]*)"', html).group(1).replace("&amp;", "&")
        rows = api.get(link, environ_base=LOCAL).get_json()
        assert len(rows) == len(re.findall(r"<td>audited-b</td>", html)) == shown, (times, link, rows)
    html = web.get("/audit?since=soon").get_data(as_text=True)
    assert "since: &#39;soon&#39; is not a time (YYYY-MM-DDTHH:MM)" in html


def test_the_audit_page_keeps_its_weight_with_many_agents(fresh: Web) -> None:
    for i in range(300):
        fresh.kernel.agents.spawn(f'name = "an-agent-with-a-long-enough-name-{i:04d}"\n')
    fresh.kernel.audit.record("config.reload", "", {"changed": ["x" * 5000]})
    html = fresh.get("/audit").get_data(as_text=True)
    budget = PAGE_BUDGET - sum(len(fresh.get(f"/static/{f}").data) for f in ("app.css", "app.js"))
    assert len(html.encode()) < budget, len(html.encode())
    assert html.count("<tr><td>") == 100 and len(re.findall(r'<option value="an-agent', html)) == 100
    assert "x" * 200 not in html and "x" * 150 in html, "a long detail is cut in its row"
    assert "The newest 100 events (at most 100)." in html and "/api/audit/recent?limit=100" in html


def test_log_page_shows_the_tail_and_streams_new_lines(web: Web) -> None:
    logging.getLogger("agentd.test").warning("first marker <b>")
    html = web.get("/logs").get_data(as_text=True)
    assert "WARNING agentd.test: first marker &lt;b&gt;" in html
    assert "The daemon's newest 200 log lines (times in UTC)." in html
    after = int(re.search(r'data-after="(\d+)"', html).group(1))
    logging.getLogger("agentd.test").warning("second marker")
    r = web.client.get(f"/logs/stream?after={after}", environ_base=LOCAL)
    assert r.mimetype == "text/event-stream"
    chunks = iter(r.response)
    assert next(chunks) == b": stream open\n\n"
    event = next(chunks).decode()
    assert re.fullmatch(rf"id: {after + 1}\nevent: line\ndata: .* WARNING agentd.test: second marker\n\n", event)
    r.close()


def test_settings_mask_secrets_and_reload_the_file(fresh: Web) -> None:
    cfg = parse_config({"api_key": "hush-admin-key", "database_url": "",
                        "channels": {"telegram": {"bot_token": "123:hush", "bot_token_env": "TG_TOKEN"}}},
                       Path("/tmp/agentd-none"))
    rows = dict(Settings(cfg, fresh.kernel.catalog, lambda *a: None, {}).effective())
    assert rows["api_key"] == MASK and rows["channels.telegram.bot_token"] == MASK
    assert rows["channels.telegram.bot_token_env"] == "TG_TOKEN" and rows["default_model.provider"] == "anthropic"
    assert "hush" not in repr(rows)
    cfg = parse_config({"database_url": "postgresql://agentd@db.example/agentd"}, Path("/tmp/agentd-none"))
    cfg.database = type(cfg.database)("postgresql://agentd:hush-pw@db.example/agentd")
    rows = dict(Settings(cfg, fresh.kernel.catalog, lambda *a: None, {}).effective())
    assert rows["database"] == "postgresql://agentd:***@db.example/agentd"
    html = fresh.get("/settings").get_data(as_text=True)
    assert "<code>default_model.model</code></td><td><code>&#34;claude-sonnet-4-20250514&#34;</code>" in html
    path = fresh.kernel.config.config_path
    path.write_text('log_level = "debug"\n[default_model]\nprovider = "openai"\nmodel = "gpt-4o-mini"\n')
    path_, shown = fresh.follow(fresh.post("/settings/reload", {}))
    assert (path_, shown) == ("/settings", "configuration reloaded: default_model, provider_urls, llm, log_level, "
                                           "channels, mcp_servers, skills")
    assert fresh.kernel.config.default_model.model == "gpt-4o-mini" and fresh.kernel.config.log_level == "debug"
    path.write_text("[default_model\n")
    path_, shown = fresh.follow(fresh.post("/settings/reload", {}))
    assert path_ == "/settings" and shown.startswith("cannot reload: cannot parse ")
    assert fresh.kernel.config.default_model.model == "gpt-4o-mini"
    logging.getLogger().setLevel(logging.WARNING)


def test_every_post_needs_the_csrf_token(web: Web) -> None:
    handle = web.kernel.agents.spawn('name = "guarded"\n')
    for path, form in (("/setup/provider", {"provider": "openai"}), ("/setup/default", {"provider": "openai",
                                                                                         "model": "x"}),
                       ("/settings/reload", {}), (f"/agents/{handle.id}/model", {"model": "openai/x"}),
                       (f"/agents/{handle.id}/manifest", {"manifest_toml": 'name = "guarded"\n'}),
                       ("/agents", {"name": "sneaky", "model": "default"})):
        r = web.client.post(path, data=form, environ_base=LOCAL)
        assert r.status_code == 403, path
    assert web.kernel.agents.by_name("sneaky") is None and handle.model == "gpt-4o"


def test_every_dashboard_page_is_small_and_has_no_inline_script(web: Web) -> None:
    handle = web.kernel.agents.spawn('name = "paged"\n')
    values = {"agent_id": handle.id}
    app = web.client.application
    checked = []
    for rule in app.url_map.iter_rules():
        if (not rule.endpoint.startswith("pages.") or "GET" not in rule.methods
                or rule.endpoint in ("pages.logs_stream", "pages.favicon")):
            continue
        if not set(rule.arguments) <= set(values):
            continue  # pages of things this daemon has none of (a workflow, a schedule)
        path = rule.build(values)[1]
        r = web.get(path)
        assert r.status_code in (200, 303), (path, r.status_code)
        html = r.get_data(as_text=True)
        assert len(r.data) < PAGE_BUDGET, f"{path} is {len(r.data)} bytes"
        assert re.findall(r"<script(?![^>]*\bsrc=)", html) == [], f"{path} has an inline script"
        assert not re.search(r"\son[a-z]+\s*=", html), f"{path} has an inline event handler"
        checked.append(rule.endpoint)
    assert {"pages.setup", "pages.settings", "pages.audit", "pages.logs", "pages.agent_edit",
            "pages.agents_list", "pages.index"} <= set(checked)
    assert len(checked) >= 20


def test_admin_pages_are_linked_and_served_to_the_admin_only(tmp_path: Path) -> None:
    kernel = open_kernel(tmp_path, api_key="setup-admin-key-0123")
    try:
        reader = kernel.keys.create({"name": "reader", "scopes": ["read"]})["key"]
        links = ('href="/setup"', 'href="/settings"', 'href="/audit"', 'href="/logs"', 'href="/keys"')
        for secret, admin in (("setup-admin-key-0123", True), (reader, False)):
            web = Web(kernel)
            login = web.get("/login?next=/agents")
            assert login.status_code == 200
            r = web.client.post("/login", data={"api_key": secret, "csrf_token": web.token, "next": "/agents"},
                                environ_base=LOCAL)
            assert r.status_code == 303
            html = web.get("/agents").get_data(as_text=True)
            assert [link in html for link in links] == [admin] * len(links), admin
            for path in ("/setup", "/settings", "/audit", "/logs"):
                assert web.get(path).status_code == (200 if admin else 403), (path, admin)
    finally:
        kernel.close()
