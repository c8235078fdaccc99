"""Threema Gateway adapter against a fake message API: an E2E-encrypted callback (MAC
checked first) reaches the agent and the reply goes back end-to-end encrypted via
/send_e2e; a forged or missing MAC is 401 before anything is decrypted; allow-list; 429
retried after Retry-After; basic mode sends via /send_simple; stop() ends every thread."""

from __future__ import annotations

import threading
import time
from urllib.parse import parse_qs, urlencode

import pytest
import requests
from nacl.public import PrivateKey

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, remove, wait_active, wait_for  # noqa: F401
from channel_fixtures import channel_daemon  # noqa: F401
from fakes.threema import FakeThreema, mac
from support import free_port

GATEWAY_ID, SECRET = "*AGENTD1", CHANNEL_ENV["THREEMA_SECRET"]
GATEWAY_KEY = PrivateKey(bytes.fromhex(CHANNEL_ENV["THREEMA_PRIVATE_KEY"].split(":")[1]))


def setup(daemon, fake, port, **extra):  # type: ignore[no-untyped-def]
    configure(daemon, "threema", threema_id=GATEWAY_ID, webhook_port=port, api_url=fake.url,
              default_agent="helper", **extra)
    wait_active(daemon, "threema")


@pytest.fixture
def threema(channel_daemon):
    fake, port = FakeThreema(GATEWAY_ID, SECRET, GATEWAY_KEY.public_key.encode()).start(), free_port()
    setup(channel_daemon, fake, port)
    yield fake, f"http://127.0.0.1:{port}/threema", port
    remove(channel_daemon, "threema")
    fake.stop()


def post(url: str, body: bytes) -> requests.Response:
    return requests.post(url, data=body, timeout=5, headers={"Content-Type": "application/x-www-form-urlencoded"})


def test_e2e_message_is_answered_end_to_end_encrypted(channel_daemon, threema):
    fake, url, _ = threema
    response = post(url, fake.callback("ECHOANN1", "hello threema"))
    assert response.status_code == 200
    wait_for(lambda: fake.sent, what="reply")
    time.sleep(0.3)
    assert [(s["mode"], s["to"], s["text"]) for s in fake.sent] == [("e2e", "ECHOANN1", "echo: hello threema")]
    assert fake.lookups == ["ECHOANN1"]  # looked up once, reused for the reply
    outbound = wait_for(lambda: audit(channel_daemon, "channel.outbound", "threema"), what="outbound audit")
    assert outbound[0]["detail"]["message_id"] == fake.sent[0]["id"]
    assert channel(channel_daemon, "threema")["active"] is True
    # Non-text messages (here a delivery receipt, type 0x80) are acknowledged, never answered.
    assert post(url, fake.callback("ECHOANN1", "\x01", kind=0x80)).status_code == 200
    time.sleep(0.3)
    assert len(fake.sent) == 1


def test_forged_mac_is_refused_before_decryption(channel_daemon, threema, fake_llm):
    fake, url, _ = threema
    before = len(fake_llm.requests)
    good = fake.callback("MALLORY1", "forged")
    forged = [fake.callback("MALLORY1", "forged", secret="guessed-secret"),  # wrong key
              good.replace(b"&mac=", b"&mac=0"),                              # altered MAC
              good.split(b"&mac=")[0],                                        # no MAC at all
              resign(good, date="1")]                                         # a field changed after signing
    for body in forged:
        response = post(url, body)
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == [] and fake.lookups == []
    assert audit(channel_daemon, "channel.refused", "threema")[0]["detail"]["reason"] == "bad signature"
    # Correctly signed but not addressed to our ID, or a box that does not open: 400, nothing delivered.
    assert post(url, fake.callback("MALLORY1", "x", to="*OTHER01")).status_code == 400
    garbage = resign(good, secret=SECRET, box=(b"\0" * 40).hex())
    assert post(url, garbage).status_code == 400
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == []


def resign(body: bytes, secret: str | None = None, **changes: str) -> bytes:
    """`body` with fields changed; re-signed with `secret` when given, else the old MAC kept."""
    form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
    form.update(changes)
    if secret is not None:
        form["mac"] = mac(secret, form)
    return urlencode(form).encode()


def test_allow_list_and_429(channel_daemon, threema):
    fake, url, port = threema
    setup(channel_daemon, fake, port, allowed_users=["VIPUSER1"])
    fake.throttle = [1]
    asked = time.time()
    assert post(url, fake.callback("BADUSER1", "intruder")).status_code == 200
    assert post(url, fake.callback("VIPUSER1", "member")).status_code == 200
    wait_for(lambda: fake.sent, what="reply after 429")
    time.sleep(0.3)
    assert [(s["to"], s["text"]) for s in fake.sent] == [("VIPUSER1", "echo: member")]
    assert fake.throttle == [] and fake.sent[0]["at"] - asked >= 1.0
    assert audit(channel_daemon, "channel.refused", "threema")[0]["detail"]["sender"] == "BADUSER1"


def test_basic_mode_sends_simple_messages(channel_daemon, threema):
    fake, url, port = threema
    fake.user("ECHOBOB1")
    setup(channel_daemon, fake, port, private_key_env="THREEMA_NO_SUCH_KEY")
    response = channel_daemon.post("/api/channels/threema/test", json={"message": "hi bob", "chat_id": "ECHOBOB1"})
    assert response.status_code == 200, response.text
    assert [(s["mode"], s["to"], s["text"]) for s in fake.sent] == [("simple", "ECHOBOB1", "hi bob")]
    # A long reply is split so each part fits the Gateway's 3500-byte limit.
    long = ("ü" * 1000 + " ") * 4
    assert channel_daemon.post("/api/channels/threema/test", json={"message": long, "chat_id": "ECHOBOB1"}).status_code == 200
    parts = fake.replies("ECHOBOB1")[1:]
    assert len(parts) >= 3 and all(len(p.encode()) <= 3500 for p in parts)
    assert "".join(parts).replace(" ", "") == long.replace(" ", "")


def test_wrong_secret_and_stop(channel_daemon, threema):
    fake, url, port = threema
    fake.secret = "rotated"  # the Gateway refuses our secret: the test call says so
    response = channel_daemon.post("/api/channels/threema/test", json={"message": "x", "chat_id": "ECHOANN1"})
    assert response.status_code == 502 and "401" in response.json()["error"]
    remove(channel_daemon, "threema")
    assert channel(channel_daemon, "threema")["active"] is False
    with pytest.raises(requests.ConnectionError):
        post(url, fake.callback("ECHOANN1", "gone"))
    # A wrong secret (GET /credits answers 401) or a malformed ID fails the start: never active.
    for threema_id, error in ((GATEWAY_ID, "401"), ("short", "threema_id")):
        before = len(audit(channel_daemon, "channel.start_failed", "threema"))
        configure(channel_daemon, "threema", threema_id=threema_id, webhook_port=port, api_url=fake.url)
        failed = wait_for(lambda: [rows for rows in [audit(channel_daemon, "channel.start_failed", "threema")]
                                   if len(rows) > before], what="start failure")[0]  # newest first
        assert error in failed[0]["detail"]["error"]
        assert channel(channel_daemon, "threema")["active"] is False
    with pytest.raises(requests.ConnectionError):
        post(url, fake.callback("ECHOANN1", "gone"))
    fake.secret = SECRET
    setup(channel_daemon, fake, port)  # the fixture removes it again


def test_stop_ends_every_thread(monkeypatch):
    from agentd.channels.adapter import ChannelContext
    from agentd.channels.adapters.threema import ADAPTER
    from agentd.channels.catalog import ChannelCatalog, settings_for

    for key in ("THREEMA_SECRET", "THREEMA_PRIVATE_KEY"):
        monkeypatch.setenv(key, CHANNEL_ENV[key])
    fake, port = FakeThreema(GATEWAY_ID, SECRET, GATEWAY_KEY.public_key.encode()).start(), free_port()
    got: list = []
    ctx = ChannelContext("threema", "127.0.0.1", deliver=got.append, audit=lambda *a: None,
                         load_state=dict, save_state=lambda s: None)
    info = ChannelCatalog.load().get("threema")
    adapter = ADAPTER(ctx, settings_for(info, {"threema_id": GATEWAY_ID, "webhook_port": port, "api_url": fake.url}))
    adapter.start()
    try:
        assert post(f"http://127.0.0.1:{port}/", fake.callback("ECHOANN1", "in process")).status_code == 200
        assert [(m.sender_id, m.text, m.sender_name) for m in got] == [("ECHOANN1", "in process", "Echoann1")]
    finally:
        adapter.stop()
        fake.stop()
    assert adapter.threads_alive() == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("channel-threema-") and t.is_alive()]
