"""Messenger adapter against a fake Send API: the GET verification handshake, signed
page events reach the agent and are answered via /me/messages, forged signatures and
wrong verify tokens are 401, echoes ignored, allow-list, 429 retried, stop."""

from __future__ import annotations

import time

import pytest
import requests

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, remove, wait_active, wait_for  # noqa: F401
from channel_fixtures import channel_daemon  # noqa: F401
from fakes.messenger import FakeMessenger, event, signature
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
    return requests.post(url, data=body, timeout=5, headers={
        "Content-Type": "application/json", "X-Hub-Signature-256": signature(SECRET, body) if sig is None else sig})


def test_verification_handshake(messenger):
    _, url, _ = messenger
    ok = requests.get(url, params={"hub.mode": "subscribe", "hub.verify_token": VERIFY,
                                   "hub.challenge": "1158201444"}, timeout=5)
    assert (ok.status_code, ok.text) == (200, "1158201444")
    bad = requests.get(url, params={"hub.mode": "subscribe", "hub.verify_token": "guess",
                                    "hub.challenge": "1"}, timeout=5)
    assert bad.status_code == 401


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
    body = event("forged", "psid-x")
    before = len(fake_llm.requests)
    for sig in ("", signature("other-secret", body), signature(SECRET, body).replace("sha256=", "sha1=")):
        response = post(url, body, sig)
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == []


def test_allow_list_and_429(channel_daemon, messenger):
    fake, url, port = messenger
    configure(channel_daemon, "messenger", webhook_port=port, api_url=fake.url, allowed_users=["psid-vip"])
    wait_active(channel_daemon, "messenger")
    fake.throttle = [1]
    asked = time.time()
    assert post(url, event("intruder", "psid-bad")).status_code == 200
    assert post(url, event("member", "psid-vip")).status_code == 200
    wait_for(lambda: fake.sent, what="reply after 429")
    time.sleep(0.3)
    assert [(s["to"], s["text"]) for s in fake.sent] == [("psid-vip", "echo: member")]
    assert fake.throttle == [] and fake.sent[0]["at"] - asked >= 1.0
    assert audit(channel_daemon, "channel.refused", "messenger")[0]["detail"]["sender"] == "psid-bad"


def test_stop_closes_the_listener(channel_daemon, messenger):
    fake, url, port = messenger
    remove(channel_daemon, "messenger")
    assert channel(channel_daemon, "messenger")["active"] is False
    with pytest.raises(requests.ConnectionError):
        post(url, event("gone", "psid-1"))
    configure(channel_daemon, "messenger", webhook_port=port, api_url=fake.url)
    wait_active(channel_daemon, "messenger")
