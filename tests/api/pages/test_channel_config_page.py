"""The dashboard configures a channel, through the real daemon and a browser-like session:
the form built from the adapter's catalogue entry, CSRF-protected posts answered 303 with a
message (post/redirect/get), the secret written to secrets.env (mode 0600) and never shown
again, the Test button sending a real message to a fake Telegram and showing the platform's
answer, the live state and the last errors."""

from __future__ import annotations

import html
import re
import stat
import tomllib
from typing import Iterator

import pytest
import requests

from channel_fixtures import wait_for
from fakes.telegram import FakeTelegram
from support import Daemon, make_home

TOKEN = "424242:PAGE-TOKEN-never-shown"
WRONG = "424242:WRONG-TOKEN-never-shown"


class Browser:
    """A cookie-keeping client of the dashboard that reads each page's CSRF token."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.http = requests.Session()
        self.token = ""

    def page(self, path: str) -> str:
        response = self.http.get(self.daemon.url + path, timeout=10)
        assert response.status_code == 200, (path, response.status_code)
        text = response.text
        found = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', text)
        if found:
            self.token = found.group(1)
        return text

    def post(self, path: str, data: dict[str, str], csrf: bool = True) -> requests.Response:
        form = {**data, **({"csrf_token": self.token} if csrf else {})}
        return self.http.post(self.daemon.url + path, data=form, timeout=30, allow_redirects=False)

    def submit(self, path: str, data: dict[str, str]) -> tuple[str, str]:
        """POST the form, follow the 303: (the note shown, the whole page)."""
        response = self.post(path, data)
        assert response.status_code == 303, (response.status_code, response.text[:300])
        page = self.page(response.headers["Location"].replace(self.daemon.url, ""))
        note = re.search(r'id="page-note">(.*?)</div>', page, re.S)
        return (html.unescape(re.sub(r"<[^>]+>", " ", note.group(1))).strip() if note else ""), page


@pytest.fixture(scope="module")
def dash(tmp_path_factory) -> Iterator[tuple[Browser, FakeTelegram, Daemon]]:
    fake = FakeTelegram(TOKEN).start()
    daemon = Daemon(make_home(tmp_path_factory.mktemp("chanpage"))).start()
    yield Browser(daemon), fake, daemon
    daemon.stop()
    fake.stop()


def form_for(fake: FakeTelegram, secret: str = "", **extra: str) -> dict[str, str]:
    return {"bot_token_env": secret, "env:bot_token_env": "TELEGRAM_BOT_TOKEN", "api_url": fake.url,
            "long_poll_secs": "1", "default_chat_id": "4242", **extra}


def state(page: str) -> str:
    return re.search(r'id="state">([^<]*)<', page).group(1)


def test_the_form_is_built_from_the_catalogue(dash) -> None:
    browser, _fake, _daemon = dash
    page = browser.page("/channels/telegram")
    assert '<input type="password" id="f-bot_token_env" name="bot_token_env"' in page
    assert 'data-secret="bot_token_env">not set<' in page
    assert "Bot Token" in page and "Allowed User IDs" in page and 'name="poll_interval_secs"' in page
    assert 'name="api_url"' in page and 'name="default_chat_id"' in page  # the adapter's other keys
    assert state(page) == "not configured"
    assert 'href="/channels/telegram"' in browser.page("/channels")
    # A platform that hands the bot only the group messages addressed to it is not offered
    # the group policies that would answer the others.
    for name, offered in (("slack", ["respond", "mention-only", "shared", "ignore"]), ("mastodon", ["ignore"])):
        select = re.search(r'name="overrides.group_policy">(.*?)</select>', browser.page(f"/channels/{name}")).group(1)
        assert re.findall(r'<option value="([^"]+)"', select) == offered, (name, select)
    assert browser.http.get(browser.daemon.url + "/channels/nosuch", timeout=10).status_code == 404


def test_configure_test_button_state_and_errors(dash) -> None:
    browser, fake, daemon = dash
    browser.page("/channels/telegram")
    refused = browser.post("/channels/telegram/configure", form_for(fake, TOKEN), csrf=False)
    assert refused.status_code == 403
    assert not (daemon.home / "secrets.env").exists()

    # A wrong token: saved, the adapter runs but the platform refuses it; the page says it is
    # connecting and shows the error.
    note, page = browser.submit("/channels/telegram/configure", form_for(fake, WRONG))
    assert "telegram: configuration saved" in note and "TELEGRAM_BOT_TOKEN" in note
    assert state(page) == "connecting"
    # The platform's refusal reaches the page's last errors (the adapter retries meanwhile).
    page = wait_for(lambda: (lambda p: "Unauthorized" in p and p)(browser.page("/channels/telegram")),
                    what="the error on the page")
    assert "channel.connection_error" in page and state(page) == "connecting"
    # An adapter that cannot start at all is not running.
    note, page = browser.submit("/channels/guilded/configure", {"bot_token_env": ""})
    assert note == ("guilded: configuration saved  the adapter could not start (see the audit trail); "
                    "no agent runs yet: messages get an apology until one is spawned")
    assert state(page) == "configured, not running"
    browser.submit("/channels/guilded/remove", {"confirm": "yes"})
    assert "Unauthorized" in browser.page("/channels")  # the list's last-error column
    # The Test button shows what the platform answered.
    note, _ = browser.submit("/channels/telegram/test", {"message": "hello?", "chat_id": ""})
    assert note.startswith("telegram: test message not delivered:") and "Unauthorized" in note

    note, page = browser.submit("/channels/telegram/configure", form_for(fake, TOKEN))
    assert "the adapter started" in note and "secrets saved to secrets.env: TELEGRAM_BOT_TOKEN" in note
    assert 'data-secret="bot_token_env">set<' in page
    wait_for(lambda: state(browser.page("/channels/telegram")) == "active", what="telegram active")
    secrets = daemon.home / "secrets.env"
    assert f"TELEGRAM_BOT_TOKEN={TOKEN}\n" in secrets.read_text()
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    config = (daemon.home / "config.toml").read_text()
    assert 'bot_token_env = "TELEGRAM_BOT_TOKEN"' in config and TOKEN not in config

    note, _ = browser.submit("/channels/telegram/test", {"message": "ping from the page", "chat_id": ""})
    wait_for(lambda: fake.replies_to(4242), what="test message")
    sent = fake.sent[-1]
    assert fake.replies_to(4242)[-1] == "ping from the page"
    assert note == f"telegram: test message delivered to 4242; the platform's message id: {sent['message_id']}"

    # Saving again with the password left empty keeps the stored secret; inputs not posted
    # keep their saved values.
    note, page = browser.submit("/channels/telegram/configure", {"bot_token_env": "", "allowed_users": "ann, bob"})
    assert "the adapter started" in note and "secrets saved" not in note
    assert f"TELEGRAM_BOT_TOKEN={TOKEN}\n" in secrets.read_text()
    assert 'value="ann, bob"' in page and f'value="{fake.url}"' in page
    config = (daemon.home / "config.toml").read_text()
    assert 'allowed_users = ["ann", "bob"]' in config and 'default_chat_id = "4242"' in config
    # Neither token ever appears in a page or the API.
    for path in ("/channels/telegram", "/channels"):
        assert TOKEN not in browser.page(path) and WRONG not in browser.page(path)
    assert TOKEN not in daemon.get("/api/channels").text


def test_the_admins_form_names_any_variable_and_saves_secrets_only_to_the_adapters_own(dash) -> None:
    browser, fake, daemon = dash
    browser.page("/channels/telegram")
    refused = ("telegram: bot_token_env: a secret saved by agentd goes to TELEGRAM_BOT_TOKEN or a variable "
               "starting with TELEGRAM_, not PATH")
    before = (daemon.home / "config.toml").read_text()
    assert browser.submit("/channels/telegram/configure", form_for(fake, "x", **{"env:bot_token_env": "PATH"}))[0] \
        == refused
    assert (daemon.home / "config.toml").read_text() == before
    secrets = daemon.home / "secrets.env"
    assert not secrets.exists() or "PATH=" not in secrets.read_text()
    for name in ("TELEGRAM_OTHER", "MY_BOT_TOKEN"):
        note, page = browser.submit("/channels/telegram/configure", form_for(fake, **{"env:bot_token_env": name}))
        assert note.startswith("telegram: configuration saved"), note
        assert f'bot_token_env = "{name}"' in (daemon.home / "config.toml").read_text()
    response = daemon.post("/api/channels/telegram/configure",
                           json={"secrets": {"default_agent": "x"}})
    assert response.status_code == 400 and response.json()["error"].startswith("secrets.default_agent: not a secret key")


def test_overrides_are_set_and_cleared_on_the_page(dash) -> None:
    browser, fake, daemon = dash
    page = browser.page("/channels/telegram")
    assert ('<select id="f-overrides.dm_policy" name="overrides.dm_policy"><option value="">(default)</option>'
            '<option value="respond">respond</option><option value="mention-only">mention-only</option>'
            '<option value="ignore">ignore</option></select>') in page
    assert '<textarea id="f-overrides.system_prompt" name="overrides.system_prompt" rows="3"></textarea>' in page
    # ntfy tells no mention and has no threads, typing or reactions: its form does not offer
    # what saving would refuse.
    ntfy = browser.page("/channels/ntfy")
    assert 'name="overrides.usage_footer"' in ntfy and '<option value="mention-only">' not in ntfy
    for key in ("threading", "typing_mode", "lifecycle_reactions"):
        assert f'name="overrides.{key}"' not in ntfy, key

    browser.page("/channels/telegram")
    before = (daemon.home / "config.toml").read_text()
    note, _ = browser.submit("/channels/telegram/configure", {**form_for(fake), "overrides.rate_limit_per_user": "many"})
    assert note == ("telegram: overrides.rate_limit_per_user: must be a whole number of messages per minute "
                    "(0: no limit)")
    assert (daemon.home / "config.toml").read_text() == before

    note, page = browser.submit("/channels/telegram/configure", {
        **form_for(fake), "overrides.model": "gpt-4o-mini", "overrides.system_prompt": "Answer in French.",
        "overrides.rate_limit_per_user": "5", "overrides.usage_footer": "tokens", "overrides.threading": "false",
        "overrides.prefix_agent_name": "true", "overrides.dm_policy": ""})
    assert note.startswith("telegram: configuration saved"), note
    saved = daemon.get("/api/channels").json()
    section = tomllib.loads((daemon.home / "config.toml").read_text())["channels"]["telegram"]
    assert section["overrides"] == {"model": "gpt-4o-mini", "system_prompt": "Answer in French.",
                                    "rate_limit_per_user": 5, "usage_footer": "tokens", "threading": False,
                                    "prefix_agent_name": True}
    assert saved and '<option value="tokens" selected>tokens</option>' in page
    assert '<details id="overrides" open>' in page and ">Answer in French.</textarea>" in page

    # Saving the form without touching them keeps them; emptying one removes it.
    browser.submit("/channels/telegram/configure", {"allowed_users": ""})
    assert tomllib.loads((daemon.home / "config.toml").read_text())["channels"]["telegram"]["overrides"] \
        == section["overrides"]
    keep = {"overrides.model": "", "overrides.system_prompt": "", "overrides.rate_limit_per_user": "",
            "overrides.usage_footer": "", "overrides.threading": "", "overrides.prefix_agent_name": ""}
    browser.submit("/channels/telegram/configure", {**keep, "overrides.usage_footer": "cost"})
    section = tomllib.loads((daemon.home / "config.toml").read_text())["channels"]["telegram"]
    assert section["overrides"] == {"usage_footer": "cost"}
    browser.submit("/channels/telegram/configure", keep)
    assert "overrides" not in tomllib.loads((daemon.home / "config.toml").read_text())["channels"]["telegram"]
    # A value saved under another of its names is shown selected, so saving the page keeps it.
    assert daemon.post("/api/channels/telegram/configure", json={
        **tomllib.loads((daemon.home / "config.toml").read_text())["channels"]["telegram"],
        "overrides": {"output_format": "plain_text"}}).status_code == 200
    page = browser.page("/channels/telegram")
    assert '<option value="plain_text" selected>plain_text</option>' in page
    assert page.count('<option value="slack_mrkdwn">') == 0
    browser.submit("/channels/telegram/configure", {"overrides.output_format": "plain_text"})
    assert tomllib.loads((daemon.home / "config.toml").read_text())["channels"]["telegram"]["overrides"] == \
        {"output_format": "plain_text"}


def test_remove_from_the_page(dash) -> None:
    browser, fake, _daemon = dash
    browser.page("/channels/telegram")
    note, page = browser.submit("/channels/telegram/configure", form_for(fake))
    assert '<a class="button bad" href="/channels/telegram/remove">Remove configuration…</a>' in page
    asked = browser.post("/channels/telegram/remove", {})
    assert (asked.status_code, asked.headers["Location"]) == (303, "/channels/telegram/remove")
    page = browser.page("/channels/telegram/remove")
    assert "<h1>Remove the telegram configuration?</h1>" in page
    assert state(browser.page("/channels/telegram")) != "not configured", "removed without confirmation"
    note, page = browser.submit("/channels/telegram/remove", {"confirm": "yes"})
    assert note == "telegram: configuration removed and the adapter stopped"
    assert state(page) == "not configured"
