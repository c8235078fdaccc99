"""Viber adapter against a fake REST Bot API: set_webhook on start (the fake calls the
listener back, signed), signed callbacks reach the agent and are answered via
send_message, forged signatures are 401, allow-list, 429 retried, stop."""

from __future__ import annotations

import time

import pytest
import requests

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, remove, wait_active, wait_for  # noqa: F401
from channel_fixtures import channel_daemon, stop_closes_the_listener  # noqa: F401
from fakes.viber import FakeViber, event, signature
from support import free_port

TOKEN = CHANNEL_ENV["VIBER_AUTH_TOKEN"]


def setup(daemon, fake, port, **extra):  # type: ignore[no-untyped-def]
    configure(daemon, "viber", webhook_port=port, api_url=fake.url, default_agent="helper",
              webhook_url=f"http://127.0.0.1:{port}/viber", **extra)
    wait_active(daemon, "viber")


@pytest.fixture
def viber(channel_daemon):
    fake, port = FakeViber(TOKEN).start(), free_port()
    setup(channel_daemon, fake, port)
    yield fake, f"http://127.0.0.1:{port}/viber", port
    remove(channel_daemon, "viber")
    fake.stop()


def post(url: str, body: bytes, sig: str | None = None) -> requests.Response:
    return requests.post(url, data=body, timeout=5,
                         headers={"X-Viber-Content-Signature": signature(TOKEN, body) if sig is None else sig})


def test_webhook_is_set_and_message_answered(channel_daemon, viber):
    fake, url, _ = viber
    assert fake.webhooks[-1]["url"] == url and "conversation_started" in fake.webhooks[-1]["event_types"]
    assert post(url, event("hello viber", "01234567890A=")).status_code == 200
    wait_for(lambda: fake.sent, what="reply")
    assert [(s["to"], s["text"], s["name"]) for s in fake.sent] == [("01234567890A=", "echo: hello viber", "helper")]
    # the outbound audit entry is written just after the send returns: wait for it
    outbound = wait_for(lambda: audit(channel_daemon, "channel.outbound", "viber"), what="outbound audit")
    assert outbound[0]["detail"]["message_id"] == str(fake.next_token)


def test_forged_signature_is_refused_before_the_agent(channel_daemon, viber, fake_llm):
    fake, url, _ = viber
    body = event("forged", "mallory")
    before = len(fake_llm.requests)
    for sig in ("", signature("wrong-token", body), "0" * 64):
        response = post(url, body, sig)
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == []


def test_allow_list_and_429(channel_daemon, viber):
    fake, url, port = viber
    setup(channel_daemon, fake, port, allowed_users=["vip"])
    fake.throttle = [1]
    asked = time.time()
    assert post(url, event("intruder", "bad")).status_code == 200
    assert post(url, event("member", "vip")).status_code == 200
    wait_for(lambda: fake.sent, what="reply after 429")
    time.sleep(0.3)
    assert [(s["to"], s["text"]) for s in fake.sent] == [("vip", "echo: member")]
    assert fake.throttle == [] and fake.sent[0]["at"] - asked >= 1.0
    assert audit(channel_daemon, "channel.refused", "viber")[0]["detail"]["sender"] == "bad"


def test_stop_closes_the_listener_and_bad_token_fails_start(channel_daemon, viber):
    fake, url, port = viber
    stop_closes_the_listener(channel_daemon, "viber", lambda: post(url, event("gone", "u")))
    fake.token = "another-token"  # set_webhook refused: the adapter does not pretend to run
    configure(channel_daemon, "viber", webhook_port=port, api_url=fake.url, webhook_url=url)
    wait_for(lambda: audit(channel_daemon, "channel.start_failed", "viber"), what="start failure")
    assert "invalidAuthToken" in audit(channel_daemon, "channel.start_failed", "viber")[0]["detail"]["error"]
    assert channel(channel_daemon, "viber")["active"] is False
    with pytest.raises(requests.ConnectionError):
        post(url, event("gone", "u"))


def test_set_webhook_calls_back_the_daemons_own_route(channel_daemon):
    """Viber checks the URL while set_webhook is still running: the daemon's
    /channels/viber/webhook must answer an adapter that is still starting."""
    fake = FakeViber(TOKEN).start()
    url = f"{channel_daemon.url}/channels/viber/webhook"
    try:
        configure(channel_daemon, "viber", api_url=fake.url, default_agent="helper", webhook_url=url)
        wait_active(channel_daemon, "viber")
        assert [w["url"] for w in fake.webhooks] == [url]
        assert post(url, event("via the daemon", "route-user")).status_code == 200
        wait_for(lambda: fake.sent, what="reply")
        assert [(s["to"], s["text"]) for s in fake.sent] == [("route-user", "echo: via the daemon")]
    finally:
        remove(channel_daemon, "viber")
        fake.stop()
