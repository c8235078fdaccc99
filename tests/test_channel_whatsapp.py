"""WhatsApp Cloud API adapter against a fake Graph API: the GET verification handshake,
signed events reach the agent and are answered via /{phone_number_id}/messages, forged
signatures and wrong verify tokens are 401, allow-list, 429 retried, stop."""

from __future__ import annotations

import time

import pytest
import requests

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, remove, wait_active, wait_for
from channel_fixtures import channel_daemon  # noqa: F401
from fakes.whatsapp import PHONE_ID, FakeWhatsApp, event
import meta_webhook
from support import free_port

SECRET = CHANNEL_ENV["WHATSAPP_APP_SECRET"]
TOKEN, VERIFY = CHANNEL_ENV["WHATSAPP_ACCESS_TOKEN"], CHANNEL_ENV["WHATSAPP_VERIFY_TOKEN"]


@pytest.fixture
def whatsapp(channel_daemon):
    fake, port = FakeWhatsApp(TOKEN).start(), free_port()
    configure(channel_daemon, "whatsapp", webhook_port=port, api_url=fake.url, phone_number_id=PHONE_ID, default_agent="helper")
    wait_active(channel_daemon, "whatsapp")
    yield fake, f"http://127.0.0.1:{port}/webhook", port
    remove(channel_daemon, "whatsapp")
    fake.stop()


def post(url: str, body: bytes, sig: str | None = None) -> requests.Response:
    return meta_webhook.post(url, SECRET, body, sig)


def test_verification_handshake(whatsapp):
    meta_webhook.check_verification_handshake(whatsapp[1], VERIFY)


def test_message_is_answered_through_the_send_api(channel_daemon, whatsapp):
    fake, url, _ = whatsapp
    response = post(url, event("hello page", "psid-1"))
    assert (response.status_code, response.json()) == (200, {"status": "EVENT_RECEIVED"})
    wait_for(lambda: fake.sent, what="reply")
    time.sleep(0.3)
    assert [(s["to"], s["text"]) for s in fake.sent] == [("psid-1", "echo: hello page")]
    assert audit(channel_daemon, "channel.outbound", "whatsapp")[0]["detail"]["message_id"] == fake.sent[0]["id"]


def test_forged_signature_is_refused_before_the_agent(channel_daemon, whatsapp, fake_llm):
    fake, url, _ = whatsapp
    meta_webhook.check_forged_signature_refused(url, SECRET, event("forged", "psid-x"), fake, fake_llm)


def test_allow_list_and_429(channel_daemon, whatsapp):
    fake, url, port = whatsapp
    meta_webhook.check_allow_list_and_429(channel_daemon, "whatsapp", fake, url, SECRET, event, webhook_port=port,
                                          api_url=fake.url, phone_number_id=PHONE_ID)


def test_stop_closes_the_listener(channel_daemon, whatsapp):
    fake, url, port = whatsapp
    meta_webhook.check_stop_closes_the_listener(channel_daemon, "whatsapp", url, SECRET, event("gone", "psid-1"),
                                                webhook_port=port, api_url=fake.url, phone_number_id=PHONE_ID)


def test_without_phone_number_id_the_cloud_mode_does_not_start(channel_daemon):
    configure(channel_daemon, "whatsapp", webhook_port=free_port())
    time.sleep(0.5)
    assert channel(channel_daemon, "whatsapp")["active"] is False
    assert "phone_number_id" in audit(channel_daemon, "channel.start_failed", "whatsapp")[0]["detail"]["error"]
    remove(channel_daemon, "whatsapp")
