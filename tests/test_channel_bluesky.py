"""Bluesky adapter against a fake PDS: a mention is answered with a reply post whose
root/parent refs point at it, a reply in the thread keeps the root, expired tokens
log in again, allow-list, 429, reconnect, clean stop."""

from __future__ import annotations

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.bluesky import BOT_HANDLE, FakeBluesky

CASE = contract.Case(
    name="bluesky",
    config=lambda fake: {"service_url": fake.url, "identifier": BOT_HANDLE, "app_password_env": "BLUESKY_APP_PASSWORD",
                         "poll_interval_secs": 0.2},
    say=lambda fake, user, text: fake.user_says(user, f"@{BOT_HANDLE} {text}"),
    replies=lambda fake, chat: fake.replies(chat),
    user="ann.bsky.test", other="mallory.bsky.test", other_id="did:plc:mallory")


@pytest.fixture
def fake(daemon):  # noqa: F811
    server = FakeBluesky(contract.POLL_ENV["BLUESKY_APP_PASSWORD"]).start()
    yield server
    daemon.delete("/api/channels/bluesky/configure")
    server.stop()


def test_mention_and_thread_reply(daemon, fake):  # noqa: F811
    old = fake.user_says("ann.bsky.test", f"@{BOT_HANDLE} before the bot started")
    uri = contract.round_trip(daemon, CASE, fake)
    mention = next(n for n in fake.notifications if n["uri"] == uri)
    assert fake.replies(old) == []
    assert fake.sent[0]["reply"] == {"root": {"uri": uri, "cid": mention["cid"]},
                                     "parent": {"uri": uri, "cid": mention["cid"]}}
    fake.expire()  # the access token runs out: the adapter logs in again
    bot_post = fake.sent[0]
    follow = fake.user_says("ann.bsky.test", "thanks, and more?", reply_to={
        "uri": bot_post["uri"], "cid": bot_post["cid"], "root": {"uri": uri, "cid": mention["cid"]}})
    wait_for(lambda: fake.replies(follow), what="thread reply")
    assert fake.replies(follow) == ["echo: thanks, and more?"]
    assert fake.sent[-1]["reply"]["root"]["uri"] == uri and len(fake.sessions) == 2


def test_allow_list(daemon, fake):  # noqa: F811
    contract.refusal(daemon, CASE, fake)


def test_rate_limit(daemon, fake):  # noqa: F811
    contract.rate_limited(daemon, CASE, fake)


def test_reconnect_and_stop(daemon, fake):  # noqa: F811
    contract.reconnect_and_stop(daemon, CASE, fake)


def test_threads_end(fake):
    contract.threads_end(CASE, fake)
