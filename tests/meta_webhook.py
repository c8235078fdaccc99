"""The Meta webhook checks that Messenger and WhatsApp Cloud share: both platforms verify a
subscription with a GET handshake (hub.mode / hub.verify_token / hub.challenge) and sign every
event body as X-Hub-Signature-256 (sha256=<hex HMAC-SHA256 of the raw body, app secret>).
Each test file keeps its own test functions and calls these with its fake and channel name."""

from __future__ import annotations

import time
from typing import Any, Callable

import requests

from channel_fixtures import audit, configure, stop_closes_the_listener, wait_active, wait_for
from fakes.messenger import signature


def post(url: str, secret: str, body: bytes, sig: str | None = None) -> requests.Response:
    """POST a webhook body, signed with `secret` unless `sig` gives the header verbatim."""
    return requests.post(url, data=body, timeout=5, headers={
        "Content-Type": "application/json", "X-Hub-Signature-256": signature(secret, body) if sig is None else sig})


def check_verification_handshake(url: str, verify_token: str) -> None:
    """The right verify token echoes the challenge; a wrong one is 401."""
    ok = requests.get(url, params={"hub.mode": "subscribe", "hub.verify_token": verify_token,
                                   "hub.challenge": "1158201444"}, timeout=5)
    assert (ok.status_code, ok.text) == (200, "1158201444")
    bad = requests.get(url, params={"hub.mode": "subscribe", "hub.verify_token": "guess",
                                    "hub.challenge": "1"}, timeout=5)
    assert bad.status_code == 401


def check_forged_signature_refused(url: str, secret: str, body: bytes, fake: Any, fake_llm: Any) -> None:
    """No, a foreign-secret or a sha1-labelled signature: 401 and nothing reaches the agent."""
    before = len(fake_llm.requests)
    for sig in ("", signature("other-secret", body), signature(secret, body).replace("sha256=", "sha1=")):
        response = post(url, secret, body, sig)
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == []


def check_allow_list_and_429(daemon: Any, name: str, fake: Any, url: str, secret: str,
                             event: Callable[[str, str], bytes], **keys: Any) -> None:
    """Only `psid-vip` is answered (the other sender is audited as refused), and the
    first send's 429 is retried after its Retry-After second."""
    configure(daemon, name, **keys, allowed_users=["psid-vip"])
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


def check_stop_closes_the_listener(daemon: Any, name: str, url: str, secret: str, body: bytes,
                                   **keys: Any) -> None:
    """Removing the channel closes its webhook port; configuring it again reopens it."""
    stop_closes_the_listener(daemon, name, lambda: post(url, secret, body), **keys)
