"""Revolt adapter against a fake delta REST API + Bonfire WebSocket: Authenticate, Ready,
Ping/Pong, DMs and server mentions answered (replies reference the message), own/bot
messages ignored, channels Ready did not list fetched, a server id in the allow-list,
reconnect after unanswered pings, a bad or revoked token. The shared checks (round trip,
allow-list, a 429 whose wait is in milliseconds, reconnect, stop, threads) run in
tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import audit, daemon  # noqa: F401 - module fixture
from channel_fixtures import channel, configure, wait_for
from fakes.revolt import BOT, GENERAL, LATER, SERVER

TOKEN = contract.POLL_ENV["REVOLT_BOT_TOKEN"]
CASE = contract.CASES["revolt"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_dm_and_server_mentions(daemon, fake):  # noqa: F811
    contract.round_trip(daemon, CASE, fake)
    assert [f for f in fake.received if f.get("type") == "Authenticate"][0] == {"type": "Authenticate",
                                                                                "token": TOKEN}
    fake.user_says("bob", "plain chatter", channel=GENERAL)
    fake.user_says("otherbot", "I am a bot too")
    fake.user_says("bob", "what's new?", channel=GENERAL, mention=True)
    fake.user_says("ann", "in a late channel", channel=LATER, mention=True)
    wait_for(lambda: fake.replies(GENERAL) and fake.replies(LATER), what="server replies")
    time.sleep(0.5)
    asked = next(m for m in fake.messages if m["content"].endswith("what's new?"))
    assert fake.replies(GENERAL) == ["echo: what's new?"] and fake.replies(LATER) == ["echo: in a late channel"]
    assert [s["replies"] for s in fake.sent if s["channel"] == GENERAL] == [[{"id": asked["_id"], "mention": False}]]
    assert fake.replies("DMOTHERBOT") == [] and GENERAL in fake.typing
    assert len([m for m in fake.messages if m["author"] == BOT["_id"]]) == 3  # own echoes never answered
    pings = [f for f in fake.received if f.get("type") == "Ping"]
    assert pings and isinstance(pings[0]["data"], int)


def test_a_server_id_allows_its_channels(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake, allowed_channels=[SERVER])  # a server id covers its channels
    fake.user_says("bob", "server-wide", channel=GENERAL, mention=True)
    wait_for(lambda: fake.replies(GENERAL) == ["echo: server-wide"], what="reply in the allowed server")


def test_unanswered_pings_reconnect_and_bad_token(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    before = len([f for f in fake.received if f.get("type") == "Authenticate"])
    fake.pong = False
    wait_for(lambda: len([f for f in fake.received if f.get("type") == "Authenticate"]) > before,
             what="re-authentication after silent pings")
    fake.pong = True
    fake.user_says("ann", "still there?")
    wait_for(lambda: fake.replies("DMANN") == ["echo: still there?"], what="reply after reconnect")
    result = configure(daemon, "revolt", **{**CASE.config(fake), "bot_token_env": "REVOLT_OTHER_TOKEN"})
    assert result["activated"] is False and channel(daemon, "revolt")["active"] is False
    assert "HTTP 401" in audit(daemon, "channel.start_failed", "revolt")[0]["detail"]["error"]


def test_revoked_token_stops_reconnecting(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    fake.token = "rotated-token"  # the bot's token was reset: Bonfire answers Error InvalidSession
    fake.drop_connections()
    error = wait_for(lambda: audit(daemon, "channel.error", "revolt"), what="refusal reported")
    assert "InvalidSession" in error[0]["detail"]["error"]
    tries = len([f for f in fake.received if f.get("type") == "Authenticate"])
    time.sleep(1.5)
    assert len([f for f in fake.received if f.get("type") == "Authenticate"]) == tries
    assert channel(daemon, "revolt")["active"] is False
