"""The channel contract of the adapters that talk to a platform through a fake of it: a
platform user's message reaches the agent and the reply reaches the platform, allow-list
refusal, a 429 retried after its Retry-After, a dropped connection re-established, and
stop() ending every thread.

`CASES` is the table of those adapters: each `Case` says how its platform's fake starts,
how the channel is configured and how the platform's users talk. tests/channels/test_channel_contract.py
runs every check below for every entry; tests/test_channel_<name>.py holds what is
particular to one platform and takes its `Case` (and fake) from here. See
tests/fakes/platform.py for what a fake offers."""

from __future__ import annotations

import atexit
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest

from channel_fixtures import CHANNEL_ENV, channel, configure, remove, start_channel_daemon, wait_active, wait_for
from fakes.bluesky import BOT_HANDLE, FakeBluesky
from fakes.discord import FakeDiscord
from fakes.discourse import BOT as DISCOURSE_BOT, FakeDiscourse
from fakes.gitter import ROOM as GITTER_ROOM, FakeGitter, FakeGitterFront
from fakes.linkedin import ORG as LINKEDIN_ORG, FakeLinkedIn
from fakes.mastodon import FakeMastodon
from fakes.matrix import FakeMatrix
from fakes.nextcloud import FakeNextcloud
from fakes.nostr import FakeRelay, pubkey_of, user_pubkey
from fakes.reddit import BOT as REDDIT_BOT, CLIENT_ID as REDDIT_CLIENT_ID, FakeReddit
from fakes.revolt import FakeRevolt
from fakes.rocketchat import BOT_ID as ROCKETCHAT_BOT_ID, FakeRocketChat
from fakes.signal import BOT as SIGNAL_BOT, NUMBERS as SIGNAL_NUMBERS, FakeSignal
from fakes.slack import FakeSlack
from fakes.telegram import FakeTelegram
from fakes.twist import BOT_ID as TWIST_BOT_ID, WORKSPACE as TWIST_WORKSPACE, FakeTwist
from fakes.webex import FakeWebex
from fakes.zulip import BOT_EMAIL as ZULIP_BOT_EMAIL, FakeZulip
from support import free_port

# Secrets of the platforms below (the fakes accept exactly these).
POLL_ENV = {"SIGNAL_UNUSED": "x", "REDDIT_CLIENT_SECRET": "reddit-secret", "REDDIT_PASSWORD": "reddit-pass",
            "BLUESKY_APP_PASSWORD": "bsky-app-pass", "LINKEDIN_ACCESS_TOKEN": "li-token",
            "TWIST_TOKEN": "twist-token", "ZULIP_API_KEY": "zulip-key", "DISCOURSE_API_KEY": "disc-key",
            "NEXTCLOUD_TOKEN": "nc-token", "ROCKETCHAT_TOKEN": "rc-token", "TWITCH_OAUTH_TOKEN": "twitchtoken",
            "XMPP_PASSWORD": "xmpp-pass", "MUMBLE_PASSWORD": "", "KEYBASE_PAPERKEY": "paper key words"}
# Gateway WebSocket adapters (discord, slack, revolt, guilded).
POLL_ENV.update({"DISCORD_BOT_TOKEN": "discord-bot-token", "DISCORD_OTHER_TOKEN": "not-the-bot-token",
                 "SLACK_APP_TOKEN": "xapp-1-A0-1-appsecret", "SLACK_BOT_TOKEN": "xoxb-1-2-botsecret",
                 "SLACK_SIGNING_SECRET": "slack-signing-secret", "REVOLT_BOT_TOKEN": "revolt-bot-token",
                 "REVOLT_OTHER_TOKEN": "not-the-bot-token",
                 "GUILDED_BOT_TOKEN": "guilded-bot-token"})
# What the shared daemon, and an adapter run in this process, find in the environment.
ENV = {**CHANNEL_ENV, **POLL_ENV}


_SHARED: dict[str, Any] = {}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, fake_llm):
    """A daemon with the agent `helper` and the platforms' secrets in its environment,
    shared by every test module of this family in one test process (each test removes
    its channel when done), stopped when the process exits."""
    if "daemon" not in _SHARED:
        started = start_channel_daemon(tmp_path_factory.mktemp("channels"), fake_llm,
                                       env=ENV)
        _SHARED["daemon"] = started
        atexit.register(started.stop)
    yield _SHARED["daemon"]


def audit(daemon, event: str, subject: str) -> list[dict[str, Any]]:
    """The newest 500 `event` entries (exact name) about `subject`, newest first (filtered
    server-side, so a busy shared daemon's other entries never push them out)."""
    rows = daemon.get(f"/api/audit/recent?limit=500&event={event}").json()
    return [r for r in rows if r["event"] == event and r["subject"] == subject]


def _stop(fake: Any) -> None:
    fake.stop()


@dataclass
class Case:
    """How one platform's fake starts, how the channel is configured and how its users talk."""

    name: str
    config: Callable[[Any], dict[str, Any]]          # fake -> configure keys
    say: Callable[[Any, str, str], Any]              # (fake, user, text) -> chat the reply goes to
    replies: Callable[[Any, Any], list[str]]         # (fake, chat) -> the bot's texts there
    user: str = "ann"                                # allowed in the refusal check
    other: str = "mallory"                           # refused in the refusal check
    other_id: str = ""                               # the adapter's sender id for `other`
    allow: dict[str, Any] = field(default_factory=dict)  # extra keys for the refusal check
    start: Callable[[], Any] | None = None           # -> the platform's fake, serving
    stop: Callable[[Any], None] = _stop              # ends the fake
    ready: Callable[[Any], Any] | None = None        # (fake) waits until what users say now is read
    exempt: dict[str, str] = field(default_factory=dict)  # check -> why it does not apply
    # (fake, user, text) -> the group chat of a message there that does not mention the bot
    group_say: Callable[[Any, str, str], Any] | None = None


def serve(daemon, case: Case) -> Iterator[Any]:
    """Fixture body: the platform's fake while the test runs; then the channel's
    configuration is removed from the daemon and the fake stopped."""
    fake = case.start()
    yield fake
    daemon.delete(f"/api/channels/{case.name}/configure")
    case.stop(fake)


def setup(daemon, case: Case, fake, **extra: Any) -> None:
    configure(daemon, case.name, default_agent="helper", **case.config(fake), **extra)
    wait_active(daemon, case.name)
    if case.ready is not None:
        case.ready(fake)


def round_trip(daemon, case: Case, fake) -> Any:
    """A user's message reaches the agent; the agent's reply reaches that user's chat."""
    setup(daemon, case, fake)
    chat = case.say(fake, case.user, f"hello {case.name}")
    wait_for(lambda: case.replies(fake, chat), what=f"{case.name} reply")
    time.sleep(0.3)  # nothing else (a second answer to the same message) follows
    assert case.replies(fake, chat) == [f"echo: hello {case.name}"]
    return chat


def refusal(daemon, case: Case, fake) -> None:
    """A sender outside allowed_users is audited and never answered."""
    setup(daemon, case, fake, allowed_users=[case.user], **case.allow)
    bad = case.say(fake, case.other, "let me in")
    good = case.say(fake, case.user, "member here")
    wait_for(lambda: case.replies(fake, good), what="reply to the allowed user")
    refused = wait_for(lambda: [e for e in audit(daemon, "channel.refused", case.name)
                                if e["detail"].get("sender") == (case.other_id or case.other)], what="refusal")
    assert refused[0]["detail"]["reason"] == "sender not in allowed_users"
    if bad != good:
        assert case.replies(fake, bad) == []
    assert "let me in" not in " ".join(case.replies(fake, good))


def rate_limited(daemon, case: Case, fake) -> None:
    """The send answered 429 + Retry-After: 1 is retried after (not before) that second."""
    setup(daemon, case, fake)
    fake.throttle = [1]
    asked = time.time()
    chat = case.say(fake, case.user, "throttled")
    wait_for(lambda: case.replies(fake, chat), what="reply after 429")
    assert case.replies(fake, chat)[-1] == "echo: throttled" and fake.throttle == []
    assert fake.sent[-1]["at"] - asked >= 1.0


SLOW_DOWN = ("You are sending messages faster than this channel allows (1 per minute). "
             "Please wait a moment and try again.")


def overrides(daemon, case: Case, fake, fake_llm) -> None:
    """The channel's `overrides` reach the run and the reply: its model and system prompt go
    to the model, the reply starts with the agent's name, and a second message within the
    minute gets the polite refusal instead of a run."""
    setup(daemon, case, fake, overrides={"model": "gpt-4o-mini", "system_prompt": f"Speak as the {case.name} bot.",
                                         "prefix_agent_name": True, "rate_limit_per_user": 1})
    first = f"overridden on {case.name}"
    chat = case.say(fake, case.user, first)
    wait_for(lambda: case.replies(fake, chat), what=f"{case.name} reply")
    assert case.replies(fake, chat) == [f"[helper] echo: {first}"], case.replies(fake, chat)
    sent = [r["json"] for r in list(fake_llm.requests) if first in str(r.get("json"))][-1]
    assert sent["model"] == "gpt-4o-mini"
    assert f"Speak as the {case.name} bot." in next(m["content"] for m in sent["messages"] if m["role"] == "system")
    second = f"too soon on {case.name}"
    chat = case.say(fake, case.user, second)
    wait_for(lambda: len(case.replies(fake, chat)) == 2, what=f"{case.name} refusal")
    assert case.replies(fake, chat)[-1] == SLOW_DOWN
    assert not [r for r in list(fake_llm.requests) if second in str(r.get("json"))]


MULTILINE = "please fix:\n```py\ndef f(x):\n    return x\n```\n- a\n- b"


def multiline(daemon, case: Case, fake, fake_llm) -> None:
    """A message of several lines (code, a list) reaches the model with its newlines and indentation."""
    setup(daemon, case, fake)
    text = MULTILINE.replace("fix", f"fix on {case.name}")
    chat = case.say(fake, case.user, text)
    wait_for(lambda: case.replies(fake, chat), what=f"{case.name} reply")
    sent = [r["json"] for r in list(fake_llm.requests) if f"fix on {case.name}" in str(r.get("json"))][-1]
    assert [m["content"] for m in sent["messages"] if m["role"] == "user"][-1] == text


def group_policies(daemon, case: Case, fake, fake_llm) -> None:
    """A group message that does not mention the bot: unanswered and not refused by default,
    answered under `respond` (a session per sender) and `shared` (one for the group), refused
    under `mention-only`."""
    setup(daemon, case, fake)
    refused = len(audit(daemon, "channel.refused", case.name))
    chat = case.group_say(fake, case.user, f"chatter on {case.name}")
    direct = case.say(fake, case.user, f"direct on {case.name}")
    wait_for(lambda: case.replies(fake, direct), what=f"{case.name} direct reply")
    time.sleep(1.0)
    assert case.replies(fake, chat) == [] and not [r for r in list(fake_llm.requests)
                                                   if f"chatter on {case.name}" in str(r.get("json"))]
    assert len(audit(daemon, "channel.refused", case.name)) == refused
    for policy, answered in (("respond", 1), ("shared", 2)):
        setup(daemon, case, fake, overrides={"group_policy": policy})
        text = f"unmentioned under {policy} on {case.name}"
        chat = case.group_say(fake, case.user, text)
        wait_for(lambda: len(case.replies(fake, chat)) == answered, what=f"{case.name} {policy} reply")
        assert case.replies(fake, chat)[-1] == f"echo: {text}"
        key = audit(daemon, "channel.inbound", case.name)[0]["detail"]["conversation"]
        assert key.startswith(f"{case.name}:chat:") and (":user:" in key) == (policy == "respond"), key
    setup(daemon, case, fake, overrides={"group_policy": "mention-only"})
    case.group_say(fake, case.user, "unmentioned under mention-only")
    wait_for(lambda: [e for e in audit(daemon, "channel.refused", case.name) if e["detail"]["reason"]
                      == "group_policy is mention-only and the bot was not mentioned"], what="refusal")


def reconnect_and_stop(daemon, case: Case, fake, down_for: float = 1.0) -> None:
    """The platform goes away and comes back: the adapter reconnects; DELETE stops it."""
    setup(daemon, case, fake)
    before = len(audit(daemon, "channel.reconnected", case.name))
    fake.restart(down_for=down_for)
    wait_for(lambda: len(audit(daemon, "channel.reconnected", case.name)) > before, timeout=15,
             what="reconnect")
    chat = case.say(fake, case.user, "after restart")
    wait_for(lambda: "echo: after restart" in case.replies(fake, chat), what="reply after restart")
    remove(daemon, case.name)
    assert channel(daemon, case.name)["active"] is False
    time.sleep(0.5)  # a read in flight when stop() ran has ended by now (stop aborts it)
    polls = len(fake.polls)
    time.sleep(1.0)
    assert len(fake.polls) == polls  # nothing reads from the platform any more
    assert audit(daemon, "channel.stop", case.name)[0]["detail"]["reason"] == "removed"


def in_process(case: Case, fake, settings: dict[str, Any] | None = None) -> Iterator[tuple[Any, list]]:
    """The real adapter class in this process (no daemon): yields (adapter, inbound list)."""
    from agentd.channels import adapters
    from agentd.channels.adapter import ChannelContext
    from agentd.channels.catalog import ChannelCatalog, settings_for

    info = ChannelCatalog.load().get(case.name)
    got: list = []
    ctx = ChannelContext(case.name, "127.0.0.1", deliver=got.append, audit=lambda *a: None,
                         load_state=dict, save_state=lambda s: None)
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    adapter = adapters.load(case.name)(ctx, settings_for(info, settings or case.config(fake)))
    try:
        yield adapter, got
    finally:
        adapter.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def threads_end(case: Case, fake) -> None:
    """stop() ends every thread the adapter started, while it is connected and reading."""
    for adapter, got in in_process(case, fake):
        adapter.start()
        wait_for(adapter.health, what="adapter healthy")
        case.say(fake, case.user, "in process")
        wait_for(lambda: got, what="inbound message")
        assert got[0].text == "in process"
        adapter.stop()
        assert adapter.threads_alive() == 0
        assert not [t for t in threading.enumerate()
                    if t.name.startswith(f"channel-{case.name}-") and t.is_alive()]


# -- the adapters under the contract ----------------------------------------------------------
def _gitter() -> Any:
    server = FakeGitter(ENV["GITTER_TOKEN"]).start()
    server.front = FakeGitterFront(server).start()  # gitter.im, serving only the Matrix discovery
    return server


def _gitter_stop(server: Any) -> None:
    server.front.stop()
    server.stop()


def _gitter_say(fake: Any, user: str, text: str) -> str:
    fake.user_says(GITTER_ROOM, user, text)
    return GITTER_ROOM


def _initial_sync(fake: Any) -> None:
    # The first sync only takes the position: messages sent before it are history.
    wait_for(lambda: any(s["since"] for s in fake.syncs), what="initial sync done")


def _matrix_say(fake: Any, user: str, text: str) -> str:
    fake.user_says(MATRIX_ROOM, user, text)
    return MATRIX_ROOM


MATRIX_ROOM = "!room1:test"


def _webex() -> Any:
    server = FakeWebex(ENV["WEBEX_BOT_TOKEN"])
    server.listen_port = free_port()  # where the adapter's webhook listens and the fake calls back
    return server.start()


def _telegram_say(fake: Any, user: str, text: str) -> int:
    fake.user_says(TELEGRAM_USERS[user], text, username=user)
    return TELEGRAM_USERS[user]  # a private chat's id is the user's


TELEGRAM_USERS = {"ann": 602, "mallory": 601}
NOSTR_BOT = pubkey_of(bytes.fromhex(ENV["NOSTR_PRIVATE_KEY"]))
NOSTR_NAMES = {user_pubkey(n): n for n in ("ann", "bob", "mallory", "carol")}

CASES: dict[str, Case] = {case.name: case for case in (
    Case("bluesky",
         config=lambda fake: {"service_url": fake.url, "identifier": BOT_HANDLE,
                              "app_password_env": "BLUESKY_APP_PASSWORD", "poll_interval_secs": 0.2},
         say=lambda fake, user, text: fake.user_says(user, f"@{BOT_HANDLE} {text}"),
         replies=lambda fake, chat: fake.replies(chat),
         user="ann.bsky.test", other="mallory.bsky.test", other_id="did:plc:mallory",
         start=lambda: FakeBluesky(ENV["BLUESKY_APP_PASSWORD"]).start()),
    Case("discord",
         config=lambda fake: {"api_url": fake.url + "/api/v10", "bot_token_env": "DISCORD_BOT_TOKEN"},
         say=lambda fake, user, text: fake.user_says(user, text),
         replies=lambda fake, chat: fake.replies(chat),
         other_id="id-mallory", group_say=lambda fake, user, text: fake.user_says(user, text, channel="C1"),
         start=lambda: FakeDiscord(ENV["DISCORD_BOT_TOKEN"], heartbeat_ms=400).start()),
    Case("discourse",
         config=lambda fake: {"base_url": fake.url, "api_key_env": "DISCOURSE_API_KEY",
                              "api_username": DISCOURSE_BOT, "poll_interval_secs": 0.2},
         say=lambda fake, user, text: fake.user_says(user, f"@{DISCOURSE_BOT} {text}"),
         replies=lambda fake, chat: fake.replies(chat),
         start=lambda: FakeDiscourse(ENV["DISCOURSE_API_KEY"]).start()),
    Case("gitter",
         config=lambda fake: {"token_env": "GITTER_TOKEN", "homeserver_url": fake.front.url, "room_id": GITTER_ROOM,
                              "long_poll_secs": 1},
         say=_gitter_say, replies=lambda fake, room: fake.bot_messages(room),
         user="@ann:gitter.im", other="@mallory:gitter.im",
         start=_gitter, stop=_gitter_stop, ready=_initial_sync),
    Case("linkedin",
         config=lambda fake: {"api_url": fake.url, "access_token_env": "LINKEDIN_ACCESS_TOKEN",
                              "organization_id": LINKEDIN_ORG.rsplit(":", 1)[-1], "poll_interval_secs": 0.2},
         say=lambda fake, user, text: fake.user_says(user, text),
         replies=lambda fake, chat: fake.replies(chat),
         other_id="urn:li:person:mallory",
         start=lambda: FakeLinkedIn(ENV["LINKEDIN_ACCESS_TOKEN"]).start()),
    Case("mastodon",
         config=lambda fake: {"instance_url": fake.url, "access_token_env": "MASTODON_ACCESS_TOKEN"},
         say=lambda fake, user, text: fake.user_says(user, text),
         replies=lambda fake, user: fake.replies(user),
         user="ann@other.test", other="mallory@other.test",
         start=lambda: FakeMastodon(ENV["MASTODON_ACCESS_TOKEN"]).start()),
    Case("matrix",
         config=lambda fake: {"access_token_env": "MATRIX_ACCESS_TOKEN", "homeserver_url": fake.url,
                              "long_poll_secs": 1},
         say=_matrix_say, replies=lambda fake, room: fake.bot_messages(room),
         user="@ann:test", other="@mallory:test",
         start=lambda: FakeMatrix(ENV["MATRIX_ACCESS_TOKEN"]).start(), ready=_initial_sync),
    Case("nextcloud",
         config=lambda fake: {"server_url": fake.url, "token_env": "NEXTCLOUD_TOKEN", "poll_interval_secs": 0.2,
                              "long_poll_secs": 1},
         say=lambda fake, user, text: fake.user_says(user, text),
         replies=lambda fake, chat: fake.replies(chat),
         start=lambda: FakeNextcloud(ENV["NEXTCLOUD_TOKEN"]).start()),
    Case("nostr",
         config=lambda fake: {"private_key_env": "NOSTR_PRIVATE_KEY", "relays": [f"ws://127.0.0.1:{fake.port}/"]},
         say=lambda fake, user, text: fake.user_says(NOSTR_NAMES[user], text),
         replies=lambda fake, pubkey: fake.replies(pubkey),
         user=user_pubkey("ann"), other=user_pubkey("mallory"),
         start=lambda: FakeRelay(NOSTR_BOT).start()),
    Case("reddit",
         config=lambda fake: {"api_url": fake.url, "auth_url": fake.url, "client_id": REDDIT_CLIENT_ID,
                              "username": REDDIT_BOT, "client_secret_env": "REDDIT_CLIENT_SECRET",
                              "password_env": "REDDIT_PASSWORD", "subreddits": ["agents"], "poll_interval_secs": 0.2},
         say=lambda fake, user, text: fake.user_says(user, f"u/{REDDIT_BOT} {text}"),
         replies=lambda fake, chat: fake.replies(chat),
         start=lambda: FakeReddit(ENV["REDDIT_CLIENT_SECRET"], ENV["REDDIT_PASSWORD"]).start()),
    Case("revolt",
         config=lambda fake: {"api_url": fake.url, "ws_url": fake.url.replace("http", "ws", 1),
                              "bot_token_env": "REVOLT_BOT_TOKEN", "ping_secs": 0.3},
         say=lambda fake, user, text: fake.user_says(user, text),
         replies=lambda fake, chat: fake.replies(chat),
         other_id=FakeRevolt("x").people["mallory"]["_id"],
         start=lambda: FakeRevolt(ENV["REVOLT_BOT_TOKEN"]).start()),
    Case("rocketchat",
         config=lambda fake: {"server_url": fake.url, "user_id": ROCKETCHAT_BOT_ID, "token_env": "ROCKETCHAT_TOKEN",
                              "poll_interval_secs": 0.2},
         say=lambda fake, user, text: fake.user_says(user, text),
         replies=lambda fake, chat: fake.replies(chat),
         group_say=lambda fake, user, text: fake.user_says(user, text, room="GENERALROOM"),
         start=lambda: FakeRocketChat(ENV["ROCKETCHAT_TOKEN"]).start()),
    Case("signal",
         config=lambda fake: {"api_url": fake.url, "phone_number": SIGNAL_BOT, "poll_interval_secs": 0.1},
         say=lambda fake, user, text: fake.user_says(user, text),
         replies=lambda fake, chat: fake.replies(chat),
         user=SIGNAL_NUMBERS["ann"], other="mallory", other_id=SIGNAL_NUMBERS["mallory"],
         start=lambda: FakeSignal().start()),
    Case("slack",
         config=lambda fake: {"api_url": fake.url + "/api", "app_token_env": "SLACK_APP_TOKEN",
                              "bot_token_env": "SLACK_BOT_TOKEN"},
         say=lambda fake, user, text: fake.user_says(user, text),
         replies=lambda fake, chat: fake.replies(chat),
         user="U1ANN", other="U1MALLORY",
         group_say=lambda fake, user, text: fake.user_says(user, text, channel="C0GROUP"),
         start=lambda: FakeSlack(ENV["SLACK_APP_TOKEN"], ENV["SLACK_BOT_TOKEN"], ENV["SLACK_SIGNING_SECRET"]).start()),
    Case("telegram",
         config=lambda fake: {"bot_token_env": "TELEGRAM_BOT_TOKEN", "api_url": fake.url, "long_poll_secs": 1},
         say=_telegram_say, replies=lambda fake, chat: fake.replies_to(chat),
         other_id=str(TELEGRAM_USERS["mallory"]),
         start=lambda: FakeTelegram(ENV["TELEGRAM_BOT_TOKEN"]).start()),
    Case("twist",
         config=lambda fake: {"api_url": fake.url, "token_env": "TWIST_TOKEN", "workspace_id": str(TWIST_WORKSPACE),
                              "poll_interval_secs": 0.2},
         say=lambda fake, user, text: fake.user_says(user, f"[Agent Bot](twist-mention://{TWIST_BOT_ID}) {text}"),
         replies=lambda fake, chat: fake.replies(chat),
         other_id="702",
         start=lambda: FakeTwist(ENV["TWIST_TOKEN"]).start()),
    Case("webex",
         config=lambda fake: {"bot_token_env": "WEBEX_BOT_TOKEN", "api_url": fake.url,
                              "webhook_port": fake.listen_port,
                              "webhook_url": f"http://127.0.0.1:{fake.listen_port}/webex"},
         say=lambda fake, user, text: fake.user_says(user, text),
         replies=lambda fake, room: fake.replies(room),
         user="ann@example.com", other="mallory@example.com", other_id="PERSON-mallory",
         start=_webex,
         exempt={"reconnect_and_stop": "Webex calls the adapter's webhook: there is no connection to lose"}),
    Case("zulip",
         config=lambda fake: {"server_url": fake.url, "bot_email": ZULIP_BOT_EMAIL, "api_key_env": "ZULIP_API_KEY",
                              "long_poll_secs": 5},
         say=lambda fake, user, text: fake.user_says(user, text),
         replies=lambda fake, chat: fake.replies(chat),
         user="ann@zulip.test", other="mallory", other_id="mallory@zulip.test",
         group_say=lambda fake, user, text: fake.user_says(user, text, stream="general", topic="team"),
         start=lambda: FakeZulip(ENV["ZULIP_API_KEY"]).start()),
)}
