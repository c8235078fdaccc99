"""Bluesky adapter against a fake PDS: a mention is answered with a reply post whose
root/parent refs point at it, a reply in the thread keeps the root, expired tokens log in
again. The shared checks (round trip, allow-list, 429, reconnect, stop, threads) run in
tests/channels/test_channel_contract.py."""

from __future__ import annotations

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.bluesky import BOT_HANDLE

CASE = contract.CASES["bluesky"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_mention_and_thread_reply(daemon, fake):  # noqa: F811
    old = fake.user_says("ann.bsky.test", f"@{BOT_HANDLE} before the bot started")
    uri = contract.round_trip(daemon, CASE, fake)
    mention = next(n for n in fake.notifications if n["uri"] == uri)
    assert fake.replies(old) == []
    assert fake.sent[0]["reply"] == {"root": {"uri": uri, "cid": mention["cid"]},
                                     "parent": {"uri": uri, "cid": mention["cid"]}}
    fake.expire()  # the access token runs out: the adapter logs in again
    bot_post = fake.sent[0]
    follow = fake.user_says("ann.bsky.test", "thanks, and more?", reply_to={
        "uri": bot_post["uri"], "cid": bot_post["cid"], "root": {"uri": uri, "cid": mention["cid"]}})
    wait_for(lambda: fake.replies(follow), what="thread reply")
    assert fake.replies(follow) == ["echo: thanks, and more?"]
    assert fake.sent[-1]["reply"]["root"]["uri"] == uri and len(fake.sessions) == 2
