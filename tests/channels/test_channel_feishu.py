"""Feishu adapter against a fake Open Platform: the url_verification challenge (plain
and encrypted), encrypted + signed im.message.receive_v1 callbacks reach the agent and
are answered through /reply with a cached tenant token, groups answered only when the
bot is mentioned, redelivered events answered once, forged signatures / wrong tokens /
timestamps more than 5 minutes off / unencrypted bodies 401, allow-list, 429
(x-ogw-ratelimit-reset) retried, stop, lifecycle reactions in Feishu's own emoji types."""

from __future__ import annotations

import json
import time

import pytest
import requests

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, remove, wait_active, wait_for  # noqa: F401
from channel_fixtures import channel_daemon, stop_closes_the_listener  # noqa: F401
from fakes.feishu import FakeFeishu, callback, encrypt, message_event, sign
from support import free_port
from webhook_contract import threads_end

SECRET, KEY = CHANNEL_ENV["FEISHU_APP_SECRET"], CHANNEL_ENV["FEISHU_ENCRYPT_KEY"]
TOKEN = CHANNEL_ENV["FEISHU_VERIFICATION_TOKEN"]
PATH = "/feishu/webhook"
KEYS = {"app_id": "cli_test", "encrypt_key_env": "FEISHU_ENCRYPT_KEY",
        "verification_token_env": "FEISHU_VERIFICATION_TOKEN", "bot_names": ["HelperBot"]}


def setup(daemon, fake, port, **keys):  # type: ignore[no-untyped-def]
    configure(daemon, "feishu", webhook_port=port, api_url=fake.url, default_agent="helper", **{**KEYS, **keys})
    wait_active(daemon, "feishu")


@pytest.fixture
def feishu(channel_daemon):
    fake, port = FakeFeishu("cli_test", SECRET).start(), free_port()
    setup(channel_daemon, fake, port)
    yield fake, f"http://127.0.0.1:{port}{PATH}", port
    remove(channel_daemon, "feishu")
    fake.stop()


def post(url: str, signed: tuple[bytes, dict[str, str]], **headers: str) -> requests.Response:
    body, base = signed
    return requests.post(url, data=body, headers={**base, **headers}, timeout=5)


def stamped(body: bytes, headers: dict[str, str], timestamp: int) -> tuple[bytes, dict[str, str]]:
    """The callback re-signed with another timestamp: only the time is wrong."""
    nonce = headers["X-Lark-Request-Nonce"]
    return body, {**headers, "X-Lark-Request-Timestamp": str(timestamp),
                  "X-Lark-Signature": sign(KEY, str(timestamp), nonce, body)}


def test_url_verification_challenge(channel_daemon, feishu):
    fake, url, port = feishu
    challenge = {"challenge": "ajls384kdjx98XX", "token": TOKEN, "type": "url_verification"}
    # Encrypted, unsigned (the handshake carries no signature headers): the token vouches.
    response = post(url, callback(challenge, KEY, signed=False))
    assert (response.status_code, response.json()) == (200, {"challenge": "ajls384kdjx98XX"})
    assert post(url, callback({**challenge, "token": "guess"}, KEY, signed=False)).status_code == 401
    # Without an encrypt key the callback is plain JSON and the token is all there is.
    configure(channel_daemon, "feishu", webhook_port=port, api_url=fake.url, app_id="cli_test",
              verification_token_env="FEISHU_VERIFICATION_TOKEN")
    wait_active(channel_daemon, "feishu")
    response = post(url, callback(challenge))
    assert (response.status_code, response.json()) == (200, {"challenge": "ajls384kdjx98XX"})
    assert post(url, callback({**challenge, "token": "guess"})).status_code == 401
    # An encrypt key and no token: the unsigned handshake is answered, unsigned events are not.
    configure(channel_daemon, "feishu", webhook_port=port, api_url=fake.url, app_id="cli_test",
              encrypt_key_env="FEISHU_ENCRYPT_KEY")
    wait_active(channel_daemon, "feishu")
    response = post(url, callback(challenge, KEY, signed=False))
    assert (response.status_code, response.json()) == (200, {"challenge": "ajls384kdjx98XX"})
    assert post(url, callback(message_event("unsigned", "ou_x", TOKEN), KEY, signed=False)).status_code == 401
    assert post(url, callback(message_event("signed", "ou_ann", "any"), KEY)).status_code == 200
    wait_for(lambda: fake.sent, what="reply to the signed event")
    assert [s["text"] for s in fake.sent] == ["echo: signed"]


def test_direct_message_is_answered_through_the_reply_api(channel_daemon, feishu):
    fake, url, _ = feishu
    assert channel(channel_daemon, "feishu")["active"] is True
    first = message_event("hello feishu", "ou_ann", TOKEN)
    assert post(url, callback(first, KEY)).status_code == 200
    assert post(url, callback(first, KEY)).status_code == 200  # redelivered: answered once
    wait_for(lambda: fake.sent, what="reply")
    assert post(url, callback(message_event("again", "ou_ann", TOKEN), KEY)).status_code == 200
    wait_for(lambda: len(fake.sent) == 2, what="second reply")
    time.sleep(0.3)
    assert [(s["api"], s["to"], s["text"]) for s in fake.sent] == [
        ("reply", first["event"]["message"]["message_id"], "echo: hello feishu"),
        ("reply", fake.sent[1]["to"], "echo: again")]
    assert len(fake.tokens) == 1  # the tenant token is cached
    assert audit(channel_daemon, "channel.outbound", "feishu")[0]["detail"]["message_id"] == fake.sent[1]["message_id"]


def test_groups_answer_mentions_only_and_test_sends_to_a_chat(channel_daemon, feishu):
    fake, url, _ = feishu
    chat = "oc_group1"
    assert post(url, callback(message_event("not for you", "ou_ann", TOKEN, "group", chat), KEY)).status_code == 200
    assert post(url, callback(message_event("other bot", "ou_ann", TOKEN, "group", chat, mention="Other"),
                              KEY)).status_code == 200
    assert post(url, callback(message_event("for you", "ou_ann", TOKEN, "group", chat, mention="HelperBot"),
                              KEY)).status_code == 200
    wait_for(lambda: fake.sent, what="group reply")
    time.sleep(0.5)
    assert [s["text"] for s in fake.sent] == ["echo: for you"]
    response = channel_daemon.post("/api/channels/feishu/test", json={"message": "hi chat", "chat_id": chat})
    assert response.status_code == 200, response.text
    assert (fake.sent[-1]["api"], fake.sent[-1]["to"], fake.sent[-1]["text"]) == ("create", chat, "hi chat")


def test_forged_callbacks_are_refused_before_the_agent(channel_daemon, feishu, fake_llm):
    fake, url, _ = feishu
    before = len(fake_llm.requests)
    event = message_event("forged", "ou_mallory", TOKEN)
    body, headers = callback(event, KEY)
    forged = [
        (body, {**headers, "X-Lark-Signature": sign("wrong-key", headers["X-Lark-Request-Timestamp"],
                                                     headers["X-Lark-Request-Nonce"], body)}),
        (body, {**headers, "X-Lark-Request-Nonce": "other-nonce"}),  # signature no longer matches
        stamped(body, headers, int(time.time()) - 301),  # correctly signed, 5 minutes and 1 second old
        stamped(body, headers, int(time.time()) + 330),  # from the future, with room for a slow host
        (body, {k: v for k, v in headers.items() if k != "X-Lark-Request-Timestamp"}),  # no timestamp
        callback(message_event("forged", "ou_mallory", "wrong-token"), KEY),  # signed, wrong token
        callback(event),  # plain JSON although an encrypt key is set
        (json.dumps({"encrypt": encrypt("wrong-key", json.dumps(event).encode())}).encode(),
         {"Content-Type": "application/json"}),
    ]
    for forged_body, forged_headers in forged:
        response = requests.post(url, data=forged_body, headers=forged_headers, timeout=5)
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == []
    assert audit(channel_daemon, "channel.refused", "feishu")[0]["detail"]["reason"] == "bad signature"
    # Four minutes old is still inside the window.
    assert post(url, stamped(body, headers, int(time.time()) - 240)).status_code == 200
    wait_for(lambda: fake.sent, what="reply to the callback inside the window")


def test_allow_list_and_429(channel_daemon, feishu):
    fake, url, port = feishu
    setup(channel_daemon, fake, port, allowed_users=["ou_vip"])
    fake.throttle = [1]
    asked = time.time()
    assert post(url, callback(message_event("intruder", "ou_bad", TOKEN), KEY)).status_code == 200
    assert post(url, callback(message_event("member", "ou_vip", TOKEN), KEY)).status_code == 200
    wait_for(lambda: fake.sent, what="reply after 429")
    time.sleep(0.3)
    assert [s["text"] for s in fake.sent] == ["echo: member"]
    assert fake.throttle == [] and fake.sent[0]["at"] - asked >= 1.0
    assert audit(channel_daemon, "channel.refused", "feishu")[0]["detail"]["sender"] == "ou_bad"


def test_stop_closes_the_listener(channel_daemon, feishu):
    fake, url, port = feishu
    stop_closes_the_listener(channel_daemon, "feishu",
                             lambda: post(url, callback(message_event("gone", "ou_ann", TOKEN), KEY)))
    setup(channel_daemon, fake, port)


def test_websocket_mode_is_refused_with_a_reason(channel_daemon):
    response = channel_daemon.post("/api/channels/feishu/configure", json={**KEYS, "mode": "websocket",
                                                                         "webhook_port": free_port()})
    assert response.status_code == 200
    assert channel(channel_daemon, "feishu")["active"] is False
    starts = audit(channel_daemon, "channel.start_failed", "feishu")
    assert "not implemented" in json.dumps(starts[0]["detail"])
    remove(channel_daemon, "feishu")


def test_region_picks_the_api_host_and_stop_ends_every_thread():
    from agentd.channels.adapters.feishu import FeishuAdapter
    from agentd.channels.adapter import ChannelContext

    ctx = ChannelContext("feishu", "127.0.0.1", deliver=print, audit=print, load_state=dict, save_state=print)
    assert FeishuAdapter(ctx, {"region": "intl"}).base() == "https://open.larksuite.com"
    assert FeishuAdapter(ctx, {"region": "cn"}).base() == "https://open.feishu.cn"
    fake = FakeFeishu("cli_test", SECRET).start()
    try:
        threads_end("feishu", {**KEYS, "api_url": fake.url, "webhook_path": "/hook"}, CHANNEL_ENV,
                    lambda url: post(url, callback(message_event("in process", "ou_ann", TOKEN), KEY)), free_port())
    finally:
        fake.stop()


def test_group_policy_ignore_leaves_groups_unanswered(channel_daemon, feishu, fake_llm):
    fake, url, port = feishu
    setup(channel_daemon, fake, port, overrides={"group_policy": "ignore"})
    group = message_event("group question", "ou_ann", TOKEN, "group", "oc_group2", mention="HelperBot")
    assert post(url, callback(group, KEY)).status_code == 200
    wait_for(lambda: any(r["detail"]["reason"] == "group_policy is ignore"
                         for r in audit(channel_daemon, "channel.refused", "feishu")), what="refusal")
    assert post(url, callback(message_event("direct question", "ou_ann", TOKEN), KEY)).status_code == 200
    wait_for(lambda: fake.sent, what="reply to the direct message")
    time.sleep(0.3)
    assert [s["text"] for s in fake.sent] == ["echo: direct question"]


def test_lifecycle_reactions_use_feishus_emoji_types(channel_daemon, feishu):
    fake, url, port = feishu
    setup(channel_daemon, fake, port, overrides={"lifecycle_reactions": True})
    asked = message_event("react please", "ou_ann", TOKEN)
    assert post(url, callback(asked, KEY)).status_code == 200
    first = asked["event"]["message"]["message_id"]
    wait_for(lambda: [r["emoji_type"] for r in fake.reactions if r["message_id"] == first] == ["DONE"],
             what="👀 replaced by ✅")
    assert [r["emoji_type"] for r in fake.unreacted if r["message_id"] == first] == ["GLANCE"]
    failing = message_event("[[fail:500]] feishu boom", "ou_ann", TOKEN)
    assert post(url, callback(failing, KEY)).status_code == 200
    second = failing["event"]["message"]["message_id"]
    wait_for(lambda: [r["emoji_type"] for r in fake.reactions if r["message_id"] == second] == ["CRY"],
             what="👀 replaced by ⚠️")
    # A type name of Feishu's own passes through as it is.
    setup(channel_daemon, fake, port, overrides={"lifecycle_reactions": {"received": "", "answered": "THUMBSUP"}})
    liked = message_event("like it", "ou_ann", TOKEN)
    assert post(url, callback(liked, KEY)).status_code == 200
    third = liked["event"]["message"]["message_id"]
    wait_for(lambda: [r["emoji_type"] for r in fake.reactions if r["message_id"] == third] == ["THUMBSUP"],
             what="the configured reaction")
