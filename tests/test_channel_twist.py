"""Twist adapter against a fake API v3: a comment mentioning the bot is answered in its
thread (other comments are not), allow-list, 429, reconnect, clean stop."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.twist import BOT_ID, WORKSPACE, FakeTwist

MENTION = f"[Agent Bot](twist-mention://{BOT_ID})"
CASE = contract.Case(
    name="twist",
    config=lambda fake: {"api_url": fake.url, "token_env": "TWIST_TOKEN", "workspace_id": str(WORKSPACE),
                         "poll_interval_secs": 0.2},
    say=lambda fake, user, text: fake.user_says(user, f"{MENTION} {text}"),
    replies=lambda fake, chat: fake.replies(chat),
    other_id="702")


@pytest.fixture
def fake(daemon):  # noqa: F811
    server = FakeTwist(contract.POLL_ENV["TWIST_TOKEN"]).start()
    yield server
    daemon.delete("/api/channels/twist/configure")
    server.stop()


def test_mention_round_trip_in_thread(daemon, fake):  # noqa: F811
    contract.round_trip(daemon, CASE, fake)
    fake.user_says("bob", "no mention here", thread=402)
    fake.user_says("bob", f"{MENTION} in random", thread=402)
    fake.user_says("bob", f"{MENTION} twice in a second", thread=402)
    wait_for(lambda: len(fake.replies(402)) == 2, what="replies in thread 402")
    time.sleep(0.5)
    assert sorted(fake.replies(402)) == ["echo: in random", "echo: twice in a second"]


def test_allowed_channels(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake, allowed_channels=["general"])
    fake.user_says("bob", f"{MENTION} not here", thread=402)
    fake.user_says("bob", f"{MENTION} here", thread=401)
    wait_for(lambda: fake.replies(401), what="reply in general")
    time.sleep(0.5)
    assert fake.replies(402) == [] and fake.replies(401) == ["echo: here"]


def test_allow_list(daemon, fake):  # noqa: F811
    contract.refusal(daemon, CASE, fake)


def test_rate_limit(daemon, fake):  # noqa: F811
    contract.rate_limited(daemon, CASE, fake)


def test_reconnect_and_stop(daemon, fake):  # noqa: F811
    contract.reconnect_and_stop(daemon, CASE, fake)


def test_threads_end(fake):
    contract.threads_end(CASE, fake)
