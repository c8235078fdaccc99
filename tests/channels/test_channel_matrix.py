"""Matrix adapter against a fake homeserver: /sync since-tokens (history not answered),
room send, typing, allow-lists by room and user. The shared checks (round trip, allow-list,
429, reconnect, stop, threads) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_fixtures import audit, channel_daemon, configure, wait_active, wait_for  # noqa: F401

ROOM = "!room1:test"


@pytest.fixture
def matrix(channel_daemon):
    yield from contract.serve(channel_daemon, contract.CASES["matrix"])


def setup(daemon, fake, **extra):
    configure(daemon, "matrix", access_token_env="MATRIX_ACCESS_TOKEN", homeserver_url=fake.url,
              long_poll_secs=1, default_agent="helper", **extra)
    wait_active(daemon, "matrix")
    wait_for(lambda: any(s["since"] for s in fake.syncs), what="initial sync done")


def test_room_message_round_trip_history_ignored(channel_daemon, matrix):
    matrix.user_says(ROOM, "@ann:test", "old message before the bot started")
    setup(channel_daemon, matrix)
    matrix.user_says(ROOM, "@ann:test", "hi matrix")
    wait_for(lambda: matrix.bot_messages(ROOM), what="reply")
    assert matrix.bot_messages(ROOM) == ["echo: hi matrix"]
    assert (ROOM, "@bot:test", True) in matrix.typing
    time.sleep(0.5)  # the bot's own message came back through /sync and was not answered
    assert matrix.bot_messages(ROOM) == ["echo: hi matrix"]


def test_allow_lists(channel_daemon, matrix):
    setup(channel_daemon, matrix, allowed_rooms=[ROOM], allowed_users=["@ann:test"])
    matrix.user_says("!other:test", "@ann:test", "wrong room")
    matrix.user_says(ROOM, "@eve:test", "wrong user")
    matrix.user_says(ROOM, "@ann:test", "right place")
    wait_for(lambda: matrix.bot_messages(ROOM), what="reply")
    assert matrix.bot_messages(ROOM) == ["echo: right place"] and matrix.bot_messages("!other:test") == []
    reasons = {e["detail"]["reason"] for e in audit(channel_daemon, "channel.refused", "matrix")[:2]}
    assert reasons == {"chat not in allowed_channels", "sender not in allowed_users"}

