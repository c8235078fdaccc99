"""Reddit adapter against a fake API: password-grant token, mention and reply-to-bot round
trips as threaded comments, old comments not answered. The shared checks (round trip,
allow-list, 429, reconnect, stop, threads) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.reddit import BOT

CASE = contract.CASES["reddit"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_mention_and_follow_up_round_trip(daemon, fake):  # noqa: F811
    old = fake.user_says("ann", f"u/{BOT} an old question")
    asked = contract.round_trip(daemon, CASE, fake)
    assert fake.replies(old) == [] and len(fake.tokens) == 1
    fake.user_says("bob", "a comment about something else")
    follow_up = fake.user_says("ann", "and a follow-up", parent=fake.sent[0]["name"])  # no mention needed
    wait_for(lambda: fake.replies(follow_up), what="follow-up reply")
    time.sleep(0.5)
    assert fake.replies(follow_up) == ["echo: and a follow-up"] and len(fake.sent) == 2
    assert fake.sent[0]["parent_id"] == asked
