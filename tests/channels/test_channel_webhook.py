"""Webhook adapter: its own listener, HMAC-SHA256 signatures checked inbound (before
parsing) and sent outbound, 202 at once, reply POSTed to callback_url."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
import requests

from channel_fixtures import audit, channel, channel_daemon, configure, remove, wait_active, wait_for  # noqa: F401
from fakes.recorder import Recorder
from support import free_port

SECRET = "s3cret-hmac"  # the value of WEBHOOK_TEST_SECRET in the daemon's environment


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@pytest.fixture
def hook(channel_daemon):
    callback = Recorder()
    port = free_port()
    configure(channel_daemon, "webhook", listen_port=port, callback_url=callback.url + "/cb",
              secret_env="WEBHOOK_TEST_SECRET", default_agent="helper")
    wait_active(channel_daemon, "webhook")
    yield f"http://127.0.0.1:{port}/", callback
    remove(channel_daemon, "webhook")
    callback.close()


def test_signed_message_is_answered_with_signed_callback(channel_daemon, hook):
    url, callback = hook
    body = json.dumps({"sender_id": "u-42", "sender_name": "Ann", "message": "ping via hook"}).encode()
    response = requests.post(url + "webhook", data=body, headers={"X-Webhook-Signature": sign(body),
                                                                  "Content-Type": "application/json"}, timeout=5)
    assert response.status_code == 202
    assert response.json()["status"] == "accepted"
    wait_for(lambda: callback.requests, what="callback")
    sent = callback.requests[0]
    assert sent["path"] == "/cb"
    assert json.loads(sent["body"]) == {"sender_id": "u-42", "message": "echo: ping via hook", "agent": "helper"}
    assert sent["headers"]["X-Webhook-Signature"] == sign(sent["body"])
    assert audit(channel_daemon, "channel.inbound", "webhook")[0]["detail"]["message_id"] == \
        response.json()["message_id"]


@pytest.mark.parametrize("signature", [None, "sha256=" + "0" * 64, "md5=abc"])
def test_missing_or_bad_signature_is_refused_before_the_agent(channel_daemon, hook, fake_llm, signature):
    url, callback = hook
    body = json.dumps({"sender_id": "u-1", "message": "forged"}).encode()
    headers = {"Content-Type": "application/json"}
    if signature:
        headers["X-Webhook-Signature"] = signature
    before = len(fake_llm.requests)
    response = requests.post(url, data=body, headers=headers, timeout=5)
    assert response.status_code == 401
    assert response.json() == {"error": "invalid signature"}
    # A body signed with another secret is refused too.
    response = requests.post(url, data=body, headers={"X-Webhook-Signature": sign(body, "other")}, timeout=5)
    assert response.status_code == 401
    assert audit(channel_daemon, "channel.refused", "webhook")[0]["detail"]["reason"] == "bad signature"
    assert len(fake_llm.requests) == before and callback.requests == []


def test_bad_body_is_400_and_allow_list_refuses(channel_daemon, hook):
    url, callback = hook
    body = b'{"sender_id": 5}'
    assert requests.post(url, data=body, headers={"X-Webhook-Signature": sign(body)}, timeout=5).status_code == 400
    configure(channel_daemon, "webhook", listen_port=int(url.rsplit(":", 1)[1].strip("/")),
              callback_url=callback.url + "/cb", secret_env="WEBHOOK_TEST_SECRET", allowed_users=["vip"])
    wait_active(channel_daemon, "webhook")
    for sender in ("intruder", "vip"):
        body = json.dumps({"sender_id": sender, "message": f"from {sender}"}).encode()
        assert requests.post(url, data=body, headers={"X-Webhook-Signature": sign(body)},
                             timeout=5).status_code == 202
    wait_for(lambda: callback.requests, what="reply to vip")
    assert [json.loads(r["body"])["sender_id"] for r in callback.requests] == ["vip"]
    refused = audit(channel_daemon, "channel.refused", "webhook")[0]["detail"]
    assert (refused["sender"], refused["reason"]) == ("intruder", "sender not in allowed_users")


def test_listener_is_gone_after_remove(channel_daemon):
    port = free_port()
    configure(channel_daemon, "webhook", listen_port=port, callback_url="http://127.0.0.1:9/none")
    wait_active(channel_daemon, "webhook")
    remove(channel_daemon, "webhook")
    with pytest.raises(requests.ConnectionError):
        requests.post(f"http://127.0.0.1:{port}/", json={}, timeout=2)
    assert channel(channel_daemon, "webhook")["active"] is False


def test_without_a_set_secret_nothing_is_signed(channel_daemon):
    callback, port = Recorder(), free_port()
    try:
        configure(channel_daemon, "webhook", listen_port=port, callback_url=callback.url,
                  secret_env="WEBHOOK_UNSET_SECRET")
        wait_active(channel_daemon, "webhook")
        response = requests.post(f"http://127.0.0.1:{port}/", json={"sender_id": "s", "message": "plain"}, timeout=5)
        assert response.status_code == 202
        wait_for(lambda: callback.requests, what="callback")
        assert "X-Webhook-Signature" not in callback.requests[0]["headers"]
        assert json.loads(callback.requests[0]["body"])["message"] == "echo: plain"
    finally:
        remove(channel_daemon, "webhook")
        callback.close()


def test_listener_survives_hostile_clients(channel_daemon, hook):
    import socket

    url, callback = hook
    port = int(url.rsplit(":", 1)[1].strip("/"))
    for head in (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
                 b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
                 b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n",
                 b"POST /\x00 HTTP/9.9\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(head)
            status = sock.recv(200).split(b" ")[1]
            assert status in (b"400", b"413", b"505"), head
    # A client that stalls mid-body holds one thread only; others are served meanwhile.
    stalled = socket.create_connection(("127.0.0.1", port), timeout=5)
    stalled.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    body = json.dumps({"sender_id": "ok", "message": "still here"}).encode()
    assert requests.post(url, data=body, headers={"X-Webhook-Signature": sign(body)}, timeout=5).status_code == 202
    wait_for(lambda: callback.requests, what="reply while another client stalls")
    stalled.close()


def test_oversized_message_is_refused_not_run(channel_daemon, hook, fake_llm):
    url, callback = hook
    body = json.dumps({"sender_id": "big", "message": "x" * (70 * 1024)}).encode()
    before = len(fake_llm.requests)
    assert requests.post(url, data=body, headers={"X-Webhook-Signature": sign(body)}, timeout=5).status_code == 202
    wait_for(lambda: [e for e in audit(channel_daemon, "channel.refused", "webhook")
                      if e["detail"].get("sender") == "big"], what="refusal")
    assert audit(channel_daemon, "channel.refused", "webhook")[0]["detail"]["reason"] == "message larger than 64 KB"
    assert len(fake_llm.requests) == before and callback.requests == []


@pytest.mark.parametrize("browser", [
    {"Origin": "http://evil.example"}, {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"},
    # DNS rebinding: the page's own name resolves to 127.0.0.1, so the browser calls it same-origin.
    {"Host": "evil.example", "Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"},
])
def test_a_web_page_cannot_drive_an_unsigned_webhook(channel_daemon, fake_llm, browser):
    """Without a secret anyone who reaches the port may post, but not a page in the user's
    browser: platforms never send Origin or Sec-Fetch-Site, browsers always do."""
    callback, port = Recorder(), free_port()
    try:
        configure(channel_daemon, "webhook", listen_port=port, callback_url=callback.url,
                  secret_env="WEBHOOK_UNSET_SECRET", default_agent="helper")
        wait_active(channel_daemon, "webhook")
        before = len(fake_llm.requests)
        body = json.dumps({"sender_id": "mallory", "message": "do something"})
        response = requests.post(f"http://127.0.0.1:{port}/hook", data=body, timeout=5,
                                 headers={"Content-Type": "text/plain", **browser})
        assert (response.status_code, response.json()) == (403, {"error": "cross-site request refused"})
        # A platform's post (neither header) still goes through.
        response = requests.post(f"http://127.0.0.1:{port}/hook", data=body, timeout=5)
        assert response.status_code == 202
        wait_for(lambda: callback.requests, what="callback")
        assert len(callback.requests) == 1 and len(fake_llm.requests) == before + 1
    finally:
        remove(channel_daemon, "webhook")
        callback.close()


def test_a_deeply_nested_body_is_400_not_a_crash(channel_daemon, hook):
    url, callback = hook
    body = b"[" * 100_000 + b"]" * 100_000
    response = requests.post(url, data=body, headers={"X-Webhook-Signature": sign(body)}, timeout=10)
    assert (response.status_code, response.json()) == (400, {"error": "bad request: JSON nested too deeply"})
    body = json.dumps({"sender_id": "u", "message": "still fine"}).encode()
    assert requests.post(url, data=body, headers={"X-Webhook-Signature": sign(body)}, timeout=5).status_code == 202
