"""Through a channel, one sender's exchange remembered automatically is never recalled into
another sender's model request: fragments record `channel:<adapter>:<sender>`. Real daemon,
the webhook adapter, the fake LLM (what the model was sent is read from its request log)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest
import requests

from channel_fixtures import CHANNEL_ENV, configure, remove, start_channel_daemon, wait_active, wait_for
from fakes.recorder import Recorder
from support import free_port

SECRET = "s3cret-hmac"  # WEBHOOK_TEST_SECRET in the daemon's environment


def send(url: str, sender: str, text: str) -> None:
    body = json.dumps({"sender_id": sender, "message": text}).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    r = requests.post(url + "webhook", data=body, timeout=5,
                      headers={"X-Webhook-Signature": signature, "Content-Type": "application/json"})
    assert r.status_code == 202, r.text


@pytest.fixture(scope="module")
def remembering_daemon(tmp_path_factory, fake_llm):
    """The channel daemon with exchanges remembered (the default configuration)."""
    daemon = start_channel_daemon(tmp_path_factory.mktemp("owners"), fake_llm, env=CHANNEL_ENV, remember=True)
    yield daemon
    daemon.stop()


def test_a_senders_exchange_is_not_recalled_for_another_sender(remembering_daemon, fake_llm) -> None:
    d = remembering_daemon
    callback = Recorder()
    port = free_port()
    configure(d, "webhook", listen_port=port, callback_url=callback.url + "/cb", secret_env="WEBHOOK_TEST_SECRET",
              default_agent="helper")
    wait_active(d, "webhook")
    url = f"http://127.0.0.1:{port}/"
    agent = next(a["id"] for a in d.get("/api/agents").json() if a["name"] == "helper")
    try:
        before = d.get(f"/api/memory/agents/{agent}/memories").json()["total"]
        send(url, "owner-1", "Please note that my favourite drink is jasmine tea")
        wait_for(lambda: len(callback.requests) >= 1, what="first reply")
        deadline = time.time() + 20
        while d.get(f"/api/memory/agents/{agent}/memories").json()["total"] <= before and time.time() < deadline:
            time.sleep(0.1)
        newest = d.get(f"/api/memory/agents/{agent}/memories").json()["memories"][0]
        assert newest["metadata"]["owner"] == "channel:webhook:owner-1"
        mark = len(fake_llm.requests)
        send(url, "owner-2", "What beverage do I like?")
        wait_for(lambda: len(callback.requests) >= 2, what="second reply")
        prompts = ["\n".join(m.get("content") or "" for m in (r.get("json") or {}).get("messages", []))
                   for r in fake_llm.requests[mark:]]
        asked = [p for p in prompts if "What beverage do I like?" in p]
        assert asked and all("jasmine tea" not in p for p in asked)
    finally:
        remove(d, "webhook")
        callback.close()
