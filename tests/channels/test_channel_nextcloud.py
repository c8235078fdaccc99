"""Nextcloud Talk adapter against a fake server: one-to-one and group (mention, replyTo)
round trips with lookIntoFuture polling. The shared checks (round trip, allow-list, 429,
reconnect, stop, threads) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for

CASE = contract.CASES["nextcloud"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


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
