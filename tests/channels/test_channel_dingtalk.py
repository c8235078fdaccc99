"""DingTalk adapter against a fake robot API: signed outgoing-robot callbacks reach the
agent and are answered through the callback's sessionWebhook (group replies @ the
sender), an expired session falls back to the signed custom robot webhook, forged or
stale signatures are 401, allow-list, 429 retried after Retry-After, stop."""

from __future__ import annotations

import time

import pytest
import requests

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, remove, wait_active, wait_for  # noqa: F401
from channel_fixtures import channel_daemon, stop_closes_the_listener  # noqa: F401
from fakes.dingtalk import FakeDingTalk, sign
from support import free_port
from webhook_contract import threads_end

TOKEN, SECRET = CHANNEL_ENV["DINGTALK_ACCESS_TOKEN"], CHANNEL_ENV["DINGTALK_SECRET"]


@pytest.fixture
def dingtalk(channel_daemon):
    fake, port = FakeDingTalk(TOKEN, SECRET).start(), free_port()
    configure(channel_daemon, "dingtalk", webhook_port=port, api_url=fake.url, default_agent="helper")
    wait_active(channel_daemon, "dingtalk")
    yield fake, f"http://127.0.0.1:{port}/dingtalk", port
    remove(channel_daemon, "dingtalk")
    fake.stop()


def post(url: str, callback: tuple[bytes, dict[str, str]], **headers: str) -> requests.Response:
    body, signed = callback
    return requests.post(url, data=body, headers={**signed, **headers}, timeout=5)


def test_group_message_is_answered_through_the_session_webhook(channel_daemon, dingtalk):
    fake, url, _ = dingtalk
    assert channel(channel_daemon, "dingtalk")["active"] is True
    assert post(url, fake.callback("hello dingtalk", "staff01")).status_code == 200
    wait_for(lambda: fake.sent, what="reply")
    time.sleep(0.3)
    assert [(s["api"], s["content"], s["at_user_ids"]) for s in fake.sent] == \
        [("session", "echo: hello dingtalk", ["staff01"])]
    assert fake.sent[0]["session"] in fake.sessions


def test_direct_message_and_expired_session_use_the_signed_robot_webhook(channel_daemon, dingtalk):
    fake, url, _ = dingtalk
    assert post(url, fake.callback("private", "staff02", group=False)).status_code == 200
    wait_for(lambda: fake.sent, what="direct reply")
    assert (fake.sent[0]["api"], fake.sent[0]["content"], fake.sent[0]["at_user_ids"]) == \
        ("session", "echo: private", None)
    # A session about to expire, and one on a foreign host: both go to /robot/send (signed;
    # the fake checks access_token, timestamp and sign).
    assert post(url, fake.callback("late", "staff03", session_ttl=5)).status_code == 200
    assert post(url, fake.callback("elsewhere", "staff04", webhook_base="http://127.0.0.1:9")).status_code == 200
    wait_for(lambda: len(fake.sent) == 3, what="robot webhook replies")
    assert sorted((s["api"], s["content"]) for s in fake.sent[1:]) == \
        [("robot", "echo: elsewhere"), ("robot", "echo: late")]
    response = channel_daemon.post("/api/channels/dingtalk/test", json={"message": "hi team"})
    assert response.status_code == 200, response.text
    assert (fake.sent[-1]["api"], fake.sent[-1]["content"]) == ("robot", "hi team")


def test_forged_or_stale_signature_is_refused_before_the_agent(channel_daemon, dingtalk, fake_llm):
    fake, url, _ = dingtalk
    before = len(fake_llm.requests)
    now = str(int(time.time() * 1000))
    stale = str(int(time.time() * 1000) - 3601 * 1000)
    for headers in ({"sign": ""}, {"sign": sign("SECwrong", now), "timestamp": now},
                    {"timestamp": stale, "sign": sign(SECRET, stale)},
                    {"timestamp": "abc", "sign": sign(SECRET, "abc")}):
        response = post(url, fake.callback("forged", "mallory"), **headers)
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == []
    assert audit(channel_daemon, "channel.refused", "dingtalk")[0]["detail"]["reason"] == "bad signature"


def test_allow_list_and_429(channel_daemon, dingtalk):
    fake, url, port = dingtalk
    configure(channel_daemon, "dingtalk", webhook_port=port, api_url=fake.url, allowed_users=["vip01"])
    wait_active(channel_daemon, "dingtalk")
    fake.throttle = [1]
    asked = time.time()
    assert post(url, fake.callback("intruder", "bad01")).status_code == 200
    assert post(url, fake.callback("member", "vip01")).status_code == 200
    wait_for(lambda: fake.sent, what="reply after 429")
    time.sleep(0.3)
    assert [s["content"] for s in fake.sent] == ["echo: member"]
    assert fake.throttle == [] and fake.sent[0]["at"] - asked >= 1.0
    assert audit(channel_daemon, "channel.refused", "dingtalk")[0]["detail"]["sender"] == "bad01"


def test_stop_closes_the_listener(channel_daemon, dingtalk):
    fake, url, port = dingtalk
    stop_closes_the_listener(channel_daemon, "dingtalk", lambda: post(url, fake.callback("gone", "staff01")),
                             webhook_port=port, api_url=fake.url)


def test_stop_ends_every_thread_in_process():
    fake = FakeDingTalk(TOKEN, SECRET).start()
    try:
        threads_end("dingtalk", {"api_url": fake.url}, CHANNEL_ENV,
                    lambda url: post(url, fake.callback("in process", "staff01")), free_port())
    finally:
        fake.stop()
