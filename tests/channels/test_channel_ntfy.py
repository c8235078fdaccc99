"""ntfy adapter against a fake server: SSE subscribe, publish replies (own messages
recognised), resume with since=<id>, reconnect, clean stop. ntfy has no sender
identity, so there is no allow-list test (see the README)."""

from __future__ import annotations

import time

import pytest

from channel_fixtures import (CHANNEL_ENV, audit, channel, channel_daemon, configure, remove,  # noqa: F401
                              wait_active, wait_for)
from fakes.ntfy import FakeNtfy

TOPIC = "agentd-test"


@pytest.fixture
def ntfy(channel_daemon):
    fake = FakeNtfy(CHANNEL_ENV["NTFY_TOKEN"]).start()
    yield fake
    channel_daemon.delete("/api/channels/ntfy/configure")
    fake.stop()


def setup(daemon, fake):
    configure(daemon, "ntfy", topic=TOPIC, server_url=fake.url, token_env="NTFY_TOKEN", default_agent="helper")
    wait_active(daemon, "ntfy")
    wait_for(lambda: fake.subscriptions, what="subscribed")


def test_round_trip_and_reconnect_resumes(channel_daemon, ntfy):
    setup(channel_daemon, ntfy)
    ntfy.publish(TOPIC, "hello ntfy")
    wait_for(lambda: ntfy.bot_messages(TOPIC), what="reply")
    time.sleep(0.5)  # our own reply came back on the topic and was not answered
    assert ntfy.bot_messages(TOPIC) == ["echo: hello ntfy"]
    last_seen = ntfy.messages[-1]["id"]
    ntfy.restart()
    wait_for(lambda: audit(channel_daemon, "channel.reconnected", "ntfy"), what="reconnect")
    assert ntfy.subscriptions[-1]["since"] == last_seen  # resumed after the last message seen
    ntfy.publish(TOPIC, "after restart")
    wait_for(lambda: len(ntfy.bot_messages(TOPIC)) == 2, what="reply after restart")
    assert ntfy.bot_messages(TOPIC)[1] == "echo: after restart"


def test_clean_stop(channel_daemon, ntfy):
    setup(channel_daemon, ntfy)
    remove(channel_daemon, "ntfy")
    assert channel(channel_daemon, "ntfy")["active"] is False
    count = len(ntfy.subscriptions)
    ntfy.publish(TOPIC, "nobody listens")
    time.sleep(1.0)
    assert ntfy.bot_messages(TOPIC) == [] and len(ntfy.subscriptions) == count
