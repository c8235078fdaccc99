"""Typing, lifecycle reactions and edits through the real daemon and the platforms' fakes:
`lifecycle_reactions` (👀 when a message is taken, ✅ when answered, ⚠️ when the run
failed: each platform's own way), `typing_mode` ("never" sends no indicator), both refused
at configure time on adapters whose platform cannot show them, and an edited message
answered as a new one that says it was edited."""

from __future__ import annotations

import json
import time

import pytest
import requests

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - the shared daemon of the channel tests
from channel_fixtures import configure, remove, wait_active, wait_for
from support import free_port
from fakes.discord import FakeDiscord
from fakes.line import FakeLine, event as line_event, signature as line_signature
from fakes.matrix import FakeMatrix
from fakes.mattermost import FakeMattermost
from fakes.messenger import event as messenger_event
from fakes.slack import FakeSlack
from fakes.telegram import FakeTelegram
from fakes.whatsapp import event as whatsapp_event
import meta_webhook

EDITED = "echo: (I edited my earlier message; its new text follows.)\n"


@pytest.fixture
def telegram(daemon):  # noqa: F811
    fake = FakeTelegram(contract.ENV["TELEGRAM_BOT_TOKEN"]).start()
    yield fake
    remove(daemon, "telegram")
    fake.stop()


def telegram_setup(daemon, fake, **overrides):  # noqa: F811
    configure(daemon, "telegram", bot_token_env="TELEGRAM_BOT_TOKEN", api_url=fake.url, long_poll_secs=1,
              default_agent="helper", overrides=overrides)
    wait_active(daemon, "telegram")


def test_telegram_reactions_typing_never_and_edits(daemon, telegram):  # noqa: F811
    telegram_setup(daemon, telegram, lifecycle_reactions=True, typing_mode="never")
    first = telegram.user_says(4101, "react to me")
    wait_for(lambda: telegram.replies_to(4101), what="reply")
    # Telegram's reaction list has neither ✅ nor ⚠️: its own defaults are 👍 and 😢.
    wait_for(lambda: len([r for r in telegram.reactions if r["message_id"] == first]) == 2, what="reactions")
    assert [r["emoji"] for r in telegram.reactions if r["message_id"] == first] == [["👀"], ["👍"]]
    failing = telegram.user_says(4101, "[[fail:500]] boom")
    wait_for(lambda: len(telegram.replies_to(4101)) == 2, what="apology")
    wait_for(lambda: [r for r in telegram.reactions if r["message_id"] == failing and r["emoji"] == ["😢"]],
             what="the failure reaction")
    assert [a for a in telegram.actions if a["chat_id"] == 4101] == []  # typing_mode = never
    # An edited message is answered as a new one, and says it was edited.
    telegram.user_edits(4101, first, "react to this instead")
    wait_for(lambda: len(telegram.replies_to(4101)) == 3, what="the answer to the edit")
    assert telegram.replies_to(4101)[2] == EDITED + "react to this instead"


def test_telegram_own_emoji_and_default_typing(daemon, telegram):  # noqa: F811
    telegram_setup(daemon, telegram, lifecycle_reactions={"received": "🤔", "answered": ""})
    said = telegram.user_says(4102, "[[slow:0.3]] think about it")
    wait_for(lambda: telegram.replies_to(4102), what="reply")
    time.sleep(0.2)
    assert [r["emoji"] for r in telegram.reactions if r["message_id"] == said] == [["🤔"]]
    # typing_mode unset: instant (sent from a thread of its own, so maybe just after the reply)
    wait_for(lambda: {"chat_id": 4102, "action": "typing"} in telegram.actions, what="typing")


# -- Slack: reactions by name, the received one taken back -----------------------------------

@pytest.fixture
def slack(daemon):  # noqa: F811
    fake = FakeSlack(contract.ENV["SLACK_APP_TOKEN"], contract.ENV["SLACK_BOT_TOKEN"]).start()
    yield fake
    remove(daemon, "slack")
    fake.stop()


def test_slack_reactions_and_edits(daemon, slack):  # noqa: F811
    configure(daemon, "slack", api_url=slack.url + "/api", app_token_env="SLACK_APP_TOKEN",
              bot_token_env="SLACK_BOT_TOKEN", default_agent="helper", overrides={"lifecycle_reactions": True})
    wait_active(daemon, "slack")
    channel = slack.user_says("U1ANN", "hello slack")
    ts = slack.said[-1]["ts"]
    wait_for(lambda: slack.replies(channel), what="reply")
    wait_for(lambda: slack.reactions.get((channel, ts)) == ["white_check_mark"], what="👀 replaced by ✅",
             explain=lambda: slack.reactions)
    slack.user_edits("U1ANN", channel, ts, "hello again, edited")
    wait_for(lambda: len(slack.replies(channel)) == 2, what="the answer to the edit")
    assert slack.replies(channel)[1] == EDITED + "hello again, edited"


# -- Discord: reactions by PUT/DELETE, typing ------------------------------------------------

@pytest.fixture
def discord(daemon):  # noqa: F811
    fake = FakeDiscord(contract.ENV["DISCORD_BOT_TOKEN"], heartbeat_ms=400).start()
    yield fake
    remove(daemon, "discord")
    fake.stop()


def test_discord_reactions_typing_and_edits(daemon, discord):  # noqa: F811
    configure(daemon, "discord", api_url=discord.url + "/api/v10", bot_token_env="DISCORD_BOT_TOKEN",
              default_agent="helper", overrides={"lifecycle_reactions": True, "typing_mode": "instant"})
    wait_active(daemon, "discord")
    channel = discord.user_says("ann", "[[fail:500]] discord boom")
    said = next(m for m in discord.messages if m["content"] == "[[fail:500]] discord boom")
    wait_for(lambda: discord.replies(channel), what="apology")
    wait_for(lambda: discord.reactions.get(said["id"]) == ["⚠️"], what="👀 replaced by ⚠️",
             explain=lambda: discord.reactions)
    assert channel in discord.typing
    discord.user_edits(channel, said["id"], "discord fixed")
    wait_for(lambda: len(discord.replies(channel)) == 2, what="the answer to the edit")
    assert discord.replies(channel)[1] == EDITED + "discord fixed"
    wait_for(lambda: discord.reactions.get(said["id"]) == ["✅"], what="✅ after the edit's answer")


# -- Matrix: m.reaction annotations, redacted when replaced; m.replace edits -----------------

@pytest.fixture
def matrix(daemon):  # noqa: F811
    fake = FakeMatrix(contract.ENV["MATRIX_ACCESS_TOKEN"]).start()
    yield fake
    remove(daemon, "matrix")
    fake.stop()


def test_matrix_reactions_and_edits(daemon, matrix):  # noqa: F811
    configure(daemon, "matrix", access_token_env="MATRIX_ACCESS_TOKEN", homeserver_url=matrix.url,
              long_poll_secs=1, default_agent="helper", overrides={"lifecycle_reactions": True})
    wait_active(daemon, "matrix")
    wait_for(lambda: matrix.syncs and matrix.syncs[-1]["since"], what="the initial sync")
    room = "!room:test"
    said = matrix.user_says(room, "@ann:test", "hello matrix")
    wait_for(lambda: matrix.bot_messages(room), what="reply")
    wait_for(lambda: matrix.reactions_on(said) == ["✅"], what="👀 redacted, ✅ shown",
             explain=lambda: matrix.reactions)
    assert len(matrix.redactions) == 1
    matrix.user_edits(room, "@ann:test", said, "hello matrix, edited")
    wait_for(lambda: len(matrix.bot_messages(room)) == 2, what="the answer to the edit")
    assert matrix.bot_messages(room)[1] == EDITED + "hello matrix, edited"


# -- Mattermost and Zulip: reactions by name ---------------------------------------------------

def test_mattermost_reactions(daemon):  # noqa: F811
    fake = FakeMattermost(contract.ENV["MATTERMOST_TOKEN"]).start()
    try:
        configure(daemon, "mattermost", server_url=fake.url, token_env="MATTERMOST_TOKEN", default_agent="helper",
                  overrides={"lifecycle_reactions": {"answered": "tada"}})
        wait_active(daemon, "mattermost")
        wait_for(lambda: [f for f in fake.hub.received if isinstance(f, dict)
                          and f.get("action") == "authentication_challenge"], what="authenticated")
        post = fake.user_says("user-ann", "ann", "town0000000000000000000000", "hello mattermost")
        wait_for(lambda: fake.bot_posts("town0000000000000000000000"), what="reply")
        wait_for(lambda: fake.reactions.get(post) == ["tada"], what="eyes replaced by tada",
                 explain=lambda: fake.reactions)
    finally:
        remove(daemon, "mattermost")
        fake.stop()


def test_zulip_reactions(daemon):  # noqa: F811
    case = contract.CASES["zulip"]
    fake = case.start()
    try:
        contract.setup(daemon, case, fake, overrides={"lifecycle_reactions": True})
        target = fake.user_says("ann", "[[fail:500]] zulip boom")
        wait_for(lambda: fake.replies(target), what="apology")
        wait_for(lambda: list(fake.reactions.values()) == [["warning"]], what="eyes replaced by warning",
                 explain=lambda: fake.reactions)
        target = fake.user_says("ann", "zulip fine")
        wait_for(lambda: len(fake.replies(target)) == 2, what="reply")
        wait_for(lambda: list(fake.reactions.values())[-1] == ["check"], what="check", explain=lambda: fake.reactions)
    finally:
        remove(daemon, "zulip")
        case.stop(fake)


def said_id(name: str, fake, text: str):  # type: ignore[no-untyped-def]
    """The platform's id of the user's message `text` (what the bot reacts to)."""
    if name == "signal":
        return next(m["envelope"]["timestamp"] for m in fake.delivered
                    if m["envelope"]["dataMessage"]["message"] == text)
    message = next(m for m in fake.messages if (m.get("content") or m.get("msg") or m.get("message")) == text)
    return message.get("_id") or message["id"]


@pytest.mark.parametrize("name,answered", [("revolt", ["✅"]), ("rocketchat", [":white_check_mark:"]),
                                           ("nextcloud", ["✅"]), ("signal", "✅")])
def test_reactions_on_more_platforms(daemon, name, answered):  # noqa: F811
    case = contract.CASES[name]
    fake = case.start()
    try:
        contract.setup(daemon, case, fake, overrides={"lifecycle_reactions": True})
        chat = case.say(fake, case.user, f"hello {name}")
        wait_for(lambda: case.replies(fake, chat), what="reply")
        said = said_id(name, fake, f"hello {name}")
        wait_for(lambda: fake.reactions.get(said) == answered, what="👀 replaced by ✅",
                 explain=lambda: fake.reactions)
    finally:
        remove(daemon, name)
        case.stop(fake)


# -- WhatsApp Cloud API and Messenger: typing through the send endpoint ----------------------

def test_whatsapp_typing_and_reactions(daemon):  # noqa: F811
    platform = meta_webhook.PLATFORMS["whatsapp"]
    hook = meta_webhook.serve(daemon, platform)
    fake, url, port = next(hook)
    try:
        configure(daemon, "whatsapp", webhook_port=port, api_url=fake.url, default_agent="helper",
                  overrides={"lifecycle_reactions": True}, **platform.keys)
        wait_active(daemon, "whatsapp")
        body = whatsapp_event("[[slow:0.3]] hello whatsapp", "15551230001")
        message_id = json.loads(body)["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
        assert meta_webhook.post(url, platform.secret, body).status_code == 200
        wait_for(lambda: fake.sent, what="reply")
        assert fake.typing and set(fake.typing) == {message_id}
        wait_for(lambda: fake.reactions.get(message_id) == "✅", what="✅", explain=lambda: fake.reactions)
    finally:
        next(hook, None)


def test_messenger_typing(daemon):  # noqa: F811
    platform = meta_webhook.PLATFORMS["messenger"]
    hook = meta_webhook.serve(daemon, platform)
    fake, url, _ = next(hook)
    try:
        body = messenger_event("[[slow:0.3]] hi page", "psid-9")
        assert meta_webhook.post(url, platform.secret, body).status_code == 200
        wait_for(lambda: fake.sent, what="reply")
        assert {"to": "psid-9", "action": "typing_on"} in fake.actions
    finally:
        next(hook, None)


def test_line_loading_animation(daemon):  # noqa: F811
    fake, port = FakeLine(contract.ENV["LINE_CHANNEL_ACCESS_TOKEN"]).start(), free_port()
    try:
        configure(daemon, "line", webhook_port=port, api_url=fake.url, default_agent="helper")
        wait_active(daemon, "line")
        for body in (line_event("[[slow:0.3]] hi line", "Uann"),
                     line_event("[[slow:0.3]] hi group", "Ubob", "Cgroup")):
            response = requests.post(f"http://127.0.0.1:{port}/callback", data=body, timeout=5, headers={
                "Content-Type": "application/json",
                "X-Line-Signature": line_signature(contract.ENV["LINE_CHANNEL_SECRET"], body)})
            assert response.status_code == 200
        wait_for(lambda: len(fake.sent) == 2, what="replies")
        assert set(fake.loading) == {"Uann"}  # a group has no loading animation
    finally:
        remove(daemon, "line")
        fake.stop()


# -- configure time ----------------------------------------------------------------------------

@pytest.mark.parametrize("channel,overrides,error", [
    ("slack", {"typing_mode": "instant"}, "overrides.typing_mode: not implemented by the slack adapter"),
    ("irc", {"lifecycle_reactions": True}, "overrides.lifecycle_reactions: not implemented by the irc adapter"),
    ("webhook", {"typing_mode": "never"}, "overrides.typing_mode: not implemented by the webhook adapter"),
    ("telegram", {"typing_mode": "sometimes"}, "overrides.typing_mode: must be one of instant, never"),
    ("telegram", {"lifecycle_reactions": "yes"}, "overrides.lifecycle_reactions: must be true, false or a table"),
    ("discord", {"lifecycle_reactions": {"started": "🚀"}}, "overrides.lifecycle_reactions.started: unknown stage"),
])
def test_refused_where_the_platform_cannot(daemon, channel, overrides, error):  # noqa: F811
    before = (daemon.home / "config.toml").read_text()
    response = daemon.post(f"/api/channels/{channel}/configure", json={"overrides": overrides})
    assert response.status_code == 400
    assert response.json()["error"].startswith(error), response.json()
    assert (daemon.home / "config.toml").read_text() == before
