"""The Meta webhook checks that Messenger and WhatsApp Cloud share: both platforms verify a
subscription with a GET handshake (hub.mode / hub.verify_token / hub.challenge) and sign every
event body as X-Hub-Signature-256 (sha256=<hex HMAC-SHA256 of the raw body, app secret>).
`PLATFORMS` is the table of those adapters; tests/channels/test_channel_contract.py runs every check
below for each, and tests/test_channel_{messenger,whatsapp}.py hold what is particular to one."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import requests

from channel_fixtures import (CHANNEL_ENV, audit, configure, remove, stop_closes_the_listener, wait_active,
                              wait_for)
from fakes import messenger, whatsapp
from fakes.messenger import signature
from support import free_port


@dataclass(frozen=True)
class Platform:
    """One Meta webhook adapter: its fake Graph API, secrets and event bodies."""

    name: str
    fake: Callable[[], Any]                  # -> the platform's fake API, started
    secret: str                              # the app secret that signs webhook bodies
    verify_token: str
    event: Callable[[str, str], bytes]       # (text, sender id) -> a webhook body
    keys: dict[str, Any] = field(default_factory=dict)  # configure keys besides the port and API URL


PLATFORMS = {p.name: p for p in (
    Platform("messenger", lambda: messenger.FakeMessenger(CHANNEL_ENV["MESSENGER_PAGE_TOKEN"]).start(),
             CHANNEL_ENV["MESSENGER_APP_SECRET"], CHANNEL_ENV["MESSENGER_VERIFY_TOKEN"], messenger.event),
    Platform("whatsapp", lambda: whatsapp.FakeWhatsApp(CHANNEL_ENV["WHATSAPP_ACCESS_TOKEN"]).start(),
             CHANNEL_ENV["WHATSAPP_APP_SECRET"], CHANNEL_ENV["WHATSAPP_VERIFY_TOKEN"], whatsapp.event,
             {"phone_number_id": whatsapp.PHONE_ID}),
)}


def serve(daemon: Any, platform: Platform) -> Iterator[tuple[Any, str, int]]:
    """Fixture body: the channel configured against the platform's fake and active, as
    (fake, webhook URL, webhook port); then removed and the fake stopped."""
    fake, port = platform.fake(), free_port()
    configure(daemon, platform.name, webhook_port=port, api_url=fake.url, default_agent="helper", **platform.keys)
    wait_active(daemon, platform.name)
    yield fake, f"http://127.0.0.1:{port}/webhook", port
    remove(daemon, platform.name)
    fake.stop()


def post(url: str, secret: str, body: bytes, sig: str | None = None) -> requests.Response:
    """POST a webhook body, signed with `secret` unless `sig` gives the header verbatim."""
    return requests.post(url, data=body, timeout=5, headers={
        "Content-Type": "application/json", "X-Hub-Signature-256": signature(secret, body) if sig is None else sig})


def check_verification_handshake(platform: Platform, hook: tuple[Any, str, int]) -> None:
    """The right verify token echoes the challenge; a wrong one is 401."""
    _, url, _ = hook
    ok = requests.get(url, params={"hub.mode": "subscribe", "hub.verify_token": platform.verify_token,
                                   "hub.challenge": "1158201444"}, timeout=5)
    assert (ok.status_code, ok.text) == (200, "1158201444")
    bad = requests.get(url, params={"hub.mode": "subscribe", "hub.verify_token": "guess",
                                    "hub.challenge": "1"}, timeout=5)
    assert bad.status_code == 401


def check_forged_signature_refused(platform: Platform, hook: tuple[Any, str, int], fake_llm: Any) -> None:
    """No, a foreign-secret or a sha1-labelled signature: 401 and nothing reaches the agent."""
    fake, url, _ = hook
    body, secret = platform.event("forged", "psid-x"), platform.secret
    before = len(fake_llm.requests)
    for sig in ("", signature("other-secret", body), signature(secret, body).replace("sha256=", "sha1=")):
        response = post(url, secret, body, sig)
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == []


def check_allow_list_and_429(daemon: Any, platform: Platform, hook: tuple[Any, str, int]) -> None:
    """Only `psid-vip` is answered (the other sender is audited as refused), and the
    first send's 429 is retried after its Retry-After second."""
    fake, url, port = hook
    name, secret, event = platform.name, platform.secret, platform.event
    configure(daemon, name, webhook_port=port, api_url=fake.url, **platform.keys, allowed_users=["psid-vip"])
    wait_active(daemon, name)
    fake.throttle = [1]
    asked = time.time()
    assert post(url, secret, event("intruder", "psid-bad")).status_code == 200
    assert post(url, secret, event("member", "psid-vip")).status_code == 200
    wait_for(lambda: fake.sent, what="reply after 429")
    time.sleep(0.3)
    assert [(s["to"], s["text"]) for s in fake.sent] == [("psid-vip", "echo: member")]
    assert fake.throttle == [] and fake.sent[0]["at"] - asked >= 1.0
    assert audit(daemon, "channel.refused", name)[0]["detail"]["sender"] == "psid-bad"


def check_stop_closes_the_listener(daemon: Any, platform: Platform, hook: tuple[Any, str, int]) -> None:
    """Removing the channel closes its webhook port; configuring it again reopens it."""
    fake, url, port = hook
    body = platform.event("gone", "psid-1")
    stop_closes_the_listener(daemon, platform.name, lambda: post(url, platform.secret, body),
                             webhook_port=port, api_url=fake.url, **platform.keys)
