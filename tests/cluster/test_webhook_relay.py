"""Two real daemons on one PostgreSQL database, the generic webhook adapter (signed) held by
daemon-a: a webhook that reaches the standby daemon-b is relayed to daemon-a and answered
with daemon-a's answer. A signed event reaches the agent once; a bad signature is refused by
the holder (401) and nothing runs; a relayed request is never relayed again and only a
cluster member's signature is accepted; behind nginx's round robin every delivery is answered
once; the holder gone, the standby answers 503 with Retry-After until it takes the channel
over and answers itself."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import time
from pathlib import Path

import psycopg2
import pytest
import requests

import pgtest
from channel_fixtures import AGENT_TOML, CHANNEL_ENV, audit, wait_for
from conftest import LLM_ENV, llm_config
from fakes.recorder import Recorder
from support import Daemon, make_home
from tests.cluster.test_cluster import ClusterNginx

LEASE = 4.0
SECRET = CHANNEL_ENV["WEBHOOK_TEST_SECRET"]
HOOK = "/channels/webhook/webhook"

pytestmark = [
    pytest.mark.skipif(pgtest.pg_bindir() is None and not os.environ.get("AGENTD_TEST_DATABASE_URL"),
                       reason="PostgreSQL (initdb/pg_ctl) is not installed: apt-get install postgresql"),
    pytest.mark.skipif(shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
                       reason="nginx is not installed: apt-get install nginx"),
]


def signed(text: str, sender: str = "u-1", secret: str = SECRET) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"sender_id": sender, "message": text}).encode()
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return body, {"Content-Type": "application/json", "X-Webhook-Signature": signature}


def replies(callback: Recorder) -> list[str]:
    return [json.loads(r["body"])["message"] for r in callback.requests]


def relay_headers(db_url: str, by: str, stamp: int, body: bytes) -> dict[str, str]:
    """The headers a member of the cluster adds when it relays `body` from 127.0.0.1, made
    with the peer secret read from the database (as any member reads it)."""
    with psycopg2.connect(db_url) as conn, conn.cursor() as cur:
        # As JSON text: whether psycopg2 decodes a json column depends on what registered
        # its typecasters in this process (Pony's provider registers its own).
        cur.execute("SELECT value::text FROM settings WHERE key = 'cluster_peer_secret'")
        secret = json.loads(cur.fetchone()[0])
    canonical = "\n".join([by, str(stamp), "127.0.0.1", "POST", HOOK, "[]", hashlib.sha256(body).hexdigest()])
    return {"X-Agentd-Forwarded-By": by, "X-Agentd-Forwarded-For": "127.0.0.1",
            "X-Agentd-Forwarded-Signature": f"t={stamp},v1=" + hmac.new(secret.encode(), canonical.encode(),
                                                                          hashlib.sha256).hexdigest()}


def test_a_standby_relays_webhooks_to_the_daemon_holding_the_channel(tmp_path, fake_llm) -> None:
    db_url = pgtest.databases().new_url()
    callback = Recorder()
    daemons: list[Daemon] = []
    proxy = None
    try:
        for name in ("daemon-a", "daemon-b"):
            extra = (f'\n[cluster]\ndaemon_id = "{name}"\nlease_secs = {LEASE}\n'
                     f'\n[channels.webhook]\ncallback_url = "{callback.url}/cb"\n'
                     'secret_env = "WEBHOOK_TEST_SECRET"\ndefault_agent = "helper"\n')
            home = make_home(tmp_path / name, llm_config(fake_llm, extra))
            # One after the other: daemon-a takes the channel, daemon-b is its standby.
            daemons.append(Daemon(home, env_extra={**LLM_ENV, **CHANNEL_ENV, "AGENTD_DATABASE_URL": db_url}).start())
        a, b = daemons
        assert a.post("/api/agents", json={"manifest_toml": AGENT_TOML}).status_code == 201
        view = b.get("/api/cluster").json()
        assert view["channel_leaders"] == {"webhook": "daemon-a"}
        assert {d["id"]: d["url"] for d in view["daemons"]} == {"daemon-a": a.url, "daemon-b": b.url}
        wait_for(lambda: any(x["name"] == "helper" for x in b.get("/api/agents").json()), what="agent on b")

        # -- a signed event sent to the standby reaches the agent once, through the holder -------
        before = len(fake_llm.requests)
        body, headers = signed("relayed hello")
        answer = requests.post(b.url + HOOK, data=body, headers=headers, timeout=30)
        assert answer.status_code == 202, answer.text
        assert answer.json()["status"] == "accepted"
        assert (answer.headers["X-Agentd-Daemon"], answer.headers["X-Agentd-Forwarded-To"]) == ("daemon-b", "daemon-a")
        wait_for(lambda: callback.requests, what="the agent's reply")
        time.sleep(0.5)
        assert replies(callback) == ["echo: relayed hello"]
        assert len(fake_llm.requests) == before + 1
        inbound = audit(a, "channel.inbound", "webhook")
        assert [e["detail"]["message_id"] for e in inbound] == [answer.json()["message_id"]]

        # -- a bad signature sent to the standby is refused by the holder; nothing runs ---------
        body, headers = signed("forged", secret="wrong-secret")
        refused = requests.post(b.url + HOOK, data=body, headers=headers, timeout=30)
        assert (refused.status_code, refused.json()) == (401, {"error": "invalid signature"})
        assert refused.headers["X-Agentd-Forwarded-To"] == "daemon-a"
        detail = audit(a, "channel.refused", "webhook")[0]["detail"]
        assert (detail["reason"], detail["remote"]) == ("bad signature", "127.0.0.1")  # the client b saw

        # -- only a member's fresh signature is accepted; a relayed request is never relayed again
        body, headers = signed("loop?")
        stamp = int(time.time())
        forged = {**headers, **relay_headers(db_url, "daemon-b", stamp, body)}
        forged["X-Agentd-Forwarded-Signature"] = f"t={stamp},v1=" + "0" * 64
        stale = {**headers, **relay_headers(db_url, "daemon-b", stamp - 120, body)}
        for sent in (forged, stale, {**headers, "X-Agentd-Forwarded-By": "daemon-b"}):
            answer = requests.post(a.url + HOOK, data=body, headers=sent, timeout=30)
            assert answer.status_code == 403, answer.text
            assert answer.json() == {"error": "relayed webhook refused: not signed by a daemon of this cluster"}
        # A valid relay that lands on a daemon not holding the channel stops there.
        again = requests.post(b.url + HOOK, data=body, headers={**headers, **relay_headers(
            db_url, "daemon-a", int(time.time()), body)}, timeout=30)
        assert again.status_code == 503, again.text
        assert "X-Agentd-Forwarded-To" not in again.headers
        assert again.headers["Retry-After"] == "5"
        # ...and reaches the holder when it is sent there.
        direct = requests.post(a.url + HOOK, data=body, headers={**headers, **relay_headers(
            db_url, "daemon-b", int(time.time()), body)}, timeout=30)
        assert direct.status_code == 202, direct.text
        wait_for(lambda: len(callback.requests) == 2, what="the relayed message's reply")
        time.sleep(0.5)
        assert replies(callback)[1:] == ["echo: loop?"]
        assert len(fake_llm.requests) == before + 2

        # -- behind nginx's round robin (docs/nginx-cluster.conf) each delivery is answered once --
        proxy = ClusterNginx((a.port, b.port))
        served = []
        for i in range(4):
            body, headers = signed(f"via nginx {i}", sender=f"u-{i}")
            answer = requests.post(proxy.url + HOOK, data=body, headers=headers, timeout=30)
            assert answer.status_code == 202, answer.text
            served.append(answer.headers["X-Agentd-Daemon"])
        assert set(served) == {"daemon-a", "daemon-b"}
        wait_for(lambda: len(callback.requests) == 6, what="replies through nginx")
        time.sleep(0.5)
        assert sorted(replies(callback)[2:]) == [f"echo: via nginx {i}" for i in range(4)]
        assert len(fake_llm.requests) == before + 6

        # -- the holder gone: 503 + Retry-After until the standby takes the channel over --------
        a.kill()
        body, headers = signed("while a is gone")
        gone = requests.post(b.url + HOOK, data=body, headers=headers, timeout=30)
        assert (gone.status_code, gone.json()) == (503, {"error": "channel webhook is not running on this daemon"})
        assert gone.headers["Retry-After"] == "5"
        wait_for(lambda: b.get("/api/cluster").json()["channel_leaders"] == {"webhook": "daemon-b"},
                 LEASE * 3 + 10, what="daemon-b takes the channel over")
        wait_for(lambda: requests.post(b.url + HOOK, data=body, headers=headers, timeout=30).status_code == 202,
                 10, what="daemon-b answers itself")
        wait_for(lambda: "echo: while a is gone" in replies(callback), what="reply from daemon-b")
    finally:
        if proxy is not None:
            proxy.stop()
        for d in daemons:
            d.stop()
        callback.close()
