"""WhatsApp Cloud API adapter against a fake Graph API: signed events reach the agent and
are answered via /{phone_number_id}/messages; without a phone_number_id the adapter does
not start. The shared Meta webhook checks (verification handshake, forged signatures and
wrong verify tokens 401, allow-list, 429 retried, stop) run in
tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest
import requests

from channel_fixtures import audit, channel, configure, remove, wait_for
from channel_fixtures import channel_daemon  # noqa: F401
from fakes.whatsapp import event
import meta_webhook
from support import free_port

PLATFORM = meta_webhook.PLATFORMS["whatsapp"]
SECRET = PLATFORM.secret


@pytest.fixture
def whatsapp(channel_daemon):
    yield from meta_webhook.serve(channel_daemon, PLATFORM)


def post(url: str, body: bytes, sig: str | None = None) -> requests.Response:
    return meta_webhook.post(url, SECRET, body, sig)


def test_message_is_answered_through_the_send_api(channel_daemon, whatsapp):
    fake, url, _ = whatsapp
    response = post(url, event("hello page", "psid-1"))
    assert (response.status_code, response.json()) == (200, {"status": "EVENT_RECEIVED"})
    wait_for(lambda: fake.sent, what="reply")
    time.sleep(0.3)
    assert [(s["to"], s["text"]) for s in fake.sent] == [("psid-1", "echo: hello page")]
    assert audit(channel_daemon, "channel.outbound", "whatsapp")[0]["detail"]["message_id"] == fake.sent[0]["id"]


def test_without_phone_number_id_the_cloud_mode_does_not_start(channel_daemon):
    configure(channel_daemon, "whatsapp", webhook_port=free_port())
    time.sleep(0.5)
    assert channel(channel_daemon, "whatsapp")["active"] is False
    assert "phone_number_id" in audit(channel_daemon, "channel.start_failed", "whatsapp")[0]["detail"]["error"]
    remove(channel_daemon, "whatsapp")
