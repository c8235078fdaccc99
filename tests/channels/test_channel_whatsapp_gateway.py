"""WhatsApp personal account through a WhatsApp Web gateway, end to end: QR login through
the daemon's /qr routes, the adapter turning active once the gateway is connected, a
WhatsApp user's message forwarded by the gateway reaching the agent (allow-list applied,
the sender's own session) and the reply going out via the gateway's /send; a forward
without the secret path token is 401; the gateway logging out turns `active` off; stop()."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import requests

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, remove, start_channel_daemon, wait_active, wait_for
from fakes.whatsapp_gateway import FakeGateway
from support import free_port

GATEWAY_TOKEN = "gw-path-token-7f3a"


@pytest.fixture(scope="module")
def gateway_daemon(tmp_path_factory, fake_llm):
    gateway = FakeGateway().start()
    daemon = start_channel_daemon(tmp_path_factory.mktemp("wa-gateway"), fake_llm, env={
        **CHANNEL_ENV, "WHATSAPP_WEB_GATEWAY_URL": gateway.url, "WHATSAPP_GATEWAY_TOKEN": GATEWAY_TOKEN})
    yield daemon, gateway
    daemon.stop()
    gateway.stop()


def test_qr_login_then_messages_flow_through_the_gateway(gateway_daemon):
    daemon, gateway = gateway_daemon
    port = free_port()
    gateway.forward_url = f"http://127.0.0.1:{port}/{GATEWAY_TOKEN}"  # the gateway's OPENFANG_URL
    configure(daemon, "whatsapp", webhook_port=port, default_agent="helper")
    time.sleep(0.5)
    assert channel(daemon, "whatsapp")["active"] is False  # listening, but nobody has scanned the QR yet
    started = daemon.post("/api/channels/whatsapp/qr/start")
    assert started.json() == {"session_id": gateway.session_id, "status": "waiting_for_scan"}
    status = daemon.get(f"/api/channels/whatsapp/qr/status?session_id={gateway.session_id}").json()
    assert status["status"] == "waiting_for_scan" and status["qr_code"].startswith("data:image/png;base64,")
    gateway.scan()
    assert daemon.get(f"/api/channels/whatsapp/qr/status?session_id={gateway.session_id}").json() == \
        {"status": "connected", "phone_number": "+15550001"}
    wait_active(daemon, "whatsapp", timeout=15)

    response = gateway.user_says("+15550002", "hello gateway")
    assert (response.status_code, response.json()) == (200, {"response": ""})
    wait_for(lambda: gateway.sent, what="reply via /send")
    time.sleep(0.3)
    assert [(s["to"], s["text"], s["via"]) for s in gateway.sent] == [("+15550002", "echo: hello gateway", "send")]
    inbound = audit(daemon, "channel.inbound", "whatsapp")[0]["detail"]
    assert (inbound["sender"], inbound["conversation"]) == ("+15550002", "whatsapp:dm:+15550002")

    # Without the secret first path segment (or with a guessed one) the forward is refused.
    for url in (f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/guess"):
        refused = gateway.user_says("+15550009", "sneaky", url=url)
        assert refused.status_code == 401 and refused.json() == {"error": "invalid signature"}

    # allowed_users matches the phone number with or without "+".
    configure(daemon, "whatsapp", webhook_port=port, default_agent="helper", allowed_users=["15550003"])
    wait_active(daemon, "whatsapp", timeout=15)
    gateway.sent.clear()
    assert gateway.user_says("+15550004", "intruder").status_code == 200
    assert gateway.user_says("+15550003", "member").status_code == 200
    wait_for(lambda: gateway.sent, what="reply to the allowed number")
    time.sleep(0.3)
    assert [(s["to"], s["text"]) for s in gateway.sent] == [("+15550003", "echo: member")]
    assert audit(daemon, "channel.refused", "whatsapp")[0]["detail"]["sender"] == "+15550004"
    assert "sneaky" not in str(daemon.get("/api/audit/recent?limit=50").json())

    # The test call sends through the gateway too.
    tested = daemon.post("/api/channels/whatsapp/test", json={"message": "ping", "chat_id": "+15550005"})
    assert tested.status_code == 200, tested.text
    assert gateway.replies("+15550005") == ["ping"]

    # The gateway logs out: the adapter stops reporting active (health is re-checked every 5 s).
    gateway.connected = False
    wait_for(lambda: channel(daemon, "whatsapp")["active"] is False, timeout=15, what="inactive after logout")
    remove(daemon, "whatsapp")
    with pytest.raises(requests.ConnectionError):
        gateway.user_says("+15550002", "gone")


def test_stop_ends_every_thread_and_the_token_stays_out_of_logs(monkeypatch, caplog):
    from agentd.channels.adapter import ChannelContext
    from agentd.channels.adapters import load
    from agentd.channels.adapters.whatsapp_gateway import WhatsAppGatewayAdapter
    from agentd.channels.catalog import ChannelCatalog, settings_for

    gateway = FakeGateway().start()
    gateway.scan()
    monkeypatch.setenv("WHATSAPP_WEB_GATEWAY_URL", gateway.url)
    monkeypatch.setenv("WHATSAPP_GATEWAY_TOKEN", GATEWAY_TOKEN)
    port, got = free_port(), []
    ctx = ChannelContext("whatsapp", "127.0.0.1", deliver=got.append, audit=lambda *a: None,
                         load_state=dict, save_state=lambda s: None)
    adapter = load("whatsapp")(ctx, settings_for(ChannelCatalog.load().get("whatsapp"), {"webhook_port": port}))
    assert isinstance(adapter, WhatsAppGatewayAdapter)  # no phone_number_id + a gateway URL: gateway mode
    caplog.set_level(logging.DEBUG, logger="agentd.channels.whatsapp")
    adapter.start()
    try:
        assert adapter.health()
        assert gateway.user_says("+15550002", "in process", url=f"http://127.0.0.1:{port}/{GATEWAY_TOKEN}").status_code == 200
        assert [(m.sender_id, m.text, m.sender_name) for m in got] == [("+15550002", "in process", "User 0002")]
        assert "/***/api/agents/assistant/message" in caplog.text and GATEWAY_TOKEN not in caplog.text
    finally:
        adapter.stop()
        gateway.stop()
    assert adapter.threads_alive() == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("channel-whatsapp-") and t.is_alive()]
