"""The channel contract, shared by the polling/line-socket adapters' tests so each test
file stays short: a platform user's message reaches the agent and the reply reaches
the platform, allow-list refusal, a 429 retried after its Retry-After, a dropped
connection re-established, and stop() ending every thread.

A test module describes its platform with a `Case` and calls the checks below with its
fake (see tests/fakes/platform.py for what a fake offers)."""

from __future__ import annotations

import atexit
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest

from channel_fixtures import CHANNEL_ENV, channel, configure, remove, start_channel_daemon, wait_active, wait_for

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
                 "GUILDED_BOT_TOKEN": "guilded-bot-token"})


_SHARED: dict[str, Any] = {}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, fake_llm):
    """A daemon with the agent `helper` and the platforms' secrets in its environment,
    shared by every test module of this family in one test process (each test removes
    its channel when done), stopped when the process exits."""
    if "daemon" not in _SHARED:
        started = start_channel_daemon(tmp_path_factory.mktemp("channels"), fake_llm,
                                       env={**CHANNEL_ENV, **POLL_ENV})
        _SHARED["daemon"] = started
        atexit.register(started.stop)
    yield _SHARED["daemon"]


def audit(daemon, event: str, subject: str) -> list[dict[str, Any]]:
    """The newest 500 `event` entries (exact name) about `subject`, newest first (filtered
    server-side, so a busy shared daemon's other entries never push them out)."""
    rows = daemon.get(f"/api/audit/recent?limit=500&event={event}").json()
    return [r for r in rows if r["event"] == event and r["subject"] == subject]


@dataclass
class Case:
    """How one platform is configured and how its users talk (through its fake)."""

    name: str
    config: Callable[[Any], dict[str, Any]]          # fake -> configure keys
    say: Callable[[Any, str, str], Any]              # (fake, user, text) -> chat the reply goes to
    replies: Callable[[Any, Any], list[str]]         # (fake, chat) -> the bot's texts there
    user: str = "ann"                                # allowed in the refusal check
    other: str = "mallory"                           # refused in the refusal check
    other_id: str = ""                               # the adapter's sender id for `other`
    allow: dict[str, Any] = field(default_factory=dict)  # extra keys for the refusal check


def setup(daemon, case: Case, fake, **extra: Any) -> None:
    configure(daemon, case.name, default_agent="helper", **case.config(fake), **extra)
    wait_active(daemon, case.name)


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


def in_process(case: Case, fake, settings: dict[str, Any] | None = None) -> Iterator[tuple[Any, list]]:
    """The real adapter class in this process (no daemon): yields (adapter, inbound list)."""
    from agentd.channels import adapters
    from agentd.channels.adapter import ChannelContext
    from agentd.channels.catalog import ChannelCatalog, settings_for

    info = ChannelCatalog.load().get(case.name)
    got: list = []
    ctx = ChannelContext(case.name, "127.0.0.1", deliver=got.append, audit=lambda *a: None,
                         load_state=dict, save_state=lambda s: None)
    saved = {k: os.environ.get(k) for k in POLL_ENV}
    os.environ.update(POLL_ENV)
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
