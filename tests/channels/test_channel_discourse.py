"""Discourse adapter against a fake forum: mention and category round trips (reply to the
post number), old posts not answered. The shared checks (round trip, allow-list, 429,
reconnect, stop, threads) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.discourse import BOT

CASE = contract.CASES["discourse"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_mention_and_category_round_trip(daemon, fake):  # noqa: F811
    old = fake.user_says("ann", f"@{BOT} from before the bot started")
    topic = contract.round_trip(daemon, CASE, fake)
    assert fake.sent[0]["reply_to_post_number"] == 1 and fake.replies(old) == []
    contract.setup(daemon, CASE, fake, categories=["support"])
    fake.user_says("bob", "no mention in the lounge")
    support = fake.user_says("bob", "a question in support", category=4)
    wait_for(lambda: fake.replies(support), what="category reply")
    time.sleep(0.5)
    assert fake.replies(support) == ["echo: a question in support"]
    assert len(fake.sent) == 2 and fake.replies(topic) == ["echo: hello discourse"]
