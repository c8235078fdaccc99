"""Messenger adapter against a fake Send API: signed page events reach the agent and are
answered via /me/messages, the page's own echoes ignored. The shared Meta webhook checks
(verification handshake, forged signatures and wrong verify tokens 401, allow-list, 429
retried, stop) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest
import requests

from channel_fixtures import audit, wait_for
from channel_fixtures import channel_daemon  # noqa: F401
from fakes.messenger import event
import meta_webhook

PLATFORM = meta_webhook.PLATFORMS["messenger"]
SECRET = PLATFORM.secret


@pytest.fixture
def messenger(channel_daemon):
    yield from meta_webhook.serve(channel_daemon, PLATFORM)


def post(url: str, body: bytes, sig: str | None = None) -> requests.Response:
    return meta_webhook.post(url, SECRET, body, sig)


def test_message_is_answered_through_the_send_api(channel_daemon, messenger):
    fake, url, _ = messenger
    assert post(url, event("our own echo", "PAGE", echo=True)).status_code == 200
    response = post(url, event("hello page", "psid-1"))
    assert (response.status_code, response.json()) == (200, {"status": "EVENT_RECEIVED"})
    wait_for(lambda: fake.sent, what="reply")
    time.sleep(0.3)
    assert [(s["to"], s["text"], s["type"]) for s in fake.sent] == [("psid-1", "echo: hello page", "RESPONSE")]
    assert audit(channel_daemon, "channel.outbound", "messenger")[0]["detail"]["message_id"] == fake.sent[0]["mid"]
