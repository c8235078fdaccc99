"""Zulip adapter against a fake server: event queue long-poll, private and stream
(mention) round trips in the right topic, an expired queue registered again. The shared
checks (round trip, allow-list, 429, reconnect, stop, threads) run in
tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import audit, daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.zulip import BOT_ID, BOT_NAME

CASE = contract.CASES["zulip"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_private_and_stream_round_trip(daemon, fake):  # noqa: F811
    contract.round_trip(daemon, CASE, fake)
    assert {"op": "start", "to": [11]} in fake.typing
    fake.user_says("bob", "chatter without a mention", stream="general", topic="lunch")
    fake.user_says("bob", f"@**{BOT_NAME}** where to eat?", stream="general", topic="lunch")
    wait_for(lambda: fake.replies(("general", "lunch")), what="stream reply")
    time.sleep(0.3)
    assert fake.replies(("general", "lunch")) == ["echo: where to eat?"]
    assert not any(m["to"] == BOT_ID for m in fake.sent)


def test_expired_queue_is_registered_again_and_threads_end(fake):
    for adapter, got in contract.in_process(CASE, fake):
        adapter.start()
        wait_for(lambda: fake.queues, what="queue registered")
        fake.queues.clear()  # the server forgot the queue
        wait_for(lambda: fake.queues, what="queue registered again")
        fake.user_says("ann", "still there?")
        wait_for(lambda: got, what="inbound")
        assert got[0].text == "still there?" and got[0].conversation.key == "zulip:dm:ann@zulip.test"
        adapter.stop()
        assert adapter.threads_alive() == 0


def test_each_topic_is_a_conversation_answered_in_its_topic(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    mention = f"@**{BOT_NAME}**"
    fake.user_says("ann", f"{mention} topic one", stream="general", topic="one")
    fake.user_says("ann", f"{mention} topic two", stream="general", topic="two")
    wait_for(lambda: fake.replies(("general", "one")) and fake.replies(("general", "two")), what="two replies")
    assert fake.replies(("general", "one")) == ["echo: topic one"]
    conversations = {e["detail"]["conversation"] for e in audit(daemon, "channel.inbound", "zulip")}
    assert {"zulip:chat:general:thread:one:user:ann@zulip.test",
            "zulip:chat:general:thread:two:user:ann@zulip.test"} <= conversations
