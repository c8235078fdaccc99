"""Flock adapter against a fake Flock API: chat.receiveMessage events with a valid
X-Flock-Event-Token reach the agent and are answered via chat.sendMessage; a forged,
expired, other-app, `alg: none` or other-user token is 401 before the agent; app.install
is acknowledged and recorded; allow-list; 429 retried after Retry-After; stop()."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, remove, wait_active, wait_for  # noqa: F401
from channel_fixtures import channel_daemon  # noqa: F401
from fakes.flock import APP_ID, FakeFlock, event_token, install, receive_message
from support import free_port

TOKEN, SECRET = CHANNEL_ENV["FLOCK_BOT_TOKEN"], CHANNEL_ENV["FLOCK_APP_SECRET"]


def setup(daemon, fake, port, **extra):  # type: ignore[no-untyped-def]
    configure(daemon, "flock", webhook_port=port, api_url=fake.url + "/v1", app_id=APP_ID,
              default_agent="helper", **extra)
    wait_active(daemon, "flock")


@pytest.fixture
def flock(channel_daemon):
    fake, port = FakeFlock(TOKEN).start(), free_port()
    setup(channel_daemon, fake, port)
    yield fake, f"http://127.0.0.1:{port}/flock/events", port
    remove(channel_daemon, "flock")
    fake.stop()


def post(url: str, body: bytes, token: str | None = None, user: str = "") -> requests.Response:
    token = event_token(SECRET, user or json.loads(body)["userId"]) if token is None else token
    return requests.post(url, data=body, timeout=5,
                         headers={"Content-Type": "application/json", "X-Flock-Event-Token": token})


def test_message_is_answered_via_send_message(channel_daemon, flock):
    fake, url, _ = flock
    response = post(url, receive_message("u:ann", "hello flock"))
    assert (response.status_code, response.json()) == (200, {})
    wait_for(lambda: fake.sent, what="reply")
    time.sleep(0.3)
    assert [(s["to"], s["text"]) for s in fake.sent] == [("u:ann", "echo: hello flock")]
    outbound = wait_for(lambda: audit(channel_daemon, "channel.outbound", "flock"), what="outbound audit")
    assert outbound[0]["detail"]["message_id"] == fake.sent[0]["uid"]
    assert channel(channel_daemon, "flock")["active"] is True
    # A group message is answered in the group.
    assert post(url, receive_message("u:ann", "in the group", to="g:team")).status_code == 200
    wait_for(lambda: fake.replies("g:team"), what="group reply")
    assert fake.replies("g:team") == ["echo: in the group"]


def test_install_events_are_acknowledged(channel_daemon, flock):
    fake, url, _ = flock
    assert (post(url, install("u:admin")).status_code, fake.sent) == (200, [])
    entry = audit(channel_daemon, "channel.app_install", "flock")[0]
    assert entry["detail"] == {"user": "u:admin"}
    assert post(url, install("u:admin", "app.uninstall")).status_code == 200
    assert audit(channel_daemon, "channel.app_uninstall", "flock")[0]["detail"] == {"user": "u:admin"}


def test_bad_event_tokens_are_refused_before_the_agent(channel_daemon, flock, fake_llm):
    fake, url, _ = flock
    body = receive_message("u:mallory", "forged")
    before = len(fake_llm.requests)
    good = event_token(SECRET, "u:mallory")
    for token in ("", "not.a.jwt", event_token("wrong-secret", "u:mallory"),
                  event_token(SECRET, "u:mallory", ttl=-120),          # expired
                  event_token(SECRET, "u:mallory", app_id="other-app"),  # another app's token
                  event_token(SECRET, "u:mallory", alg="none"),          # unsigned
                  good[:-2] + ("AA" if not good.endswith("AA") else "BB")):
        response = post(url, body, token=token)
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}, token
    # A valid token issued for another user does not authenticate this user's event.
    response = post(url, body, token=event_token(SECRET, "u:ann"))
    assert response.status_code == 401
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == []
    assert audit(channel_daemon, "channel.refused", "flock")[0]["detail"]["reason"] == "bad signature"


def test_allow_list_and_429(channel_daemon, flock):
    fake, url, port = flock
    setup(channel_daemon, fake, port, allowed_users=["u:vip"])
    fake.throttle = [1]
    asked = time.time()
    assert post(url, receive_message("u:bad", "intruder")).status_code == 200
    assert post(url, receive_message("u:vip", "member")).status_code == 200
    wait_for(lambda: fake.sent, what="reply after 429")
    time.sleep(0.3)
    assert [(s["to"], s["text"]) for s in fake.sent] == [("u:vip", "echo: member")]
    assert fake.throttle == [] and fake.sent[0]["at"] - asked >= 1.0
    assert audit(channel_daemon, "channel.refused", "flock")[0]["detail"]["sender"] == "u:bad"


def test_stop_closes_listener_and_missing_app_id_fails_start(channel_daemon, flock):
    fake, url, port = flock
    fake.token = "revoked"
    response = channel_daemon.post("/api/channels/flock/test", json={"message": "x", "chat_id": "u:ann"})
    assert response.status_code == 502 and "InvalidToken" in response.json()["error"]
    remove(channel_daemon, "flock")
    assert channel(channel_daemon, "flock")["active"] is False
    with pytest.raises(requests.ConnectionError):
        post(url, receive_message("u:ann", "gone"))
    configure(channel_daemon, "flock", webhook_port=port, api_url=fake.url + "/v1")
    wait_for(lambda: audit(channel_daemon, "channel.start_failed", "flock"), what="start failure")
    assert "app_id" in audit(channel_daemon, "channel.start_failed", "flock")[0]["detail"]["error"]
    fake.token = TOKEN
    setup(channel_daemon, fake, port)  # the fixture removes it again


def test_stop_ends_every_thread(monkeypatch):
    from agentd.channels.adapter import ChannelContext
    from agentd.channels.adapters.flock import ADAPTER
    from agentd.channels.catalog import ChannelCatalog, settings_for

    for key in ("FLOCK_BOT_TOKEN", "FLOCK_APP_SECRET"):
        monkeypatch.setenv(key, CHANNEL_ENV[key])
    port, got = free_port(), []
    ctx = ChannelContext("flock", "127.0.0.1", deliver=got.append, audit=lambda *a: None,
                         load_state=dict, save_state=lambda s: None)
    adapter = ADAPTER(ctx, settings_for(ChannelCatalog.load().get("flock"), {"webhook_port": port, "app_id": APP_ID}))
    adapter.start()
    try:
        assert post(f"http://127.0.0.1:{port}/", receive_message("u:ann", "in process")).status_code == 200
        assert [(m.sender_id, m.conversation.chat_id, m.text) for m in got] == [("u:ann", "u:ann", "in process")]
    finally:
        adapter.stop()
    assert adapter.threads_alive() == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("channel-flock-") and t.is_alive()]
