"""Mattermost adapter against a fake server: WebSocket authentication challenge and
`posted` events in, REST posts out (threaded under the root post), typing, allow-list
by channel, reconnect, clean stop."""

from __future__ import annotations

import time

import pytest

from channel_fixtures import (CHANNEL_ENV, audit, channel, channel_daemon, configure, remove,  # noqa: F401
                              wait_active, wait_for)
from fakes.mattermost import FakeMattermost

TOWN = "townsquare000000000000000a"
DM = "dmchannel0000000000000000a"


@pytest.fixture
def mattermost(channel_daemon):
    fake = FakeMattermost(CHANNEL_ENV["MATTERMOST_TOKEN"]).start()
    yield fake
    channel_daemon.delete("/api/channels/mattermost/configure")
    fake.stop()


def setup(daemon, fake, **extra):
    configure(daemon, "mattermost", server_url=fake.url, token_env="MATTERMOST_TOKEN", default_agent="helper",
              **extra)
    wait_active(daemon, "mattermost")
    wait_for(lambda: [f for f in fake.hub.received if isinstance(f, dict)
                      and f.get("action") == "authentication_challenge"], what="authenticated")


def test_round_trip_threads_and_allow_list(channel_daemon, mattermost):
    setup(channel_daemon, mattermost, allowed_channels=[TOWN])
    root = mattermost.user_says("user-ann", "ann", TOWN, "hello mattermost")
    mattermost.user_says("user-eve", "eve", "elsewhere00000000000000000", "not allowed here")
    wait_for(lambda: mattermost.bot_posts(TOWN), what="reply")
    time.sleep(0.5)
    posts = mattermost.bot_posts(TOWN)
    assert [(p["message"], p["root_id"]) for p in posts] == [("echo: hello mattermost", root)]
    assert TOWN in mattermost.typing
    assert audit(channel_daemon, "channel.refused", "mattermost")[0]["detail"]["chat"] == "elsewhere00000000000000000"
    mattermost.user_says("user-ann", "ann", DM, "direct question", direct=True)  # DMs pass allowed_channels
    wait_for(lambda: mattermost.bot_posts(DM), what="dm reply")
    assert [(p["message"], p["root_id"]) for p in mattermost.bot_posts(DM)] == [("echo: direct question", "")]


def test_reconnect_and_clean_stop(channel_daemon, mattermost):
    setup(channel_daemon, mattermost)
    mattermost.restart()
    wait_for(lambda: audit(channel_daemon, "channel.reconnected", "mattermost"), what="reconnect")
    wait_for(mattermost.hub.connected, what="socket back")
    mattermost.user_says("user-ann", "ann", TOWN, "after restart")
    wait_for(lambda: mattermost.bot_posts(TOWN), what="reply after restart")
    remove(channel_daemon, "mattermost")
    wait_for(lambda: mattermost.hub.connected() == 0, what="socket closed")
    assert channel(channel_daemon, "mattermost")["active"] is False
