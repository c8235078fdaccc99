"""Twist adapter against a fake API v3: a comment mentioning the bot is answered in its
thread (other comments are not), allowed channels, lifecycle reactions on the asking
comment. The shared checks (round trip, allow-list, 429, reconnect, stop, threads) run in
tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.twist import BOT_ID

MENTION = f"[Agent Bot](twist-mention://{BOT_ID})"
CASE = contract.CASES["twist"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


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


def test_lifecycle_reactions_on_the_asking_comment(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake, overrides={"lifecycle_reactions": True})
    fake.user_says("bob", f"{MENTION} react to me", thread=401)
    wait_for(lambda: fake.replies(401), what="reply")
    asked = next(c["id"] for c in fake.comments if c["content"].endswith("react to me"))
    wait_for(lambda: fake.reactions.get(asked) == ["✅"], what="👀 replaced by ✅")
    assert fake.removed == [(asked, "👀")]
    fake.user_says("bob", f"{MENTION} [[fail:500]] twist boom", thread=401)
    wait_for(lambda: len(fake.replies(401)) == 2, what="the apology")
    failed = next(c["id"] for c in fake.comments if c["content"].endswith("twist boom"))
    wait_for(lambda: fake.reactions.get(failed) == ["⚠️"], what="👀 replaced by ⚠️")
