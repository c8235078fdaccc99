"""Google Chat adapter against a fake Chat API: MESSAGE events with a valid Chat JWT
reach the agent and are answered in their thread through spaces.messages.create with a
service-account token (JWT-bearer grant, cached); forged, foreign, expired or
wrong-audience tokens are 401 before the agent; space_ids and allow-list refusals; 429
retried after Retry-After; stop."""

from __future__ import annotations

import json
import time

import pytest
import requests

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, remove, start_channel_daemon  # noqa: F401
from channel_fixtures import stop_closes_the_listener, wait_active, wait_for
from fakes.google_chat import FakeGoogleChat, new_key, service_account
from support import free_port
from webhook_contract import threads_end

PROJECT = "123456789012"
ACCOUNT_KEY = new_key()
ACCOUNT = service_account(ACCOUNT_KEY)


@pytest.fixture(scope="module")
def gchat_daemon(tmp_path_factory, fake_llm):
    """A daemon whose GOOGLE_CHAT_SERVICE_ACCOUNT names a key file (the documented form)."""
    key_file = tmp_path_factory.mktemp("gcp") / "chat-key.json"
    key_file.write_text(json.dumps(ACCOUNT))
    daemon = start_channel_daemon(tmp_path_factory.mktemp("channels"), fake_llm,
                                  env={**CHANNEL_ENV, "GOOGLE_CHAT_SERVICE_ACCOUNT": str(key_file)})
    yield daemon
    daemon.stop()


def keys(fake, port, **extra):  # type: ignore[no-untyped-def]
    return {"project_number": PROJECT, "webhook_port": port, "certs_url": fake.certs_url,
            "token_url": f"{fake.url}/token", "api_url": fake.url, **extra}


@pytest.fixture
def gchat(gchat_daemon):
    fake, port = FakeGoogleChat(PROJECT, ACCOUNT, ACCOUNT_KEY).start(), free_port()
    configure(gchat_daemon, "google_chat", default_agent="helper", **keys(fake, port))
    wait_active(gchat_daemon, "google_chat")
    yield fake, f"http://127.0.0.1:{port}/chat-events", port
    remove(gchat_daemon, "google_chat")
    fake.stop()


def post(url: str, event: dict, token: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return requests.post(url, data=json.dumps(event), timeout=5,
                         headers={"Content-Type": "application/json; charset=UTF-8", **headers})


def test_message_is_answered_in_its_thread(gchat_daemon, gchat):
    fake, url, _ = gchat
    assert channel(gchat_daemon, "google_chat")["active"] is True
    dm = fake.event("hello chat", "111")
    response = post(url, dm, fake.token())
    assert (response.status_code, response.json()) == (200, {})
    wait_for(lambda: fake.sent, what="reply")
    room = fake.event("in the room", "222", space="spaces/AAAAroom", dm=False, mention=True)
    assert post(url, room, fake.token()).status_code == 200
    wait_for(lambda: len(fake.sent) == 2, what="room reply")
    time.sleep(0.3)
    assert [(s["space"], s["text"], s["thread"], s["reply_option"]) for s in fake.sent] == [
        ("spaces/AAAAdm", "echo: hello chat", dm["message"]["thread"]["name"], "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"),
        ("spaces/AAAAroom", "echo: in the room", room["message"]["thread"]["name"],
         "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD")]
    assert len(fake.issued) == 1  # the service-account token is cached
    assert audit(gchat_daemon, "channel.outbound", "google_chat")[0]["detail"]["message_id"] == fake.sent[1]["name"]
    response = gchat_daemon.post("/api/channels/google_chat/test", json={"message": "hi space",
                                                                         "chat_id": "spaces/AAAAroom"})
    assert response.status_code == 200, response.text
    assert (fake.sent[-1]["space"], fake.sent[-1]["text"], fake.sent[-1]["reply_option"]) == \
        ("spaces/AAAAroom", "hi space", None)


def test_bad_tokens_are_refused_before_the_agent(gchat_daemon, gchat, fake_llm):
    fake, url, _ = gchat
    before = len(fake_llm.requests)
    now = int(time.time())
    rogue = new_key()
    cases = {
        "no header": None,
        "garbage": "not-a-jwt",
        "foreign key, same kid": fake.token(key=rogue),
        "foreign key, unknown kid": fake.token(key=rogue, kid="unknown"),
        "wrong issuer": fake.token(iss="someone@example.iam.gserviceaccount.com"),
        "wrong audience (another project)": fake.token(aud="999999999999"),
        "expired": fake.token(iat=now - 7200, exp=now - 3600),
    }
    for what, token in cases.items():
        response = post(url, fake.event("forged", "666"), token)
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}, what
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == []
    assert audit(gchat_daemon, "channel.refused", "google_chat")[0]["detail"]["reason"] == "bad signature"


def test_spaces_allow_list_and_429(gchat_daemon, gchat):
    fake, url, port = gchat
    configure(gchat_daemon, "google_chat", **keys(fake, port, space_ids=["spaces/AAAAroom"],
                                                  allowed_users=["vip@example.com"]))
    wait_active(gchat_daemon, "google_chat")
    fake.throttle = [1]
    asked = time.time()
    assert post(url, fake.event("other space", "vip", space="spaces/BBBB", dm=False), fake.token()).status_code == 200
    assert post(url, fake.event("intruder", "bad", space="spaces/AAAAroom", dm=False), fake.token()).status_code == 200
    assert post(url, fake.event("member", "vip", space="spaces/AAAAroom", dm=False), fake.token()).status_code == 200
    wait_for(lambda: fake.sent, what="reply after 429")
    time.sleep(0.3)
    assert [s["text"] for s in fake.sent] == ["echo: member"]
    assert fake.throttle == [] and fake.sent[0]["at"] - asked >= 1.0
    refused = [e["detail"] for e in audit(gchat_daemon, "channel.refused", "google_chat")[:2]]
    assert sorted((r["sender"], r["reason"]) for r in refused) == [
        ("users/bad", "sender not in allowed_users"), ("users/vip", "chat not in allowed_channels")]


def test_missing_project_number_is_refused_with_a_reason(gchat_daemon):
    response = gchat_daemon.post("/api/channels/google_chat/configure", json={"webhook_port": free_port()})
    assert response.status_code == 200
    assert channel(gchat_daemon, "google_chat")["active"] is False
    assert "project_number" in json.dumps(audit(gchat_daemon, "channel.start_failed", "google_chat")[0]["detail"])
    remove(gchat_daemon, "google_chat")


def test_stop_closes_the_listener(gchat_daemon, gchat):
    fake, url, port = gchat
    stop_closes_the_listener(gchat_daemon, "google_chat", lambda: post(url, fake.event("gone", "111"), fake.token()),
                             **keys(fake, port))


def test_stop_ends_every_thread_in_process():
    fake = FakeGoogleChat(PROJECT, ACCOUNT, ACCOUNT_KEY).start()
    try:  # here the variable holds the key's JSON itself
        settings = keys(fake, 0)
        del settings["webhook_port"]
        threads_end("google_chat", settings, {"GOOGLE_CHAT_SERVICE_ACCOUNT": json.dumps(ACCOUNT)},
                    lambda url: post(url, fake.event("in process", "111"), fake.token()), free_port())
    finally:
        fake.stop()
