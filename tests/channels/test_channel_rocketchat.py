"""Rocket.Chat adapter against a fake server: direct and channel (mention, threaded) round
trips, history not answered. The shared checks (round trip, allow-list, 429, reconnect,
stop, threads) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import audit, daemon  # noqa: F401 - module fixture
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


def test_a_thread_is_one_conversation_and_threading_false_answers_in_the_room(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    fake.user_says("bob", f"@{BOT} start of a thread", room="GENERALROOM")
    wait_for(lambda: fake.replies("GENERALROOM"), what="threaded reply")
    root = next(m for m in fake.messages if m["msg"].endswith("start of a thread"))["_id"]
    fake.user_says("bob", f"@{BOT} still in the thread", room="GENERALROOM", tmid=root)
    wait_for(lambda: len(fake.replies("GENERALROOM")) == 2, what="second reply")
    assert [m.get("tmid") for m in fake.sent[-2:]] == [root, root]
    keys = [e["detail"]["conversation"] for e in audit(daemon, "channel.inbound", "rocketchat")[:2]]
    assert keys == [f"rocketchat:chat:#general:thread:{root}:user:id-bob"] * 2
    contract.setup(daemon, CASE, fake, overrides={"threading": False})
    fake.user_says("bob", f"@{BOT} in the room please", room="GENERALROOM")
    wait_for(lambda: len(fake.replies("GENERALROOM")) == 3, what="room reply")
    assert not fake.sent[-1].get("tmid")
