"""Pumble adapter against a fake Pumble API: signed NEW_MESSAGE events reach the agent
(direct channels always, other channels when the bot is mentioned, answered in the
thread); the bot's own posts coming back as events are ignored; forged, missing or stale
signatures are 401; allow-list; 429 retried after Retry-After; stop() ends every thread."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, remove, wait_active, wait_for  # noqa: F401
from channel_fixtures import channel_daemon  # noqa: F401
from fakes.pumble import BOT, FakePumble, event, headers
from support import free_port

TOKEN, APP_KEY = CHANNEL_ENV["PUMBLE_BOT_TOKEN"], CHANNEL_ENV["PUMBLE_APP_KEY"]
SECRET = CHANNEL_ENV["PUMBLE_SIGNING_SECRET"]


def setup(daemon, fake, port, **extra):  # type: ignore[no-untyped-def]
    configure(daemon, "pumble", webhook_port=port, api_url=fake.url, default_agent="helper", **extra)
    wait_active(daemon, "pumble")


@pytest.fixture
def pumble(channel_daemon):
    fake, port = FakePumble(TOKEN, APP_KEY, SECRET).start(), free_port()
    fake.channels.update({"dm-ann": "DIRECT", "dm-vip": "DIRECT", "dm-bad": "DIRECT", "general": "PUBLIC"})
    fake.listener = f"http://127.0.0.1:{port}/pumble/events"
    setup(channel_daemon, fake, port)
    yield fake, fake.listener, port
    remove(channel_daemon, "pumble")
    fake.stop()


def post(url: str, body: bytes, **override: str) -> requests.Response:
    return requests.post(url, data=body, timeout=5, headers={**headers(SECRET, body), **override})


def test_direct_message_is_answered_and_own_echo_ignored(channel_daemon, pumble):
    fake, url, _ = pumble
    response = post(url, event("dm-ann", "user-ann", "hello pumble"))
    assert (response.status_code, response.text) == (200, "ok")
    wait_for(lambda: fake.echoes, what="reply (and its echo event)")
    time.sleep(0.5)  # the echoed event of our own reply must not be answered
    assert [(s["channel"], s["thread"], s["text"]) for s in fake.sent] == [("dm-ann", "", "echo: hello pumble")]
    assert fake.echoes == [200]
    outbound = wait_for(lambda: audit(channel_daemon, "channel.outbound", "pumble"), what="outbound audit")
    assert outbound[0]["detail"]["message_id"] == fake.sent[0]["id"]
    assert channel(channel_daemon, "pumble")["active"] is True


def test_channel_messages_need_a_mention_and_are_answered_in_thread(channel_daemon, pumble):
    fake, url, _ = pumble
    fake.listener = ""
    assert post(url, event("general", "user-ann", "just chatting")).status_code == 200
    body = event("general", "user-ann", f"<<@{BOT}>> what time is it", mentions=(BOT,), message_id="root-1")
    assert post(url, body).status_code == 200
    wait_for(lambda: fake.sent, what="threaded reply")
    time.sleep(0.3)
    assert [(s["channel"], s["thread"], s["text"]) for s in fake.sent] == [("general", "root-1", "echo: what time is it")]


def test_forged_or_stale_signature_is_refused_before_parsing(channel_daemon, pumble, fake_llm):
    fake, url, _ = pumble
    body = event("dm-ann", "user-mallory", "forged")
    before = len(fake_llm.requests)
    stale = str(int((time.time() - 3600) * 1000))
    bad = [{"x-pumble-request-signature": ""},
           {"x-pumble-request-signature": headers("wrong-secret", body)["x-pumble-request-signature"]},
           headers(SECRET, body, stamp=stale),                           # a replayed old request
           {"x-pumble-request-timestamp": str(int(time.time() * 1000) + 1)}]  # signature of another stamp
    for override in bad:
        response = post(url, body, **override)
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}
    assert post(url, b"{not json", **{"x-pumble-request-signature": "00"}).status_code == 401
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == []
    assert audit(channel_daemon, "channel.refused", "pumble")[0]["detail"]["reason"] == "bad signature"


def test_allow_list_and_429(channel_daemon, pumble):
    fake, url, port = pumble
    fake.listener = ""
    setup(channel_daemon, fake, port, allowed_users=["user-vip"])
    fake.throttle = [1]
    asked = time.time()
    assert post(url, event("dm-bad", "user-bad", "intruder")).status_code == 200
    assert post(url, event("dm-vip", "user-vip", "member")).status_code == 200
    wait_for(lambda: fake.sent, what="reply after 429")
    time.sleep(0.3)
    assert [(s["channel"], s["text"]) for s in fake.sent] == [("dm-vip", "echo: member")]
    assert fake.throttle == [] and fake.sent[0]["at"] - asked >= 1.0
    assert audit(channel_daemon, "channel.refused", "pumble")[0]["detail"]["sender"] == "user-bad"


def test_bad_token_fails_start_and_stop_closes_listener(channel_daemon, pumble):
    fake, url, port = pumble
    remove(channel_daemon, "pumble")
    assert channel(channel_daemon, "pumble")["active"] is False
    with pytest.raises(requests.ConnectionError):
        post(url, event("dm-ann", "user-ann", "gone"))
    fake.token = "revoked"  # /oauth2/me refuses the token: the adapter does not pretend to run
    configure(channel_daemon, "pumble", webhook_port=port, api_url=fake.url)
    wait_for(lambda: audit(channel_daemon, "channel.start_failed", "pumble"), what="start failure")
    assert "401" in audit(channel_daemon, "channel.start_failed", "pumble")[0]["detail"]["error"]
    assert channel(channel_daemon, "pumble")["active"] is False
    fake.token = TOKEN
    setup(channel_daemon, fake, port)  # the fixture removes it again


def test_stop_ends_every_thread(monkeypatch):
    from agentd.channels.adapter import ChannelContext
    from agentd.channels.adapters.pumble import ADAPTER
    from agentd.channels.catalog import ChannelCatalog, settings_for

    for key in ("PUMBLE_BOT_TOKEN", "PUMBLE_APP_KEY", "PUMBLE_SIGNING_SECRET"):
        monkeypatch.setenv(key, CHANNEL_ENV[key])
    fake, port = FakePumble(TOKEN, APP_KEY, SECRET).start(), free_port()
    fake.channels["dm-ann"] = "DIRECT"
    got: list = []
    ctx = ChannelContext("pumble", "127.0.0.1", deliver=got.append, audit=lambda *a: None,
                         load_state=dict, save_state=lambda s: None)
    adapter = ADAPTER(ctx, settings_for(ChannelCatalog.load().get("pumble"), {"webhook_port": port, "api_url": fake.url}))
    adapter.start()
    try:
        assert post(f"http://127.0.0.1:{port}/", event("dm-ann", "user-ann", "in process")).status_code == 200
        assert [(m.sender_id, m.text, m.conversation.direct) for m in got] == [("user-ann", "in process", True)]
    finally:
        adapter.stop()
        fake.stop()
    assert adapter.threads_alive() == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("channel-pumble-") and t.is_alive()]
