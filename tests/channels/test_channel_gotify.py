"""Gotify adapter against a fake server: WebSocket stream in, REST message out (own
messages skipped), allow-list by application id, reconnect, clean stop."""

from __future__ import annotations

import time

import pytest

from channel_fixtures import (CHANNEL_ENV, audit, channel, channel_daemon, configure, remove,  # noqa: F401
                              wait_active, wait_for)
from fakes.gotify import FakeGotify


@pytest.fixture
def gotify(channel_daemon):
    fake = FakeGotify(CHANNEL_ENV["GOTIFY_APP_TOKEN"], CHANNEL_ENV["GOTIFY_CLIENT_TOKEN"]).start()
    yield fake
    channel_daemon.delete("/api/channels/gotify/configure")
    fake.stop()


def setup(daemon, fake, **extra):
    configure(daemon, "gotify", server_url=fake.url, app_token_env="GOTIFY_APP_TOKEN",
              client_token_env="GOTIFY_CLIENT_TOKEN", default_agent="helper", **extra)
    wait_active(daemon, "gotify")
    wait_for(fake.hub.connected, what="stream connected")


def test_round_trip_allow_list_reconnect_stop(channel_daemon, gotify):
    setup(channel_daemon, gotify, allowed_users=["7"])
    gotify.post(9, "from an unknown app")
    gotify.post(7, "hello gotify")
    wait_for(gotify.bot_messages, what="reply")
    time.sleep(0.5)
    assert gotify.bot_messages() == ["echo: hello gotify"]  # own reply not answered, app 9 refused
    assert audit(channel_daemon, "channel.refused", "gotify")[0]["detail"]["sender"] == "9"
    gotify.drop_connections()
    wait_for(lambda: audit(channel_daemon, "channel.reconnected", "gotify"), what="reconnect")
    wait_for(gotify.hub.connected, what="stream reconnected")
    gotify.post(7, "after drop")
    wait_for(lambda: len(gotify.bot_messages()) == 2, what="reply after drop")
    remove(channel_daemon, "gotify")
    wait_for(lambda: gotify.hub.connected() == 0, what="stream closed")
    assert channel(channel_daemon, "gotify")["active"] is False
