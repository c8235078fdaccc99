"""Rocket.Chat adapter against a fake server: direct and channel (mention, threaded) round
trips, history not answered. The shared checks (round trip, allow-list, 429, reconnect,
stop, threads) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.rocketchat import BOT

CASE = contract.CASES["rocketchat"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


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
