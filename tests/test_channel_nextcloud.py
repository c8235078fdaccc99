"""Nextcloud Talk adapter against a fake server: one-to-one and group (mention, replyTo)
round trips with lookIntoFuture polling, allow-list, 429, reconnect, clean stop."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.nextcloud import FakeNextcloud

CASE = contract.Case(
    name="nextcloud",
    config=lambda fake: {"server_url": fake.url, "token_env": "NEXTCLOUD_TOKEN", "poll_interval_secs": 0.2,
                         "long_poll_secs": 1},
    say=lambda fake, user, text: fake.user_says(user, text),
    replies=lambda fake, chat: fake.replies(chat))


@pytest.fixture
def fake(daemon):  # noqa: F811
    server = FakeNextcloud(contract.POLL_ENV["NEXTCLOUD_TOKEN"]).start()
    yield server
    daemon.delete("/api/channels/nextcloud/configure")
    server.stop()


def test_direct_and_group_round_trip(daemon, fake):  # noqa: F811
    fake.user_says("ann", "before the bot started")
    contract.round_trip(daemon, CASE, fake)
    fake.user_says("bob", "no mention", room="teamroom")
    fake.user_says("bob", "status please", room="teamroom", mention=True)
    wait_for(lambda: fake.replies("teamroom"), what="group reply")
    time.sleep(0.5)
    asked = fake.messages[-2] if fake.messages[-1]["actorId"] == "agentbot" else fake.messages[-1]
    assert fake.replies("teamroom") == ["echo: status please"]
    assert fake.sent[-1]["parent"] == {"id": asked["id"]}


def test_single_room_long_polls(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake, allowed_rooms=["teamroom"])
    fake.user_says("bob", "long poll?", room="teamroom", mention=True)
    wait_for(lambda: fake.replies("teamroom"), what="reply")
    assert fake.replies("teamroom") == ["echo: long poll?"]


def test_allow_list(daemon, fake):  # noqa: F811
    contract.refusal(daemon, CASE, fake)


def test_rate_limit(daemon, fake):  # noqa: F811
    contract.rate_limited(daemon, CASE, fake)


def test_reconnect_and_stop(daemon, fake):  # noqa: F811
    contract.reconnect_and_stop(daemon, CASE, fake)


def test_threads_end(fake):
    contract.threads_end(CASE, fake)
