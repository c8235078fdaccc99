"""In-process: each base, driven by a real adapter against its fake, ends every thread
on stop() (also while the platform is unreachable and the adapter is backing off)."""

from __future__ import annotations

import os
import threading

import pytest

from agentd.channels.adapter import ChannelContext
from agentd.channels.catalog import ChannelCatalog, settings_for
from channel_fixtures import CHANNEL_ENV, wait_for
from fakes.gotify import FakeGotify
from fakes.mattermost import FakeMattermost
from fakes.ntfy import FakeNtfy
from fakes.telegram import FakeTelegram
from support import free_port


@pytest.fixture(autouse=True)
def secrets(monkeypatch):
    for key, value in CHANNEL_ENV.items():
        monkeypatch.setenv(key, value)


def make(name: str, got: list, **section):
    from agentd.channels import adapters

    info = ChannelCatalog.load().get(name)
    ctx = ChannelContext(name, "127.0.0.1", deliver=got.append, audit=lambda *a: None,
                         load_state=dict, save_state=lambda s: None)
    return adapters.load(name)(ctx, settings_for(info, section))


CASES = {
    "telegram": (lambda: FakeTelegram(CHANNEL_ENV["TELEGRAM_BOT_TOKEN"]),
                 lambda f: dict(api_url=f.url, long_poll_secs=1),
                 lambda f: f.user_says(5, "hi")),
    "ntfy": (lambda: FakeNtfy(CHANNEL_ENV["NTFY_TOKEN"]),
             lambda f: dict(server_url=f.url, topic="t", token_env="NTFY_TOKEN"),
             lambda f: wait_for(lambda: f.subscriptions) and f.publish("t", "hi")),
    "gotify": (lambda: FakeGotify(CHANNEL_ENV["GOTIFY_APP_TOKEN"], CHANNEL_ENV["GOTIFY_CLIENT_TOKEN"]),
               lambda f: dict(server_url=f.url),
               lambda f: wait_for(f.hub.connected) and f.post(7, "hi")),
    "mattermost": (lambda: FakeMattermost(CHANNEL_ENV["MATTERMOST_TOKEN"]),
                   lambda f: dict(server_url=f.url),
                   lambda f: wait_for(f.hub.connected) and f.user_says("u1", "ann", "c1", "hi")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_threads_end_on_stop(name):
    make_fake, section, say = CASES[name]
    fake = make_fake().start()
    got: list = []
    adapter = make(name, got, **section(fake))
    try:
        adapter.start()
        wait_for(adapter.health, what=f"{name} healthy")
        say(fake)
        wait_for(lambda: got, what="inbound delivered")
        assert got[0].text == "hi"
        fake.stop()  # platform gone: the adapter is now failing and backing off
        wait_for(lambda: not adapter.health(), what="unhealthy")
    finally:
        adapter.stop(timeout=5)
        fake.stop()
    assert adapter.threads_alive() == 0
    assert not [t for t in threading.enumerate() if t.name.startswith(f"channel-{name}")]


def test_webhook_listener_thread_ends():
    got: list = []
    adapter = make("webhook", got, listen_port=free_port(), callback_url="http://127.0.0.1:9/")
    adapter.start()
    assert adapter.health()
    adapter.stop()
    assert adapter.threads_alive() == 0 and not adapter.health()
    assert os.environ["WEBHOOK_TEST_SECRET"]  # (the env fixture ran)


def test_stop_interrupts_a_long_poll_in_flight():
    fake = FakeTelegram(CHANNEL_ENV["TELEGRAM_BOT_TOKEN"]).start()
    got: list = []
    adapter = make("telegram", got, api_url=fake.url, long_poll_secs=60)
    try:
        fake.user_says(5, "first")
        adapter.start()
        wait_for(lambda: got, what="first update")
        wait_for(lambda: len(fake.polls) >= 2, what="next long poll waiting")  # blocks up to 60 s
        adapter.stop(timeout=5)
        assert adapter.threads_alive() == 0  # the 60 s poll was cut, not waited for
    finally:
        fake.stop()
