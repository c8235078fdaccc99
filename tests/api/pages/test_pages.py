"""The dashboard's helper functions (agentd/api/pages/*.py) exactly: the daemon's own app
(`create_app` over a real kernel) in process; helpers called inside a request context where
their inputs are request arguments, pages rendered through Flask's test client where their
output is the page. Pager boundaries at 100 and 101 agents, `next` near misses, the per-day
usage list, the channel runtime's method order, the newest workflow run shown in full.
Page flows (CSRF, login, escaping) are tests/api/pages/test_dashboard.py."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterator
from urllib.parse import urlencode

import pytest
from markupsafe import escape

from agentd.api import create_app
from agentd.api import pages
from agentd.api.pages import agents as agent_pages
from agentd.api.pages import auth as auth_pages
from agentd.api.pages import catalog as catalog_pages
from agentd.api.pages import channels as channel_pages
from agentd.api.pages import confirm as confirm_pages
from agentd.api.pages import memory as memory_pages
from agentd.config import parse_config
from agentd.kernel import Kernel
from agentd.timestamps import utcnow
from support import put_session, with_test_db

LOCAL = {"REMOTE_ADDR": "127.0.0.1"}
KEY = "pages-key-0123456789"


def build(home: Path, fake=None, **extra) -> Kernel:
    data: dict = {"api": {"rate_limit_per_second": 10000, "rate_limit_burst": 10000}}
    if fake is not None:
        data.update({"llm": {"timeout_secs": 5, "retries": 1},
                     "default_model": {"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
                     "provider_urls": {"openai": fake.openai_base}})
    data.update(extra)
    return Kernel.open(parse_config(with_test_db(data, home), home))


@pytest.fixture(scope="module")
def dash(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[tuple]:
    patch = pytest.MonkeyPatch()
    patch.setenv("OPENAI_API_KEY", "test-openai")
    kernel = build(tmp_path_factory.mktemp("pages"), fake_llm)
    app = create_app(kernel)
    yield app, kernel
    kernel.close()
    patch.undo()


def spawn(kernel: Kernel, name: str) -> str:
    return kernel.agents.spawn(f'name = "{name}"\n[model]\nprovider = "default"\nmodel = "default"\n').id


def token_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', html)
    assert match, "page has no CSRF field"
    return match.group(1)


def asks_first(client, path: str, token: str, question: str, exists: Callable[[], bool], **fields: str):
    """A destructive action's flow (pages/confirm.py): its POST without `confirm` is sent to the
    confirmation page and `exists()` stays true, the page asks `question` and posts `fields`
    back with `confirm=yes`. Returns the confirmed POST's response."""
    here = path + ("?" + urlencode(fields) if fields else "")
    r = client.post(path, data={"csrf_token": token, **fields}, environ_base=LOCAL)
    assert (r.status_code, r.headers["Location"]) == (303, here)
    html = client.get(here, environ_base=LOCAL).get_data(as_text=True)
    assert f"<h1>{escape(question)}</h1>" in html and f'action="{path}"' in html
    assert 'name="confirm" value="yes"' in html and exists(), "BUG: destroyed without confirmation"
    for name, value in fields.items():
        assert f'<input type="hidden" name="{name}" value="{escape(value)}">' in html
    assert client.post(path, data={"confirm": "yes", **fields}, environ_base=LOCAL).status_code == 403
    assert exists(), "BUG: destroyed without the CSRF token"
    return client.post(path, data={"csrf_token": token, "confirm": "yes", **fields}, environ_base=LOCAL)


# -- pages/__init__.py -----------------------------------------------------------------------------------------------

def test_see_other_is_a_303_to_the_page(dash) -> None:
    app, _ = dash
    with app.test_request_context("/agents", base_url="http://localhost/prefix"):
        r = pages.see_other("pages.agent_page", agent_id="abc")
        assert (r.status_code, r.location) == (303, "/prefix/agents/abc")
        assert pages.kernel() is dash[1]


# -- pages/confirm.py ------------------------------------------------------------------------------------------------

def test_ask_first_shows_the_page_and_lets_only_a_confirmed_post_through(dash) -> None:
    app, _ = dash
    agent_id = spawn(app.extensions["agentd.kernel"], "confirm-target")
    ask = ("Go?", "It is gone for good.", "Do it", "/back")
    url = f"/prefix/agents/{agent_id}/kill"
    with app.test_request_context(f"/agents/{agent_id}/kill?key=a%26b&key=c&confirm=yes",
                                  base_url="http://localhost/prefix"):
        html = confirm_pages.ask_first(*ask)
        assert "<h1>Go?</h1>\n<p>It is gone for good.</p>" in html and f'action="{url}"' in html
        assert ('<input type="hidden" name="key" value="a&amp;b"><input type="hidden" name="key" value="c">'
                '<input type="hidden" name="confirm" value="yes">') in html
        assert '<button type="submit" class="bad" id="confirm">Do it</button>' in html
        assert '<a href="/back">Cancel</a>' in html
    with app.test_request_context(f"/agents/{agent_id}/kill", method="POST", base_url="http://localhost/prefix",
                                  data={"csrf_token": "t", "key": "a&b", "confirm": "no"}):
        r = confirm_pages.ask_first(*ask)
        assert (r.status_code, r.location) == (303, url + "?key=a%26b")
    with app.test_request_context(f"/agents/{agent_id}/kill", method="POST", data={"confirm": "yes"}):
        assert confirm_pages.ask_first(*ask) is None


# -- pages/agents.py -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("query, number", [
    ("", 1), ("?page=1", 1), ("?page=2", 2), ("?page=17", 17), ("?page=0", 1), ("?page=-3", 1),
    ("?page=x", 1), ("?page=", 1), ("?page=2.5", 1), ("?pages=3", 1)])
def test_page_number(dash, query: str, number: int) -> None:
    app, _ = dash
    with app.test_request_context(f"/agents{query}"):
        assert agent_pages._page_number() == number


def test_spend_by_agent_is_this_periods_cost_per_agent(dash) -> None:
    app, kernel = dash
    spender, other = spawn(kernel, "Spender"), spawn(kernel, "quiet-one")
    before = {}
    with app.test_request_context("/agents"):
        before = agent_pages._spend_by_agent()
    assert spender not in before and other not in before
    cost = kernel.metering.record(spender, "Spender", "openai", "gpt-4o", 1_000_000, 0)
    start, end = kernel.metering.period(None, None)
    expected = {row["agent_id"]: row["spent_usd"] for row in kernel.metering.by_agent(start, end)}
    with app.test_request_context("/agents"):
        spend = agent_pages._spend_by_agent()
    assert spend == expected and other not in spend
    assert cost == pytest.approx(2.5) and spend[spender] == pytest.approx(2.5)   # gpt-4o: $2.50 per 1M input
    client = app.test_client()
    html = client.get(f"/agents/{spender}", environ_base=LOCAL).get_data(as_text=True)
    assert "<dt>Spend</dt><dd>$2.50 this month</dd>" in html
    html = client.get(f"/agents/{other}", environ_base=LOCAL).get_data(as_text=True)
    assert "<dt>Spend</dt><dd>$0.000000 this month</dd>" in html, "BUG: an agent without calls shows a spend"


def test_spend_below_a_dollar_shows_the_clis_six_decimals(dash) -> None:
    app, kernel = dash
    tiny = spawn(kernel, "tiny-spender")
    kernel.metering.record(tiny, "tiny-spender", "openai", "gpt-4o", 12, 0)  # $2.50 per 1M input
    html = app.test_client().get(f"/agents/{tiny}", environ_base=LOCAL).get_data(as_text=True)
    assert "<dt>Spend</dt><dd>$0.000030 this month</dd>" in html, "BUG: a small spend rounds away"


def _rows(html: str) -> list[str]:
    return re.findall(r'<tr><td><a href="/agents/[^"]+">([^<]+)</a>', html)


def test_agents_pager_at_100_and_101(tmp_path: Path) -> None:
    kernel = build(tmp_path)
    try:
        client = create_app(kernel).test_client()

        def get(path: str, status: int = 200) -> str:
            r = client.get(path, environ_base=LOCAL)
            assert r.status_code == status, path
            return r.get_data(as_text=True)

        html = get("/agents")
        assert "No agents yet." in html and _rows(html) == []
        for i in range(100):
            spawn(kernel, f"Agent-{i:03d}")
        html = get("/agents")
        assert len(_rows(html)) == 100 and '<span class="count">100</span>' in html
        assert 'aria-label="Pages"' not in html, "BUG: a pager for exactly one page of agents"
        spawn(kernel, "Agent-100")
        html = get("/agents")
        assert len(_rows(html)) == 100 and _rows(html)[0] == "Agent-000" and _rows(html)[-1] == "Agent-099"
        assert "1–100 of 101 (page 1 of 2)" in html and 'rel="next"' in html and 'rel="prev"' not in html
        for path in ("/agents?page=2", "/agents?page=3", "/agents?page=99"):
            html = get(path)
            assert _rows(html) == ["Agent-100"], path
            assert "101–101 of 101 (page 2 of 2)" in html and 'rel="prev"' in html and 'rel="next"' not in html
        html = get("/agents?page=0")
        assert "1–100 of 101 (page 1 of 2)" in html
        # The filter: trimmed, either case on either side, over the whole list.
        html = get("/agents?q=%20aGeNt-05%20")
        assert _rows(html) == [f"Agent-05{i}" for i in range(10)] and 'aria-label="Pages"' not in html
        assert 'value="aGeNt-05"' in html and '<span class="count">10</span>' in html
        html = get("/agents?q=AGENT&page=2")
        assert _rows(html) == ["Agent-100"] and "(page 2 of 2)" in html
        assert _rows(get("/agents?q=agent-100")) == ["Agent-100"]
        assert "No agent matches." in get("/agents?q=agent-1000")
    finally:
        kernel.close()


def test_spawn_refusals_render_the_list_with_the_manifest(dash) -> None:
    app, kernel = dash
    client = app.test_client()
    token = token_of(client.get("/agents", environ_base=LOCAL).get_data(as_text=True))
    r = client.post("/agents", data={"manifest_toml": "  \n", "csrf_token": token}, environ_base=LOCAL)
    assert r.status_code == 400
    html = r.get_data(as_text=True)
    assert '<p class="error" role="alert">invalid request: manifest_toml is required</p>' in html
    assert 'placeholder=\'name = "helper"&#10;profile = "minimal"\'>  \n</textarea>' in html
    assert '<span class="count">' in html and "<h1>Agents" in html


def test_agent_page_history_and_approvals(dash) -> None:
    app, kernel = dash
    client = app.test_client()
    agent_id, other_id = spawn(kernel, "talker"), spawn(kernel, "bystander")
    r = client.post(f"/api/agents/{agent_id}/message", json={"message": "[[reply:first answer]] first"},
                    environ_base=LOCAL)
    assert r.status_code == 200, r.get_data(as_text=True)
    mine = kernel.approvals.request(agent_id, "talker", "file_write", {"path": "mine.txt"})
    theirs = kernel.approvals.request(other_id, "bystander", "file_write", {"path": "theirs.txt"})
    try:
        r = client.get(f"/agents/{agent_id}", environ_base=LOCAL)
        assert r.status_code == 200
        html = r.get_data(as_text=True)
        assert "[[reply:first answer]] first" in html and "first answer" in html, "BUG: history not shown"
        assert "older messages not shown" not in html
        assert f"/approvals/{mine.id}/approve" in html
        assert f"/approvals/{theirs.id}/approve" not in html, "BUG: another agent's approval on this page"
    finally:
        kernel.approvals.reject(mine.id)
        kernel.approvals.reject(theirs.id)


def _store_history(kernel: Kernel, agent_id: str, count: int) -> None:
    """`count` stored messages (user and assistant in turn), as a long conversation leaves them."""
    handle = kernel.agents.get(agent_id)
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"msg-{i:03d}-end"}
                for i in range(count)]
    put_session(kernel.store, handle.session_id, messages)
    handle.session_tail = None   # read it again


@pytest.mark.parametrize("count, hidden", [(0, 0), (50, 0), (51, 1), (53, 3)])
def test_agent_page_shows_the_newest_50_messages(dash, count: int, hidden: int) -> None:
    app, kernel = dash
    agent_id = spawn(kernel, f"long-{count}")
    _store_history(kernel, agent_id, count)
    html = app.test_client().get(f"/agents/{agent_id}", environ_base=LOCAL).get_data(as_text=True)
    shown = re.findall(r"msg-(\d{3})-end", html)
    assert shown == [f"{i:03d}" for i in range(hidden, count)]
    older = f'<a href="/agents/{agent_id}?page=2" rel="next">← {hidden} older messages</a>'
    assert (older in html) == bool(hidden) and "newer messages" not in html
    assert ('id="latest"' in html) == bool(count)


def test_older_history_pages_go_back_and_forth(dash) -> None:
    app, kernel = dash
    agent_id = spawn(kernel, "long-pages")
    _store_history(kernel, agent_id, 120)
    get = lambda q: app.test_client().get(f"/agents/{agent_id}{q}", environ_base=LOCAL).get_data(as_text=True)  # noqa: E731
    page2, page3 = get("?page=2"), get("?page=3")
    assert re.findall(r"msg-(\d{3})-end", page2) == [f"{i:03d}" for i in range(20, 70)]
    assert f'<a href="/agents/{agent_id}?page=3" rel="next">← 20 older messages</a>' in page2
    assert f'<a href="/agents/{agent_id}" rel="prev">50 newer messages →</a>' in page2
    assert 'id="latest"' not in page2
    assert re.findall(r"msg-(\d{3})-end", page3) == [f"{i:03d}" for i in range(0, 20)]
    assert f'<a href="/agents/{agent_id}?page=2" rel="prev">100 newer messages →</a>' in page3
    assert "older messages" not in page3
    short = spawn(kernel, "short-pages")
    _store_history(kernel, short, 10)
    html = app.test_client().get(f"/agents/{short}?page=2", environ_base=LOCAL).get_data(as_text=True)
    assert re.findall(r"msg-(\d{3})-end", html) == [f"{i:03d}" for i in range(10)], "one page: page 2 is page 1"
    assert "newer messages" not in html and "older messages" not in html
    last = get("?page=99")  # past the end: the oldest page
    assert re.findall(r"msg-(\d{3})-end", last) == [f"{i:03d}" for i in range(0, 20)]
    assert f'<a href="/agents/{agent_id}?page=2" rel="prev">100 newer messages →</a>' in last


def test_pages_without_an_error_show_none(dash) -> None:
    app, kernel = dash
    agent_id = spawn(kernel, "plain-page")
    client = app.test_client()
    html = client.get("/agents", environ_base=LOCAL).get_data(as_text=True)
    assert 'role="alert"' not in html
    assert re.search(r"placeholder='[^']*'></textarea>", html), "BUG: the spawn form is not empty"
    html = client.get(f"/agents/{agent_id}", environ_base=LOCAL).get_data(as_text=True)
    assert 'role="alert"' not in html
    assert '<textarea id="message" name="message" rows="3" required></textarea>' in html
    assert ('<select id="mode" name="mode"><option selected>Auto</option><option>Manual</option>'
            '<option>Observe</option></select>') in html


def test_refused_action_renders_the_agent_page(dash) -> None:
    app, kernel = dash
    client = app.test_client()
    agent_id = spawn(kernel, "moded")
    token = token_of(client.get(f"/agents/{agent_id}", environ_base=LOCAL).get_data(as_text=True))
    r = client.post(f"/agents/{agent_id}/mode", data={"mode": "Sideways", "csrf_token": token}, environ_base=LOCAL)
    assert r.status_code == 400
    html = r.get_data(as_text=True)
    assert ("<p class=\"error\" role=\"alert\" id=\"page-error\">invalid mode &#39;Sideways&#39;: expected one of "
            "Auto, Manual, Observe</p>") in html
    assert f'action="/agents/{agent_id}/message"' in html, "BUG: a refused action shows an error page, not the agent"
    r = client.post(f"/agents/{agent_id}/mode", data={"mode": "Manual", "csrf_token": token}, environ_base=LOCAL)
    assert r.status_code == 303 and r.headers["Location"].startswith(f"/agents/{agent_id}?note=")
    assert "agent moded: mode set to Manual" in client.get(r.headers["Location"], environ_base=LOCAL).get_data(as_text=True)
    assert kernel.agents.get(agent_id).mode == "Manual"


def test_memories_helper() -> None:
    calls: list[tuple] = []

    def page(agent_id: str, limit: int, offset: int, owner: str | None) -> dict:
        calls.append((agent_id, limit, offset, owner))
        return {"memories": [], "total": 0}

    assert memory_pages._memories(SimpleNamespace(memory=SimpleNamespace(page=page)), "a1", 150, "key:k1") == \
        {"memories": [], "total": 0}
    assert calls == [("a1", 50, 150, "key:k1")]
    assert memory_pages._memories(SimpleNamespace(), "a1", 0, None) is None
    assert memory_pages._memories(SimpleNamespace(memory=None), "a1", 0, None) is None
    assert memory_pages._memories(SimpleNamespace(memory=SimpleNamespace()), "a1", 0, None) is None
    assert memory_pages._memories(SimpleNamespace(memory=SimpleNamespace(page="not callable")), "a1", 0, None) is None
    assert calls == [("a1", 50, 150, "key:k1")]


# -- pages/auth.py ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target, safe", [
    ("/agents", "/agents"), ("/", "/"), ("/a//b", "/a//b"), ("/agents?x=1", "/agents?x=1"),
    (None, ""), ("", ""), ("agents", ""), ("http://evil.example/", ""), ("//evil.example", ""),
    ("/\\evil.example", ""), ("\\/evil.example", ""), (" /agents", ""),
    ("/\t/evil.example", ""), ("/\n/evil.example", ""), ("/\r/evil.example", ""), ("/a b", ""),
    ("/a\\b", ""), ("/\x7f/evil.example", ""), ("/\x00", ""), ("/a!b", "/a!b")])
def test_safe_next(target, safe: str) -> None:
    assert auth_pages._safe_next(target) == safe


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[tuple]:
    kernel = build(tmp_path, api_key=KEY)
    yield create_app(kernel).test_client(), kernel
    kernel.close()


def test_login_page_session_and_next(keyed) -> None:
    client, _ = keyed
    remote = {"REMOTE_ADDR": "203.0.113.9"}
    # No cookie: the page starts an anonymous session and carries its token and `next`.
    r = client.get("/login?next=/usage", environ_base=remote)
    assert r.status_code == 200 and "agentd_session=" in r.headers.get("Set-Cookie", "")
    html = r.get_data(as_text=True)
    token = token_of(html)
    assert '<input type="hidden" name="next" value="/usage">' in html
    assert 'role="alert"' not in html, "BUG: the login form shows an error before any attempt"
    html = client.get("/login?next=//evil.example", environ_base=remote).get_data(as_text=True)
    assert 'name="next"' not in html
    # A wrong key with the session: 401, the form again with the session's token.
    r = client.post("/login", data={"api_key": "wrong", "csrf_token": token, "next": "/models"}, environ_base=remote)
    assert r.status_code == 401 and "Set-Cookie" not in r.headers
    html = r.get_data(as_text=True)
    assert '<p class="error" role="alert">invalid API key</p>' in html and token_of(html) == token
    assert '<input type="hidden" name="next" value="/models">' in html
    # A wrong key without any session: no token field, and still no cookie.
    client.delete_cookie("agentd_session")
    r = client.post("/login", data={"api_key": "wrong"}, environ_base=remote)
    assert r.status_code == 401 and "Set-Cookie" not in r.headers
    assert 'name="csrf_token"' not in r.get_data(as_text=True), "BUG: a token field without a session"


# -- pages/catalog.py ------------------------------------------------------------------------------------------------

def _day(d: str) -> datetime:
    return datetime.fromisoformat(d).replace(tzinfo=timezone.utc)


def test_every_day_of_a_past_period() -> None:
    rows = [{"day": "2024-02-28", "cost_usd": 1.5}, {"day": "2024-03-01", "cost_usd": 2.0},
            {"day": "2024-03-09", "cost_usd": 9.0}]   # outside the period: not listed
    days = catalog_pages._every_day(rows, _day("2024-02-27"), _day("2024-03-02"))
    assert days == [{"day": "2024-02-27", "cost_usd": 0.0}, {"day": "2024-02-28", "cost_usd": 1.5},
                    {"day": "2024-02-29", "cost_usd": 0.0}, {"day": "2024-03-01", "cost_usd": 2.0}]
    assert catalog_pages._every_day([], _day("2024-03-01"), _day("2024-03-02")) == \
        [{"day": "2024-03-01", "cost_usd": 0.0}]
    assert catalog_pages._every_day(rows, _day("2024-03-01"), _day("2024-03-01")) == []


def test_every_day_stops_at_today() -> None:
    today = utcnow().date()
    start = datetime.combine(today - timedelta(days=2), datetime.min.time(), timezone.utc)
    days = catalog_pages._every_day([], start, start + timedelta(days=31))
    if utcnow().date() != today:   # midnight passed during the call
        return
    assert [d["day"] for d in days] == [(today - timedelta(days=n)).isoformat() for n in (2, 1, 0)]


def test_providers_page_status(dash) -> None:
    app, _ = dash
    r = app.test_client().get("/providers", environ_base=LOCAL)
    assert r.status_code == 200 and "<h1>Providers" in r.get_data(as_text=True)


# -- pages/channels.py -----------------------------------------------------------------------------------------------

@pytest.fixture
def catalogue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A channel catalogue file of the test's own (the cache emptied before and after)."""
    path = tmp_path / "channels.json"
    monkeypatch.setattr(channel_pages, "CATALOGUE", path)
    channel_pages._cache.clear()
    yield path
    channel_pages._cache.clear()


def test_catalogue_keeps_named_items_unconfigured(catalogue: Path) -> None:
    catalogue.write_text(json.dumps([
        {"name": "irc", "display_name": "IRC", "category": "messaging", "configured": True, "active": True},
        {"display_name": "nameless"}, "a string", 5, ["name"],
        {"name": "ntfy", "category": "notifications"}]), encoding="utf-8")
    items = channel_pages._catalogue()
    assert items == [{"name": "irc", "display_name": "IRC", "category": "messaging", "configured": False,
                      "active": False},
                     {"name": "ntfy", "category": "notifications", "configured": False, "active": False}]
    catalogue.write_text("[]", encoding="utf-8")
    assert channel_pages._catalogue() is items, "BUG: the catalogue is read again on every page"


@pytest.mark.parametrize("content", [None, "not json", "{\"name\": \"x\"}"])
def test_catalogue_missing_or_broken(catalogue: Path, content: str | None) -> None:
    if content is not None:
        catalogue.write_text(content, encoding="utf-8")
    assert channel_pages._catalogue() == []


def test_catalogue_not_utf8_is_broken(catalogue: Path) -> None:
    catalogue.write_bytes(b'[{"name": "caf\xe9"}]')   # Latin-1
    assert channel_pages._catalogue() == []


def test_catalogue_is_read_as_utf8(catalogue: Path) -> None:
    catalogue.write_bytes(json.dumps([{"name": "zulip", "display_name": "Zülip ✓"}],
                                     ensure_ascii=False).encode("utf-8"))
    assert channel_pages._catalogue()[0]["display_name"] == "Zülip ✓"


def test_the_shipped_catalogue() -> None:
    channel_pages._cache.clear()
    items = channel_pages._catalogue()
    shipped = json.loads(channel_pages.CATALOGUE.read_text(encoding="utf-8"))
    assert len(items) == len(shipped) > 0
    assert all(item["configured"] is False and item["active"] is False for item in items)


def test_channel_rows_asks_the_runtime_in_order() -> None:
    row = {"name": "irc"}
    both = SimpleNamespace(listing=lambda: iter([row]), list_channels=lambda: [{"name": "no"}],
                           list=lambda: [{"name": "no"}])
    assert channel_pages.channel_rows(SimpleNamespace(channels=both)) == ([row], True)
    second = SimpleNamespace(listing="not callable", list_channels=lambda: (row,), list=lambda: [{"name": "no"}])
    assert channel_pages.channel_rows(SimpleNamespace(channels=second)) == ([row], True)

    def needs_args(filter_):   # a listing that wants arguments: the next method is tried
        raise AssertionError("not called with arguments")

    def raises_type_error():
        raise TypeError("wrong call")

    third = SimpleNamespace(listing=needs_args, list_channels=raises_type_error, list=lambda: [row])
    assert channel_pages.channel_rows(SimpleNamespace(channels=third)) == ([row], True)
    channel_pages._cache.clear()
    catalogue = channel_pages._catalogue()
    for k in (SimpleNamespace(), SimpleNamespace(channels=None), SimpleNamespace(channels=SimpleNamespace()),
              SimpleNamespace(channels=SimpleNamespace(listing=raises_type_error))):
        rows, live = channel_pages.channel_rows(k)
        assert rows is catalogue and live is False


def test_channel_events_ask_the_audit_log() -> None:
    calls: list[tuple] = []

    def recent(limit, prefix):
        calls.append((limit, prefix))
        return [{"event": "channel.up"}]

    assert channel_pages._channel_events(SimpleNamespace(audit=SimpleNamespace(recent=recent))) == \
        [{"event": "channel.up"}]
    assert calls == [(50, "channel.")]
    assert channel_pages._channel_events(SimpleNamespace()) is None
    assert channel_pages._channel_events(SimpleNamespace(audit=None)) is None


# -- pages/workflows.py ----------------------------------------------------------------------------------------------

def test_workflow_page_shows_the_newest_run_and_keeps_a_refused_input(dash) -> None:
    app, kernel = dash
    client = app.test_client()
    spawn(kernel, "wf-writer")
    workflow_id = kernel.workflows.create({"name": "pages-wf", "steps": [
        {"name": "only", "agent_name": "wf-writer", "prompt": "say {{input}}"}]})
    html = client.get(f"/workflows/{workflow_id}", environ_base=LOCAL).get_data(as_text=True)
    assert "Not run yet" in html and 'id="latest-run"' not in html
    token = token_of(html)
    for text in ("older", "newer"):
        r = client.post(f"/workflows/{workflow_id}/run", data={"input": text, "csrf_token": token},
                        environ_base=LOCAL)
        assert r.status_code == 303 and r.headers["Location"].startswith("/workflows/runs/")
        run_id = r.headers["Location"].split("/")[3].split("?")[0]
        for _ in range(200):
            if kernel.workflows.run_detail(run_id)["state"]["status"] == "completed":
                break
            time.sleep(0.05)
    r = client.get(f"/workflows/{workflow_id}", environ_base=LOCAL)
    assert r.status_code == 200
    html = r.get_data(as_text=True)
    assert '<div class="text" id="run-output">echo: say newer</div>' in html, "BUG: not the newest run in full"
    assert 'role="alert"' not in html and '<textarea id="input" name="input" rows="3"></textarea>' in html
    listed = re.findall(r'<a href="/api/workflows/runs/[^"]+"><code>([0-9a-f-]{8})</code></a>', html)
    assert listed == [run["id"][:8] for run in kernel.workflows.runs(workflow_id)] and len(listed) == 2
    assert "Not run yet" not in html
    too_big = "é" * 32768 + "x"   # 65537 bytes
    r = client.post(f"/workflows/{workflow_id}/run", data={"input": too_big, "csrf_token": token}, environ_base=LOCAL)
    assert r.status_code == 413
    html = r.get_data(as_text=True)
    assert '<p class="error" role="alert">input too large (max 64 KB)</p>' in html
    assert f'<textarea id="input" name="input" rows="3">{too_big}</textarea>' in html
    assert '<div class="text" id="run-output">echo: say newer</div>' in html
    assert len(kernel.workflows.runs(workflow_id)) == 2
