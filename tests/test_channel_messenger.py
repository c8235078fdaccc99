"""Messenger adapter against a fake Send API: the GET verification handshake, signed
page events reach the agent and are answered via /me/messages, forged signatures and
wrong verify tokens are 401, echoes ignored, allow-list, 429 retried, stop."""

from __future__ import annotations

import time

import pytest
import requests

from channel_fixtures import CHANNEL_ENV, audit, configure, remove, wait_active, wait_for
from channel_fixtures import channel_daemon  # noqa: F401
from fakes.messenger import FakeMessenger, event
import meta_webhook
from support import free_port

SECRET = CHANNEL_ENV["MESSENGER_APP_SECRET"]
TOKEN, VERIFY = CHANNEL_ENV["MESSENGER_PAGE_TOKEN"], CHANNEL_ENV["MESSENGER_VERIFY_TOKEN"]


@pytest.fixture
def messenger(channel_daemon):
    fake, port = FakeMessenger(TOKEN).start(), free_port()
    configure(channel_daemon, "messenger", webhook_port=port, api_url=fake.url, default_agent="helper")
    wait_active(channel_daemon, "messenger")
    yield fake, f"http://127.0.0.1:{port}/webhook", port
    remove(channel_daemon, "messenger")
    fake.stop()


def post(url: str, body: bytes, sig: str | None = None) -> requests.Response:
    return meta_webhook.post(url, SECRET, body, sig)


def test_verification_handshake(messenger):
    meta_webhook.check_verification_handshake(messenger[1], VERIFY)


def test_message_is_answered_through_the_send_api(channel_daemon, messenger):
    fake, url, _ = messenger
    assert post(url, event("our own echo", "PAGE", echo=True)).status_code == 200
    response = post(url, event("hello page", "psid-1"))
    assert (response.status_code, response.json()) == (200, {"status": "EVENT_RECEIVED"})
    wait_for(lambda: fake.sent, what="reply")
    time.sleep(0.3)
    assert [(s["to"], s["text"], s["type"]) for s in fake.sent] == [("psid-1", "echo: hello page", "RESPONSE")]
    assert audit(channel_daemon, "channel.outbound", "messenger")[0]["detail"]["message_id"] == fake.sent[0]["mid"]


def test_forged_signature_is_refused_before_the_agent(channel_daemon, messenger, fake_llm):
    fake, url, _ = messenger
    meta_webhook.check_forged_signature_refused(url, SECRET, event("forged", "psid-x"), fake, fake_llm)


def test_allow_list_and_429(channel_daemon, messenger):
    fake, url, port = messenger
    meta_webhook.check_allow_list_and_429(channel_daemon, "messenger", fake, url, SECRET, event, webhook_port=port,
                                          api_url=fake.url)


def test_stop_closes_the_listener(channel_daemon, messenger):
    fake, url, port = messenger
    meta_webhook.check_stop_closes_the_listener(channel_daemon, "messenger", url, SECRET, event("gone", "psid-1"),
                                                webhook_port=port, api_url=fake.url)

