"""The dashboard through Flask's test client: every page, escaping, CSRF, login, the
no-JavaScript chat flow, the SVG chart, error pages, page budgets, proxy prefixes.

The app is the real one (create_app over a real kernel); agent runs go to the fake
LLM over real HTTP.
"""

from __future__ import annotations

import os
import re
import time
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest

from agentd.api import create_app
from agentd.config import parse_config
from agentd.kernel import Kernel
from support import with_test_db
from tests.api.pages.test_pages import asks_first

LOCAL = {"REMOTE_ADDR": "127.0.0.1"}
REMOTE = {"REMOTE_ADDR": "203.0.113.9"}
XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
KEY = "dash-key-0123456789"


def build(tmp_path: Path, fake=None, **extra) -> tuple:
    data: dict = {"api": {"rate_limit_per_second": 10000, "rate_limit_burst": 10000}}
    if fake is not None:
        data.update({"llm": {"timeout_secs": 3, "retries": 1},
                     "default_model": {"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
                     "provider_urls": {"openai": fake.openai_base}})
    data.update(extra)
    kernel = Kernel.open(parse_config(with_test_db(data, tmp_path), tmp_path))
    return create_app(kernel).test_client(), kernel


@pytest.fixture
def dash(tmp_path: Path, fake_llm, monkeypatch) -> Iterator[tuple]:
    monkeypatch.setenv("OPENAI_API_KEY", "test-openai")
    client, kernel = build(tmp_path, fake_llm)
    yield client, kernel
    kernel.close()


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[tuple]:
    client, kernel = build(tmp_path, api_key=KEY)
    yield client, kernel
    kernel.close()


def spawn(kernel: Kernel, name: str = "helper", extra: str = "") -> str:
    toml = (f'name = "{name}"\ndescription = "the {name}"\n{extra}\n'
            '[model]\nprovider = "default"\nmodel = "default"\n')
    return kernel.agents.spawn(toml).id


def token_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', html)
    assert match, "page has no CSRF field"
    return match.group(1)


def page(client, path: str, **kwargs):
    kwargs.setdefault("environ_base", LOCAL)
    return client.get(path, **kwargs)


def post(client, path: str, data: dict, **kwargs):
    kwargs.setdefault("environ_base", LOCAL)
    return client.post(path, data=data, **kwargs)


def csrf(client, path: str = "/agents") -> str:
    return token_of(page(client, path).get_data(as_text=True))


# -- every page renders ------------------------------------------------------------------

def note_of(html: str) -> str:
    """The message a page shows after a form's redirect ('' when none)."""
    shown = re.search(r'id="page-note">(.*?)</div>', html, re.S)
    return " | ".join(re.findall(r"<p>(.*?)</p>", shown.group(1))) if shown else ""


def test_every_page_renders_with_key_content(dash) -> None:
    client, kernel = dash
    agent_id = spawn(kernel)
    kernel.kv.set(agent_id, "colour", "blue")
    expected = {
        "/": ["<h1>Overview</h1>", "Health", "Agents", "Spend this period",
              "Pending approvals", "Recent workflow runs", "Channels"],
        "/agents": ["<h1>Agents", f'href="/agents/{agent_id}"', ">helper</a>", "Running", "Auto",
                    "openai/gpt-4o", 'name="manifest_toml"'],
        f"/agents/{agent_id}": ["helper", "the helper", f'action="/agents/{agent_id}/message"',
                                '<textarea id="message" name="message"', f'href="/agents/{agent_id}/kill"',
                                f'action="/agents/{agent_id}/stop"', f'action="/agents/{agent_id}/compact"',
                                f'href="/agents/{agent_id}/reset"', f'action="/agents/{agent_id}/mode"',
                                f'data-stream-url="/api/agents/{agent_id}/message/stream"'],
        f"/agents/{agent_id}/memory": ["colour", "<pre>&#34;blue&#34;</pre>", "Semantic memories"],
        "/approvals": ["Pending approvals", "No tool call is waiting"],
        "/usage": ["Usage this period", "<svg", "Per model", "Per agent", "Budget"],
        "/models": ["<h1>Models", "GPT-4o", "Aliases"],
        "/providers": ["<h1>Providers", "Anthropic", "ANTHROPIC_API_KEY", 'action="/providers/openai/test"'],
        "/workflows": ["<h1>Workflows", "No workflows yet"],
        "/channels": ["<h1>Channels", 'href="/api/channels"'],
        "/api": ["API <span", 'href="/api/openapi.json"', "<code>/api/agents</code>"],
    }
    for path, needles in expected.items():
        r = page(client, path)
        assert r.status_code == 200, path
        assert r.mimetype == "text/html", path
        html = r.get_data(as_text=True)
        for needle in needles:
            assert needle in html, f"{path}: {needle!r} missing"
        # The same navigation on every page.
        for link in ("/agents", "/approvals", "/usage", "/models", "/providers", "/workflows", "/channels"):
            assert f'href="{link}"' in html, f"{path}: no link to {link}"


def test_pages_carry_csp_and_frame_headers_and_no_inline_script(dash) -> None:
    client, kernel = dash
    agent_id = spawn(kernel)
    for path in ("/", "/agents", f"/agents/{agent_id}", "/usage", "/models", "/nope", "/api"):
        r = page(client, path)
        csp = r.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe" not in csp
        assert r.headers["X-Frame-Options"] == "DENY"
        html = r.get_data(as_text=True)
        assert re.findall(r"<script(?![^>]*\bsrc=)", html) == [], path
        assert not re.search(r"\son[a-z]+=", html), f"{path} has an inline event handler"
        assert " style=" not in html, f"{path} has an inline style"
    # The API's own headers stay as they were.
    assert page(client, "/api/health").headers["Content-Security-Policy"] == "default-src 'none'; frame-ancestors 'none'"


def test_no_key_dashboard_serves_loopback_only(dash) -> None:
    client, _ = dash
    r = page(client, "/login")
    assert r.status_code == 200 and "nothing to log in to" in r.get_data(as_text=True)
    assert 'name="api_key"' not in r.get_data(as_text=True)
    r = client.get("/agents", environ_base=REMOTE)
    assert r.status_code == 401 and r.mimetype == "text/html"
    assert "loopback" in r.get_data(as_text=True)


# -- escaping ----------------------------------------------------------------------------

def test_untrusted_text_is_escaped(dash) -> None:
    client, kernel = dash
    agent_id = kernel.agents.spawn(f'name = "xss"\ndescription = "{XSS}"\n'
                                   '[model]\nprovider = "default"\nmodel = "default"\n').id
    kernel.kv.set(agent_id, XSS, {"v": XSS})
    token = csrf(client)
    r = post(client, f"/agents/{agent_id}/message", {"message": f"{XSS} [[reply:{XSS} from the model]]",
                                                      "csrf_token": token})
    assert r.status_code == 303
    for path in (f"/agents/{agent_id}", f"/agents/{agent_id}/memory"):
        html = page(client, path).get_data(as_text=True)
        assert XSS not in html, path
        assert "alert(1)" in html
    html = page(client, f"/agents/{agent_id}").get_data(as_text=True)
    assert f"{XSS_ESCAPED} from the model" in html  # the model's reply
    assert f"{XSS_ESCAPED} [[reply:" in html        # the user's message
    assert html.count(XSS_ESCAPED) >= 3              # + the description
    # A stored value reads as the text it is (escaped by the page, not \u003c-encoded).
    memory = page(client, f"/agents/{agent_id}/memory").get_data(as_text=True)
    assert f"<code>{XSS_ESCAPED}</code>" in memory
    assert f"<pre>{{&#34;v&#34;: &#34;{XSS_ESCAPED}&#34;}}</pre>" in memory
    assert "\\u003c" not in memory


# -- the no-JavaScript chat ---------------------------------------------------------------

def test_agents_list_pages_and_filters(dash) -> None:
    client, kernel = dash
    for i in range(105):
        spawn(kernel, f"bot-{i:03d}")
    html = page(client, "/agents").get_data(as_text=True)
    assert html.count('<tr><td><a href="/agents/') == 100 and "1–100 of 105" in html
    assert ">bot-000</a>" in html and ">bot-100</a>" not in html and 'href="/agents?page=2"' in html
    html = page(client, "/agents?page=2").get_data(as_text=True)
    assert html.count('<tr><td><a href="/agents/') == 5 and ">bot-104</a>" in html and "101–105 of 105" in html
    html = page(client, "/agents?q=BOT-10").get_data(as_text=True)
    assert html.count('<tr><td><a href="/agents/') == 5 and "page=" not in html
    assert "No agent matches." in page(client, "/agents?q=nobody").get_data(as_text=True)
    assert page(client, "/agents?page=x").status_code == 200


def test_chat_post_answers_303_and_page_shows_reply(dash) -> None:
    client, kernel = dash
    agent_id = spawn(kernel)
    token = csrf(client, f"/agents/{agent_id}")
    r = post(client, f"/agents/{agent_id}/message", {"message": "hello there", "csrf_token": token})
    assert r.status_code == 303
    assert r.headers["Location"] == f"/agents/{agent_id}#latest"
    html = page(client, f"/agents/{agent_id}").get_data(as_text=True)
    assert "hello there" in html and "echo: hello there" in html
    assert kernel.agents.session(kernel.agents.get(agent_id))["messages"][-1]["content"] == "echo: hello there"


def test_chat_errors_render_on_the_page(dash) -> None:
    client, kernel = dash
    agent_id = spawn(kernel)
    token = csrf(client)
    r = post(client, f"/agents/{agent_id}/message", {"message": "   ", "csrf_token": token})
    assert r.status_code == 400 and r.mimetype == "text/html"
    assert "message is empty" in r.get_data(as_text=True)
    r = post(client, f"/agents/{agent_id}/message", {"message": "[[fail:401]] keep me", "csrf_token": token})
    assert r.status_code >= 400 and r.mimetype == "text/html"
    html = r.get_data(as_text=True)
    assert 'role="alert"' in html and "[[fail:401]] keep me</textarea>" in html


def test_a_refused_agent_form_keeps_its_input_and_its_url_leads_back_to_the_page(dash) -> None:
    client, kernel = dash
    spawn(kernel, "refused")
    agent_id = kernel.agents.by_name("refused").id
    token = csrf(client)
    unknown = 'name = "refused"\n[model]\nprovider = "nowhere"\nmodel = "m"\n'
    for path, form, status, kept, back in (
            ("message", {"message": "[[fail:401]] keep me"}, 500, "[[fail:401]] keep me</textarea>", ""),
            ("manifest", {"manifest_toml": unknown}, 400, "unknown provider &#39;nowhere&#39;", "/edit"),
            ("mode", {"mode": "bogus"}, 400, "invalid mode", "")):
        r = post(client, f"/agents/refused/{path}", {"csrf_token": token, **form})
        assert r.status_code >= status and r.mimetype == "text/html" and kept in r.get_data(as_text=True), path
        r = page(client, f"/agents/refused/{path}")
        assert (r.status_code, r.headers["Location"]) == (303, f"/agents/{agent_id}{back}"), path


def test_every_form_url_answers_a_get(dash) -> None:
    """Each URL a dashboard form posts to answers GET: the page the form is on (303), or a
    page of its own (a list, a form, a confirmation); never 405."""
    client, kernel = dash
    agent = spawn(kernel, "formed")
    workflow = kernel.workflows.create({"name": "formed-wf", "steps": [{"agent_name": "formed", "prompt": "hi"}]})
    job = kernel.cron.create({"name": "formed-job", "agent_id": "formed", "schedule": {"kind": "every", "every_secs": 3600},
                              "action": {"kind": "agent_turn", "message": "hi"}})["id"]
    trigger = kernel.triggers.create({"agent_id": "formed", "pattern": {"content_match": "x"},
                                      "prompt_template": "{{event}}"})["id"]
    key = "k1"  # (scoped keys need an admin key: this daemon has none, so the key's actions are its 404)
    values = {"agent_id": agent, "workflow_id": workflow, "run_id": "r1", "job_id": job, "trigger_id": trigger,
              "key_id": key, "memory_id": "m1", "name": "telegram", "approval_id": "a1",
              "decision": "approve", "action": "enable"}
    leads_to = {
        f"/agents/{agent}/manifest": f"/agents/{agent}/edit", f"/agents/{agent}/model": f"/agents/{agent}/edit",
        **{f"/agents/{agent}/{form}": f"/agents/{agent}" for form in ("message", "mode", "stop", "compact")},
        **{f"/agents/{agent}/memory/{form}": f"/agents/{agent}/memory"
           for form in ("fragments", "kv", "import", "consolidate")},
        **{f"/agents/{agent}/memory/graph/{form}": f"/agents/{agent}/memory/graph" for form in ("entities", "relations")},
        "/approvals/a1/approve": "/approvals", "/logout": "/",
        f"/triggers/{trigger}/edit": "/triggers", f"/triggers/{trigger}/enable": "/triggers",
        f"/keys/{key}/edit": "/keys", f"/keys/{key}/enable": 404,
        "/usage/budget": "/usage", "/providers/url": "/providers", "/providers/openai/test": "/providers",
        "/providers/openai/key": "/providers",
        "/channels/telegram/configure": "/channels/telegram", "/channels/telegram/test": "/channels/telegram",
        "/mcp-servers/reload": "/mcp-servers", "/settings/reload": "/settings", "/setup/provider": "/setup",
        "/setup/default": "/setup", "/skills/install": "/skills", "/skills/reload": "/skills",
        **{f"/schedules/{job}/{form}": f"/schedules/{job}" for form in ("edit", "enable", "disable", "run")},
        f"/workflows/{workflow}/run": f"/workflows/{workflow}", "/workflows/runs/r1/cancel": "/workflows/runs/r1"}
    task = kernel.tasks.post("formed task", "")["id"]
    rules = [r for r in client.application.url_map.iter_rules() if r.endpoint.startswith("pages.")]
    pages = {r.rule for r in rules if "GET" in r.methods and "POST" not in r.methods}
    answered = {}
    for rule in rules:
        if "POST" not in rule.methods or rule.rule in pages:  # (a list or a form's own page)
            continue
        named = {"name": "openai"} if rule.rule.startswith("/providers/") else {}
        path = rule.build({**values, "task_id": task, **named}, append_unknown=False)[1]
        r = page(client, path)
        answered[path] = r.headers["Location"].split("?")[0] if r.status_code == 303 else r.status_code
    assert {path: to for path, to in answered.items() if to != 200} == leads_to


# -- CSRF ----------------------------------------------------------------------------------

def test_posts_without_valid_csrf_token_are_refused_and_change_nothing(dash) -> None:
    client, kernel = dash
    agent_id = spawn(kernel)
    page(client, "/agents")  # the browser holds a session cookie
    other_token = "0" * 64
    for data in ({}, {"csrf_token": other_token}):
        for path, form in [(f"/agents/{agent_id}/mode", {"mode": "Manual"}),
                           (f"/agents/{agent_id}/kill", {}),
                           (f"/agents/{agent_id}/message", {"message": "hi"}),
                           ("/agents", {"manifest_toml": 'name = "sneaky"\n'})]:
            r = post(client, path, {**form, **data})
            assert r.status_code == 403, path
            assert r.mimetype == "text/html" and "CSRF" in r.get_data(as_text=True)
    handle = kernel.agents.get(agent_id)
    assert handle.mode == "Auto" and kernel.agents.by_name("sneaky") is None
    assert kernel.agents.session(handle)["messages"] == []
    # A token from another session does not work either.
    token = csrf(client)
    client.delete_cookie("agentd_session")
    assert post(client, f"/agents/{agent_id}/mode", {"mode": "Manual", "csrf_token": token}).status_code == 403
    # The right token does.
    token = csrf(client)
    assert post(client, f"/agents/{agent_id}/mode", {"mode": "Observe", "csrf_token": token}).status_code == 303
    assert kernel.agents.get(agent_id).mode == "Observe"


def test_agent_actions_with_token(dash) -> None:
    client, kernel = dash
    agent_id = spawn(kernel)
    token = csrf(client)
    post(client, f"/agents/{agent_id}/message", {"message": "one", "csrf_token": token})
    said = {}
    for action in ("stop", "compact", "reset"):
        confirmed = {"confirm": "yes"} if action == "reset" else {}
        r = post(client, f"/agents/{agent_id}/{action}", {"csrf_token": token, **confirmed})
        assert r.status_code == 303 and r.headers["Location"].startswith(f"/agents/{agent_id}?note=")
        said[action] = note_of(page(client, r.headers["Location"]).get_data(as_text=True))
        if action == "compact":  # the reset asks first, and clears nothing until confirmed
            r = post(client, f"/agents/{agent_id}/reset", {"csrf_token": token})
            assert (r.status_code, r.headers["Location"]) == (303, f"/agents/{agent_id}/reset")
            html = page(client, f"/agents/{agent_id}/reset").get_data(as_text=True)
            assert "<h1>Reset the session of helper?</h1>" in html and 'name="confirm" value="yes"' in html
            assert kernel.agents.session(kernel.agents.get(agent_id))["messages"] != []
    assert said == {"stop": "agent helper: nothing was running",
                    "compact": "agent helper: no compaction needed (2 messages)",
                    "reset": "agent helper: session reset"}
    assert kernel.agents.session(kernel.agents.get(agent_id))["messages"] == []
    r = post(client, f"/agents/{agent_id}/mode", {"mode": "Sideways", "csrf_token": token})
    assert r.status_code == 400 and "invalid mode" in r.get_data(as_text=True)
    r = post(client, f"/agents/{agent_id}/kill", {"csrf_token": token})
    assert r.status_code == 303 and r.headers["Location"] == f"/agents/{agent_id}/kill"
    assert page(client, f"/agents/{agent_id}").status_code == 200, "BUG: killed without confirmation"
    html = page(client, f"/agents/{agent_id}/kill").get_data(as_text=True)
    assert "Kill agent helper?" in html and 'name="confirm" value="yes"' in html
    r = post(client, f"/agents/{agent_id}/kill", {"csrf_token": token, "confirm": "yes"})
    assert r.status_code == 303 and r.headers["Location"].startswith("/agents?note=")
    assert page(client, f"/agents/{agent_id}").status_code == 404
    html = page(client, r.headers["Location"]).get_data(as_text=True)
    assert 'id="page-note"' in html and "agent helper was killed" in html


def test_spawn_form_shows_errors_inline_and_spawns(dash) -> None:
    client, kernel = dash
    token = csrf(client)
    r = post(client, "/agents", {"manifest_toml": 'name = "bad name!"\n', "csrf_token": token})
    assert r.status_code == 400 and r.mimetype == "text/html"
    html = r.get_data(as_text=True)
    assert "invalid manifest format: name" in html and "bad name!" in html and "<h1>Agents" in html
    r = post(client, "/agents", {"manifest_toml": 'name = "fresh"\nprofile = "minimal"\n', "csrf_token": token})
    assert r.status_code == 303
    handle = kernel.agents.by_name("fresh")
    assert r.headers["Location"].startswith(f"/agents/{handle.id}?note=")
    assert "agent fresh spawned" in page(client, r.headers["Location"]).get_data(as_text=True)
    # A provider without a key does not stop the spawn; the agent's page says what to set.
    r = post(client, "/agents", {"manifest_toml": 'name = "keyless"\n[model]\nprovider = "groq"\n'
                                                  'model = "llama-3.3-70b-versatile"\n', "csrf_token": token})
    handle = kernel.agents.by_name("keyless")
    assert r.status_code == 303 and r.headers["Location"].startswith(f"/agents/{handle.id}?note=")
    html = page(client, r.headers["Location"]).get_data(as_text=True)
    assert ("provider groq has no API key: set GROQ_API_KEY or POST /api/providers/groq/key" in html
            and 'id="page-note"' in html)
    r = post(client, "/agents", {"manifest_toml": 'name = "fresh"\n', "csrf_token": token})
    assert r.status_code == 409


def test_approvals_page_decides_with_token(dash) -> None:
    client, kernel = dash
    agent_id = spawn(kernel)
    approval = kernel.approvals.request(agent_id, "helper", "file_write", {"path": XSS})
    html = page(client, "/approvals").get_data(as_text=True)
    assert "file_write" in html and f"/approvals/{approval.id}/approve" in html and XSS not in html
    assert f"/approvals/{approval.id}/approve" in page(client, f"/agents/{agent_id}").get_data(as_text=True)
    assert post(client, f"/approvals/{approval.id}/approve", {}).status_code == 403
    assert approval.decision is None
    r = post(client, f"/approvals/{approval.id}/approve", {"csrf_token": token_of(html), "back": f"agent:{agent_id}"})
    assert r.status_code == 303 and r.headers["Location"].startswith(f"/agents/{agent_id}?note=")
    assert note_of(page(client, r.headers["Location"]).get_data(as_text=True)) == "helper: file_write approved"
    assert approval.decision == "approved"
    second = kernel.approvals.request(agent_id, "helper", "shell_exec", {})
    r = post(client, f"/approvals/{second.id}/reject", {"csrf_token": token_of(html)})
    assert r.status_code == 303 and r.headers["Location"].startswith("/approvals?note=")
    assert second.decision == "rejected"
    assert note_of(page(client, r.headers["Location"]).get_data(as_text=True)) == "helper: shell_exec rejected"
    # Decided meanwhile (in a chat, another tab): the page says so, and the decision stands.
    r = post(client, f"/approvals/{second.id}/approve", {"csrf_token": token_of(html)})
    assert r.status_code == 303 and r.headers["Location"].startswith("/approvals?note=")
    assert note_of(page(client, r.headers["Location"]).get_data(as_text=True)) == \
        f"approval {second.id} is no longer pending: approval already rejected"
    assert second.decision == "rejected"
    r = post(client, f"/approvals/{approval.id}/reject", {"csrf_token": token_of(html), "back": f"agent:{agent_id}"})
    assert r.status_code == 303 and r.headers["Location"].startswith(f"/agents/{agent_id}?note=")
    assert note_of(page(client, r.headers["Location"]).get_data(as_text=True)) == \
        f"approval {approval.id} is no longer pending: approval already approved"
    assert approval.decision == "approved"
    # Gone from the queue (a timeout, a restart): the same page, naming the likely reasons.
    r = post(client, "/approvals/no-such-approval/approve", {"csrf_token": token_of(html)})
    assert r.status_code == 303 and note_of(page(client, r.headers["Location"]).get_data(as_text=True)) == \
        "approval no-such-approval is no longer pending: it was decided elsewhere or timed out"


# -- login ---------------------------------------------------------------------------------

def cookie_header(response) -> str:
    cookies = [v for k, v in response.headers.items() if k == "Set-Cookie" and v.startswith("agentd_session=")]
    assert len(cookies) == 1, response.headers
    return cookies[0]


@pytest.mark.parametrize("target", ["/\t/evil.example", "/\n/evil.example", "/\\evil.example", "//evil.example"])
def test_login_never_redirects_off_the_site(keyed, target: str) -> None:
    client, _ = keyed
    token = token_of(client.get("/login", environ_base=REMOTE).get_data(as_text=True))
    r = client.post("/login", data={"api_key": KEY, "csrf_token": token, "next": target}, environ_base=REMOTE)
    assert (r.status_code, r.headers["Location"]) == (303, "/"), target


def test_login_flow_and_cookie_flags(keyed) -> None:
    client, kernel = keyed
    r = client.get("/agents?x=1", environ_base=REMOTE)
    assert r.status_code == 303 and r.headers["Location"] == "/login?next=/agents?x%3D1"
    for path in ("/", "/usage", "/approvals"):
        assert client.get(path, environ_base=REMOTE).status_code == 303
    assert client.get("/static/app.js", environ_base=REMOTE).status_code == 200
    r = client.get("/login?next=/agents", environ_base=REMOTE)
    assert r.status_code == 200 and 'name="api_key"' in r.get_data(as_text=True)
    token = token_of(r.get_data(as_text=True))
    # Wrong key: the form again, 401, nothing set.
    r = client.post("/login", data={"api_key": "wrong", "csrf_token": token, "next": "/agents"},
                    environ_base=REMOTE)
    assert r.status_code == 401 and "invalid API key" in r.get_data(as_text=True)
    assert "Set-Cookie" not in r.headers
    assert client.get("/", environ_base=REMOTE).status_code == 303
    # The session's post without its token is refused, the right key or not.
    r = client.post("/login", data={"api_key": KEY, "next": "/agents"}, environ_base=REMOTE)
    assert r.status_code == 403 and "missing or invalid CSRF token" in r.get_data(as_text=True)
    assert client.get("/", environ_base=REMOTE).status_code == 303
    # Right key: a new session cookie, never the key.
    r = client.post("/login", data={"api_key": KEY, "csrf_token": token, "next": "/agents"}, environ_base=REMOTE)
    assert r.status_code == 303 and r.headers["Location"] == "/agents"
    cookie = cookie_header(r)
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie
    assert KEY not in cookie
    assert client.get("/agents", environ_base=REMOTE).status_code == 200
    # The cookie authenticates the JSON API for the dashboard's own scripts...
    assert client.get("/api/status", environ_base=REMOTE).status_code == 200
    # ...but a change through the API needs the CSRF header too.
    body = {"manifest_toml": 'name = "viacookie"\n'}
    r = client.post("/api/agents", json=body, environ_base=REMOTE)
    assert r.status_code == 403 and r.is_json and "CSRF" in r.get_json()["error"]
    assert kernel.agents.by_name("viacookie") is None
    token = token_of(client.get("/agents", environ_base=REMOTE).get_data(as_text=True))
    r = client.post("/api/agents", json=body, headers={"X-CSRF-Token": token}, environ_base=REMOTE)
    assert r.status_code == 201
    # Logout needs the token, then the old cookie is worthless even when replayed.
    session_value = cookie.split(";", 1)[0].split("=", 1)[1]
    assert client.post("/logout", environ_base=REMOTE).status_code == 403
    r = client.post("/logout", data={"csrf_token": token}, environ_base=REMOTE)
    assert r.status_code == 303 and r.headers["Location"] == "/login"
    assert "agentd_session=;" in cookie_header(r)
    client.set_cookie("agentd_session", session_value)
    assert client.get("/", environ_base=REMOTE).status_code == 303
    assert client.get("/api/status", environ_base=REMOTE).status_code == 401


def test_login_redirects_keep_a_proxy_prefix(keyed) -> None:
    client, _ = keyed
    prefix = {"base_url": "http://localhost/agentd", "environ_base": REMOTE}
    r = client.get("/usage", **prefix)
    assert r.status_code == 303 and r.headers["Location"] == "/agentd/login?next=/usage"
    html = client.get("/login?next=/usage", **prefix).get_data(as_text=True)
    assert 'action="/agentd/login"' in html
    r = client.post("/login", data={"api_key": KEY, "next": "/usage", "csrf_token": token_of(html)}, **prefix)
    assert r.status_code == 303 and r.headers["Location"] == "/agentd/usage"
    assert "Path=/agentd" in cookie_header(r)


def test_the_api_page_keeps_a_proxy_prefix_and_the_layout(keyed) -> None:
    client, _ = keyed
    prefix = {"base_url": "http://localhost/agentd", "environ_base": REMOTE}
    r = client.get("/api", **prefix)
    assert (r.status_code, r.headers["Location"]) == (303, "/agentd/login?next=/api")
    html = client.get("/api", headers={"Authorization": f"Bearer {KEY}"}, **prefix).get_data(as_text=True)
    for needle in ('href="/agentd/static/app.css"', 'href="/agentd/api/openapi.json"', 'href="/agentd/agents"',
                   'href="/agentd/"'):
        assert needle in html, needle
    assert 'href="/"' not in html and "style.css" not in html


def test_login_cookie_is_secure_over_https_and_next_is_local(keyed) -> None:
    client, _ = keyed
    r = client.post("/login", data={"api_key": KEY, "next": "//evil.example/x"}, environ_base=REMOTE,
                    base_url="https://localhost")
    assert r.status_code == 303 and r.headers["Location"] == "/"
    assert "Secure" in cookie_header(r)


def test_forged_or_keyless_cookie_does_not_authenticate(keyed, tmp_path: Path) -> None:
    client, _ = keyed
    client.set_cookie("agentd_session", "eyJzaWQiOiJ4IiwiYXV0aCI6dHJ1ZX0.forged.signature")
    assert client.get("/", environ_base=REMOTE).status_code == 303
    assert client.get("/api/status", environ_base=REMOTE).status_code == 401
    # A session signed under another key is not valid here.
    other, other_kernel = build(tmp_path / "other", api_key="another-key")
    try:
        r = other.post("/login", data={"api_key": "another-key"}, environ_base=REMOTE)
        value = cookie_header(r).split(";", 1)[0].split("=", 1)[1]
    finally:
        other_kernel.close()
    client.set_cookie("agentd_session", value)
    assert client.get("/", environ_base=REMOTE).status_code == 303


def test_bearer_key_still_opens_pages(keyed) -> None:
    client, _ = keyed
    r = client.get("/usage", headers={"Authorization": f"Bearer {KEY}"}, environ_base=REMOTE)
    assert r.status_code == 200 and "<svg" in r.get_data(as_text=True)


# -- usage chart, catalog, workflows, channels ------------------------------------------------

def test_usage_page_draws_spend_per_day(dash) -> None:
    client, kernel = dash
    agent_id = spawn(kernel)
    kernel.metering.record(agent_id, "helper", "openai", "gpt-4o", 1_000_000, 100_000)
    html = page(client, "/usage").get_data(as_text=True)
    svg = re.search(r"<svg class=\"bars\".*?</svg>", html, re.S).group(0)
    bars = re.findall(r'<rect class="bar"[^>]*height="([0-9.]+)"><title>([0-9-]+): \$([0-9.,]+)</title>', svg)
    assert bars, svg
    heights = [float(h) for h, _day, _cost in bars]
    assert max(heights) == 146.0 and heights.count(146.0) == 1  # today's bar is the tallest
    cost = kernel.metering.totals(*kernel.metering.period(None, None))["total_cost_usd"]
    assert cost > 0 and f"${cost:,.2f}" in html
    assert any(float(c.replace(",", "")) == round(cost, 2) for _h, _d, c in bars if c != "0.0000")
    assert "gpt-4o" in html and "1,000,000" in html


def test_models_filter_by_provider_and_tier(dash) -> None:
    client, kernel = dash
    html = page(client, "/models?provider=anthropic").get_data(as_text=True)
    rows = re.findall(r"<tr><td title=\"[^\"]+\">[^<]*</td><td>([^<]+)</td>", html)
    assert rows and set(rows) == {"anthropic"}
    expected = len(kernel.catalog.models(provider="anthropic", tier="fast"))
    html = page(client, "/models?provider=anthropic&tier=fast").get_data(as_text=True)
    assert len(re.findall(r"<tr><td title=", html)) == expected


def test_provider_test_button_reports_in_page(dash) -> None:
    client, _ = dash
    token = csrf(client, "/providers")
    r = post(client, "/providers/openai/test", {"csrf_token": token})
    assert r.status_code == 303 and r.headers["Location"].startswith("/providers?note=")
    # The result is a page of its own: refreshing it shows it again and runs nothing.
    for _ in range(2):
        shown = page(client, r.headers["Location"])
        assert shown.status_code == 200 and "openai: reached in" in shown.get_data(as_text=True)
    r = post(client, "/providers/groq/test", {"csrf_token": token})
    html = page(client, r.headers["Location"]).get_data(as_text=True)
    assert "groq: no API key for groq: set GROQ_API_KEY" in html and 'class="error"' in html
    r = post(client, "/providers/nosuch/test", {"csrf_token": token})
    assert r.status_code == 404 and r.mimetype == "text/html"
    # A message in the URL that agentd did not sign is not shown.
    html = page(client, "/providers?note=forged").get_data(as_text=True)
    assert 'id="page-note"' not in html


def test_provider_key_and_url_forms(dash, monkeypatch) -> None:
    client, kernel = dash
    # (Restored after the test: the form sets the key in this process's environment.)
    monkeypatch.setenv("GROQ_API_KEY", "unset")
    monkeypatch.delenv("GROQ_API_KEY")
    token = csrf(client, "/providers")
    html = page(client, "/providers").get_data(as_text=True)
    assert 'action="/providers/groq/key"' in html and 'name="api_key"' in html
    r = post(client, "/providers/groq/key", {"csrf_token": token, "api_key": "  gsk-dashboard-secret "})
    assert r.status_code == 303 and r.headers["Location"].startswith("/providers?note=")
    shown = page(client, r.headers["Location"]).get_data(as_text=True)
    assert "groq: key saved" in shown and "gsk-dashboard-secret" not in shown
    assert os.environ["GROQ_API_KEY"] == "gsk-dashboard-secret"
    assert "GROQ_API_KEY=gsk-dashboard-secret" in kernel.config.secrets_path.read_text()
    assert {p["id"]: p["auth_status"] for p in kernel.providers.listing()}["groq"] == "configured"
    # A bad key is refused with the API's message; nothing changes.
    r = post(client, "/providers/groq/key", {"csrf_token": token, "api_key": "two\nlines"})
    assert "groq: api_key must be a single line" in page(client, r.headers["Location"]).get_data(as_text=True)
    assert os.environ["GROQ_API_KEY"] == "gsk-dashboard-secret"
    listed = page(client, "/providers").get_data(as_text=True)
    assert '<a class="button bad" href="/providers/groq/key?remove=1">Remove…</a>' in listed
    r = asks_first(client, "/providers/groq/key", token, "Remove the groq API key?",
                   lambda: "GROQ_API_KEY" in os.environ, remove="1")
    assert "groq: key removed" in page(client, r.headers["Location"]).get_data(as_text=True)
    assert "GROQ_API_KEY" not in os.environ and "gsk-dashboard-secret" not in kernel.config.secrets_path.read_text()
    # Without the CSRF token nothing is saved.
    assert post(client, "/providers/groq/key", {"api_key": "gsk-x"}).status_code == 403
    assert "GROQ_API_KEY" not in os.environ
    # The base URL form: the same check as PUT /api/providers/{name}/url.
    r = post(client, "/providers/url", {"csrf_token": token, "provider": "ollama",
                                        "base_url": "http://127.0.0.1:11999/v1"})
    assert "ollama: base URL set to http://127.0.0.1:11999/v1" in page(client, r.headers["Location"]).get_data(as_text=True)
    assert kernel.providers.base_url(kernel.providers.get("ollama")) == "http://127.0.0.1:11999/v1"
    r = post(client, "/providers/url", {"csrf_token": token, "provider": "ollama", "base_url": "ftp://x"})
    html = page(client, r.headers["Location"]).get_data(as_text=True)
    assert "ollama: " in html
    assert '<option value="ollama" selected>' in html and 'value="ftp://x"' in html, "what was typed is kept"
    assert 'value="ftp://x"' not in page(client, "/providers").get_data(as_text=True)
    r = post(client, "/providers/url", {"csrf_token": token, "provider": "nosuch", "base_url": "http://x"})
    assert "nosuch: " in page(client, r.headers["Location"]).get_data(as_text=True)
    r = post(client, "/providers/url", {"csrf_token": token, "provider": "", "base_url": "http://x"})
    assert "choose a provider</" in page(client, r.headers["Location"]).get_data(as_text=True)


def test_budget_form_sets_the_monthly_limit(dash) -> None:
    client, kernel = dash
    token = csrf(client, "/usage")
    assert 'action="/usage/budget"' in page(client, "/usage").get_data(as_text=True)
    r = post(client, "/usage/budget", {"csrf_token": token, "limit_usd": "12.5"})
    assert r.status_code == 303 and r.headers["Location"].startswith("/usage?note=")
    assert "budget: limit set to $12.5 a month" in page(client, r.headers["Location"]).get_data(as_text=True)
    assert kernel.metering.limit_usd == 12.5
    for bad in ("-1", "nan", "lots"):
        r = post(client, "/usage/budget", {"csrf_token": token, "limit_usd": bad, "alert_levels": "0.5, 0.9"})
        html = page(client, r.headers["Location"]).get_data(as_text=True)
        assert "is not an amount in USD of 0 or more" in html
        assert f'name="limit_usd" min="0" step="any" required value="{bad}"' in html and 'value="0.5, 0.9"' in html
    r = post(client, "/usage/budget", {"csrf_token": token, "limit_usd": "20", "alert_levels": "0.5, 2"})
    html = page(client, r.headers["Location"]).get_data(as_text=True)
    assert "alert levels &#39;0.5, 2&#39; must be" in html and 'required value="20"' in html and 'value="0.5, 2"' in html
    assert kernel.metering.limit_usd == 12.5
    assert 'required value="12.5"' in page(client, "/usage").get_data(as_text=True), "the saved limit otherwise"
    r = post(client, "/usage/budget", {"csrf_token": token, "limit_usd": "0"})
    assert "budget: no limit" in page(client, r.headers["Location"]).get_data(as_text=True)
    assert kernel.metering.limit_usd == 0


def test_provider_test_failure_names_the_provider_once(dash, monkeypatch) -> None:
    client, kernel = dash
    token = csrf(client, "/providers")
    kernel.providers.set_url("mistral", "http://127.0.0.1:9")
    monkeypatch.setenv("MISTRAL_API_KEY", "test-mistral")
    r = post(client, "/providers/mistral/test", {"csrf_token": token})
    html = page(client, r.headers["Location"]).get_data(as_text=True)
    assert "mistral: cannot reach http://127.0.0.1:9" in html and "mistral: mistral:" not in html


def finished(kernel: Kernel, run_id: str) -> dict:
    """A run started from a page, once it has ended (it runs on in the daemon)."""
    for _ in range(200):
        run = kernel.workflows.run_detail(run_id)
        if run["state"]["status"] in ("completed", "failed"):
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} still {run['state']['status']}")


def test_workflow_pages_and_run_form(dash) -> None:
    client, kernel = dash
    spawn(kernel, "writer")
    workflow_id = kernel.workflows.create({"name": "greet", "description": "says hi",
                                           "steps": [{"name": "first", "agent_name": "writer",
                                                      "prompt": "say {{input}}"}]})
    assert "greet" in page(client, "/workflows").get_data(as_text=True)
    html = page(client, f"/workflows/{workflow_id}").get_data(as_text=True)
    assert "first" in html and "Not run yet" in html
    r = post(client, f"/workflows/{workflow_id}/run", {"input": "hello", "csrf_token": token_of(html)})
    assert r.status_code == 303 and r.headers["Location"].startswith("/workflows/runs/")
    run_id = r.headers["Location"].split("/")[3].split("?")[0]
    finished(kernel, run_id)
    html = page(client, f"/workflows/{workflow_id}").get_data(as_text=True)
    assert 'id="run-output">echo: say hello<' in html and "completed" in html
    assert "greet" in page(client, "/").get_data(as_text=True)  # recent runs on the overview


def test_channels_page_without_and_with_runtime(dash) -> None:
    client, kernel = dash
    runtime = getattr(kernel, "channels", None)
    try:
        # Without the channels runtime: the catalogue alone, saying so.
        kernel.channels = None
        r = page(client, "/channels")
        assert r.status_code == 200 and "channel runtime is not part of this daemon yet" in r.get_data(as_text=True)
        # With it: its GET /api/channels items.
        kernel.channels = SimpleNamespace(list=lambda: [
            {"name": "irc", "display_name": "IRC", "category": "messaging", "description": XSS,
             "configured": True, "active": True},
            {"name": "ntfy", "display_name": "ntfy", "category": "notifications", "description": "push",
             "configured": False, "active": False}])
        html = page(client, "/channels").get_data(as_text=True)
        assert "1 / 2 configured" in html and "IRC" in html and "active" in html and XSS not in html
        assert "not part of this daemon" not in html
        html = page(client, "/channels?category=notifications").get_data(as_text=True)
        assert "ntfy" in html and "IRC" not in html
        assert "IRC" in page(client, "/").get_data(as_text=True)
    finally:
        kernel.channels = runtime


def test_memory_page_with_and_without_semantic_memory(dash) -> None:
    client, kernel = dash
    agent_id = spawn(kernel)
    service = getattr(kernel, "memory", None)
    seen: list = []

    def fake_page(agent: str, limit: int, offset: int, owner: str | None) -> dict:
        seen.append((agent, limit, offset))
        assert owner is None  # the admin's login: everyone's exchanges
        items = [{"id": str(i), "content": f"fact {i} {XSS}", "source": "user_provided", "scope": "semantic",
                  "confidence": 1.0, "created_at": "2026-01-02T03:04:05+00:00"} for i in range(offset, min(offset + limit, 60))]
        return {"memories": items, "total": 60}

    try:
        kernel.memory = None
        html = page(client, f"/agents/{agent_id}/memory").get_data(as_text=True)
        assert "Semantic memory is not available on this daemon." in html
        kernel.memory = SimpleNamespace(page=fake_page)
        html = page(client, f"/agents/{agent_id}/memory").get_data(as_text=True)
        assert "fact 0 " in html and "fact 49 " in html and "fact 50 " not in html and XSS not in html
        assert "1–50 of 60" in html and "2026-01-02 03:04:05" in html
        html = page(client, f"/agents/{agent_id}/memory?page=2").get_data(as_text=True)
        assert "fact 50 " in html and "51–60 of 60" in html
        assert seen == [(agent_id, 50, 0), (agent_id, 50, 50)]
        html = page(client, f"/agents/{agent_id}/memory?page=9").get_data(as_text=True)
        assert "fact 50 " in html and "51–60 of 60" in html, "past the end: the last page"
        assert seen[2:] == [(agent_id, 50, 400), (agent_id, 50, 50)]
    finally:
        kernel.memory = service


def test_memory_page_pages_key_value_entries(dash) -> None:
    client, kernel = dash
    agent_id = spawn(kernel)
    for i in range(230):
        kernel.kv.set(agent_id, f"key-{i:03d}", {"n": i})
    keys = lambda html: re.findall(r"<code>key-(\d{3})</code>", html)  # noqa: E731
    html = page(client, f"/agents/{agent_id}/memory").get_data(as_text=True)
    assert keys(html) == [f"{i:03d}" for i in range(100)] and '<span class="count">230</span>' in html
    assert f'href="/agents/{agent_id}/memory?kv_page=2" rel="next"' in html and "page 1 of 3" in html
    html = page(client, f"/agents/{agent_id}/memory?kv_page=3").get_data(as_text=True)
    assert keys(html) == [f"{i:03d}" for i in range(200, 230)] and "page 3 of 3" in html
    assert f'href="/agents/{agent_id}/memory?kv_page=2" rel="prev"' in html and 'rel="next">next' not in html
    assert keys(page(client, f"/agents/{agent_id}/memory?kv_page=7").get_data(as_text=True)) == keys(html)


# -- errors, prefix, budgets, labels ------------------------------------------------------------

def test_error_pages_are_html_and_api_errors_stay_json(dash) -> None:
    client, _ = dash
    for path, status in (("/nope", 404), ("/agents/not-a-uuid", 404),
                         ("/agents/00000000-0000-4000-8000-000000000000", 404),
                         ("/workflows/00000000-0000-4000-8000-000000000000", 404)):
        r = page(client, path)
        assert r.status_code == status and r.mimetype == "text/html", path
        html = r.get_data(as_text=True)
        assert f"<h1>Error {status}</h1>" in html and "Traceback" not in html
        assert "Set-Cookie" not in r.headers  # an error never starts a session
    r = client.delete("/agents", environ_base=LOCAL)
    assert r.status_code == 405 and r.mimetype == "text/html"
    r = page(client, "/api/agents/00000000-0000-4000-8000-000000000000")
    assert r.status_code == 404 and r.get_json() == {"error": "agent not found"}
    r = page(client, "/v1/nope")
    assert r.get_json()["error"]["type"] == "invalid_request_error"


def test_links_follow_a_proxy_prefix(dash) -> None:
    client, kernel = dash
    agent_id = spawn(kernel)
    html = client.get("/agents", base_url="http://localhost/agentd", environ_base=LOCAL).get_data(as_text=True)
    assert 'href="/agentd/static/app.css"' in html and 'src="/agentd/static/app.js"' in html
    assert f'href="/agentd/agents/{agent_id}"' in html and 'action="/agentd/agents"' in html
    assert 'data-approvals-url="/agentd/api/approvals"' in html
    assert not re.search(r'(href|src|action)="/(?!agentd/)', html)
    html = client.get(f"/agents/{agent_id}", base_url="http://localhost/agentd",
                      environ_base=LOCAL).get_data(as_text=True)
    assert f'data-stream-url="/agentd/api/agents/{agent_id}/message/stream"' in html
    r = client.post(f"/agents/{agent_id}/mode", data={"mode": "Manual", "csrf_token": token_of(html)},
                    base_url="http://localhost/agentd", environ_base=LOCAL)
    assert r.status_code == 303 and r.headers["Location"].startswith(f"/agentd/agents/{agent_id}?note=")


def test_page_weight_budgets(dash) -> None:
    """First load of every page: HTML + CSS + JS <= 60 KB, JavaScript <= 10 KB."""
    client, kernel = dash
    agent_id = spawn(kernel)
    css = len(page(client, "/static/app.css").data)
    js = len(page(client, "/static/app.js").data)
    assert js <= 10 * 1024
    for path in ("/", "/agents", f"/agents/{agent_id}", f"/agents/{agent_id}/memory", f"/agents/{agent_id}/kill",
                 "/approvals", "/usage",
                 "/models", "/providers", "/workflows", "/channels", "/channels/slack", "/channels/telegram"):
        html = len(page(client, path).data)
        assert html + css + js <= 60 * 1024, f"{path}: {html} + {css} + {js} bytes"


class _Controls(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.labelled: set[str] = set()
        self.controls: list[tuple[str, dict]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "label" and a.get("for"):
            self.labelled.add(a["for"])
        if tag in ("input", "select", "textarea") and a.get("type") != "hidden":
            self.controls.append((tag, a))


def test_form_controls_have_labels(dash) -> None:
    client, kernel = dash
    agent_id = spawn(kernel)
    for path in ("/agents", f"/agents/{agent_id}", "/models", "/channels", "/approvals"):
        parser = _Controls()
        parser.feed(page(client, path).get_data(as_text=True))
        assert parser.controls or path in ("/approvals", "/channels")
        for tag, attrs in parser.controls:
            assert attrs.get("id") in parser.labelled or attrs.get("aria-label"), f"{path}: unlabelled {tag} {attrs}"
