"""Rocket.Chat adapter against a fake server: direct and channel (mention, threaded)
round trips, history not answered, allow-list, 429, reconnect, clean stop."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.rocketchat import BOT, BOT_ID, FakeRocketChat

CASE = contract.Case(
    name="rocketchat",
    config=lambda fake: {"server_url": fake.url, "user_id": BOT_ID, "token_env": "ROCKETCHAT_TOKEN",
                         "poll_interval_secs": 0.2},
    say=lambda fake, user, text: fake.user_says(user, text),
    replies=lambda fake, chat: fake.replies(chat))


@pytest.fixture
def fake(daemon):  # noqa: F811
    server = FakeRocketChat(contract.POLL_ENV["ROCKETCHAT_TOKEN"]).start()
    yield server
    daemon.delete("/api/channels/rocketchat/configure")
    server.stop()


def test_direct_and_channel_round_trip(daemon, fake):  # noqa: F811
    fake.user_says("ann", "old message", room="GENERALROOM")
    contract.round_trip(daemon, CASE, fake)
    fake.user_says("bob", "plain chatter", room="GENERALROOM")
    fake.user_says("bob", f"@{BOT} what's new?", room="GENERALROOM")
    wait_for(lambda: fake.replies("GENERALROOM"), what="channel reply")
    time.sleep(0.5)
    asked = next(m for m in fake.messages if m["msg"].endswith("what's new?"))
    assert fake.replies("GENERALROOM") == ["echo: what's new?"]
    assert fake.sent[-1]["tmid"] == asked["_id"]  # answered in the message's thread


def test_allow_list(daemon, fake):  # noqa: F811
    contract.refusal(daemon, CASE, fake)


def test_rate_limit(daemon, fake):  # noqa: F811
    contract.rate_limited(daemon, CASE, fake)


def test_reconnect_and_stop(daemon, fake):  # noqa: F811
    contract.reconnect_and_stop(daemon, CASE, fake)


def test_threads_end(fake):
    contract.threads_end(CASE, fake)
