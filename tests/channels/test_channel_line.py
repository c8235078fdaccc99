"""LINE adapter against a fake Messaging API: signed webhook events reach the agent and
are answered through the reply API, forged signatures are 401, allow-list, 429, stop."""

from __future__ import annotations

import json
import time

import pytest
import requests

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, remove, wait_active, wait_for  # noqa: F401
from channel_fixtures import channel_daemon, stop_closes_the_listener  # noqa: F401
from fakes.line import FakeLine, event, signature
from support import free_port

SECRET, TOKEN = CHANNEL_ENV["LINE_CHANNEL_SECRET"], CHANNEL_ENV["LINE_CHANNEL_ACCESS_TOKEN"]


@pytest.fixture
def line(channel_daemon):
    fake, port = FakeLine(TOKEN).start(), free_port()
    configure(channel_daemon, "line", webhook_port=port, api_url=fake.url, default_agent="helper")
    wait_active(channel_daemon, "line")
    yield fake, f"http://127.0.0.1:{port}/callback"
    remove(channel_daemon, "line")
    fake.stop()


def post(url: str, body: bytes, sig: str | None = None) -> requests.Response:
    headers = {"Content-Type": "application/json", "X-Line-Signature": signature(SECRET, body) if sig is None else sig}
    return requests.post(url, data=body, headers=headers, timeout=5)


def test_message_is_answered_through_the_reply_api(channel_daemon, line):
    fake, url = line
    body = event("hello line", "Uann")
    assert post(url, body).status_code == 200
    wait_for(lambda: fake.sent, what="reply")
    sent = fake.sent[0]
    assert (sent["api"], sent["texts"]) == ("reply", ["echo: hello line"])
    assert sent["replyToken"] == json.loads(body)["events"][0]["replyToken"]
    assert channel(channel_daemon, "line")["active"] is True


def test_forged_signature_is_refused_before_the_agent(channel_daemon, line, fake_llm):
    fake, url = line
    body = event("forged", "Umallory")
    before = len(fake_llm.requests)
    for sig in ("", signature("wrong-secret", body), signature(SECRET, body + b" ")):
        response = post(url, body, sig)
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == []
    assert audit(channel_daemon, "channel.refused", "line")[0]["detail"]["reason"] == "bad signature"


def test_allow_list_and_group_push(channel_daemon, line):
    fake, url = line
    configure(channel_daemon, "line", webhook_port=int(url.split(":")[2].split("/")[0]), api_url=fake.url,
              allowed_users=["Uvip"])
    wait_active(channel_daemon, "line")
    assert post(url, event("intruder", "Ubad")).status_code == 200
    assert post(url, event("member", "Uvip", group="Cgroup1")).status_code == 200
    wait_for(lambda: fake.sent, what="reply to vip")
    time.sleep(0.3)
    assert [s["texts"] for s in fake.sent] == [["echo: member"]]
    refused = audit(channel_daemon, "channel.refused", "line")[0]["detail"]
    assert refused["sender"] == "Ubad"
    # The test call pushes to a group id (no reply token there).
    response = channel_daemon.post("/api/channels/line/test", json={"message": "hi group", "chat_id": "Cgroup1"})
    assert response.status_code == 200, response.text
    assert fake.sent[-1] == {**fake.sent[-1], "api": "push", "to": "Cgroup1", "texts": ["hi group"]}


def test_rate_limited_send_is_retried_after_retry_after(channel_daemon, line):
    fake, url = line
    fake.throttle = [1]
    asked = time.time()
    assert post(url, event("throttled", "Uann")).status_code == 200
    wait_for(lambda: fake.sent, what="reply after 429")
    assert fake.sent[0]["texts"] == ["echo: throttled"] and fake.throttle == []
    assert fake.sent[0]["at"] - asked >= 1.0


def test_stop_closes_the_listener(channel_daemon, line):
    fake, url = line
    stop_closes_the_listener(channel_daemon, "line", lambda: post(url, event("gone", "Uann")),
                             webhook_port=int(url.split(":")[2].split("/")[0]), api_url=fake.url)
