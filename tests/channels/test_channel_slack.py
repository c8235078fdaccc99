"""Slack adapter against a fake Web API + Socket Mode: envelopes acknowledged, DMs and app
mentions answered (threaded), a message seen as `message` and `app_mention` answered once,
own messages ignored, a workspace id in the allow-list, `disconnect` reconnects with a
fresh URL (logged at info, not audited as an error), ok=false errors surfaced; and the Events API over HTTP: url_verification,
signatures and their 5-minute window checked before parsing (401), events answered. The
shared checks (round trip, allow-list, 429, reconnect, stop, threads) run in
tests/channels/test_channel_contract.py."""

from __future__ import annotations

import json
import time

import pytest
import requests

import channel_contract as contract
from channel_contract import audit, daemon  # noqa: F401 - module fixture
from channel_fixtures import channel, configure, wait_active, wait_for
from fakes.slack import BOT_ID, TEAM
from support import free_port

ENV = contract.POLL_ENV
CASE = contract.CASES["slack"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_dm_mentions_threads_and_acks(daemon, fake):  # noqa: F811
    contract.round_trip(daemon, CASE, fake)
    assert fake.sent[0]["thread_ts"] is None and fake.sent[0]["unfurl_links"] is True  # DMs are not threaded
    fake.user_says("U1BOB", "plain chatter", channel="C0GENERAL")
    fake.user_says("U1BOB", "what's new?", channel="C0GENERAL", mention=True)
    wait_for(lambda: fake.replies("C0GENERAL"), what="channel reply")
    fake.user_says("U1BOB", "and in the thread?", channel="C0GENERAL", mention=True, thread_ts="1700000000.000001")
    wait_for(lambda: len(fake.replies("C0GENERAL")) == 2, what="thread reply")
    time.sleep(0.5)
    asked = next(m for m in fake.said if m["text"].endswith("what's new?"))
    channel_posts = [(s["text"], s["thread_ts"]) for s in fake.sent if s["channel"] == "C0GENERAL"]
    assert channel_posts == [("echo: what's new?", asked["ts"]), ("echo: and in the thread?", "1700000000.000001")]
    # Every envelope (users', and the bot's own messages echoed back) was acknowledged.
    wait_for(lambda: {e["envelope_id"] for e in fake.envelopes} <= set(fake.acked), what="all acked")
    assert all(e["payload"]["event"].get("bot_id") == BOT_ID for e in fake.envelopes
               if e["payload"]["event"].get("user") == "U0BOT")


def test_a_workspace_id_allows_its_channels(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake, allowed_channels=[TEAM])  # a workspace id covers its channels
    fake.user_says("U1BOB", "workspace-wide", channel="C0GENERAL", mention=True)
    wait_for(lambda: fake.replies("C0GENERAL") == ["echo: workspace-wide"], what="reply in the allowed team")


def test_disconnect_message_reconnects_with_a_fresh_url(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    tickets, errors = len(fake.used), len(audit(daemon, "channel.connection_error", "slack"))
    fake.disconnect("refresh_requested")
    wait_for(lambda: len(fake.used) > tickets, what="a new Socket Mode connection")
    assert len(set(fake.used)) == len(fake.used)  # every URL used once
    fake.user_says("U1ANN", "after refresh")
    wait_for(lambda: fake.replies("DU1ANN") == ["echo: after refresh"], what="reply after refresh")
    # A routine refresh: one info line, no warning, no connection error in the audit trail.
    refreshes = [line for line in daemon.log().splitlines() if "slack asked to reconnect (refresh_requested)" in line]
    assert refreshes and all(" INFO " in line for line in refreshes), refreshes
    assert len(audit(daemon, "channel.connection_error", "slack")) == errors


def test_ok_false_errors_and_bad_tokens(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    missing = daemon.post("/api/channels/slack/test", json={"message": "hi", "chat_id": "XNOPE"})
    assert missing.status_code == 502 and "channel_not_found" in missing.json()["error"]
    sent = daemon.post("/api/channels/slack/test", json={"message": "hello team", "chat_id": "C0GENERAL"})
    assert sent.status_code == 200 and fake.replies("C0GENERAL") == ["hello team"]
    result = configure(daemon, "slack", **{**CASE.config(fake), "bot_token_env": "SLACK_APP_TOKEN"})
    assert result["activated"] is False and channel(daemon, "slack")["active"] is False
    assert "invalid_auth" in audit(daemon, "channel.start_failed", "slack")[0]["detail"]["error"]
    result = configure(daemon, "slack", **{**CASE.config(fake), "app_token_env": "SLACK_BOT_TOKEN"})
    assert result["activated"] is False and channel(daemon, "slack")["active"] is False
    assert "not_allowed_token_type" in audit(daemon, "channel.start_failed", "slack")[0]["detail"]["error"]


def test_a_platform_unreachable_at_start_is_tried_again(daemon, fake):  # noqa: F811
    fake.stop()  # Slack cannot be reached when the channel starts (a boot before the network)
    result = configure(daemon, "slack", **CASE.config(fake), default_agent="helper")
    assert result["activated"] is False
    assert result["note"] == "the platform does not answer yet: the adapter starts on its own once it does"
    failed = audit(daemon, "channel.start_failed", "slack")[0]["detail"]
    assert failed == {"error": f"POST {fake.url}/api/auth.test: ConnectionError", "retry_in_secs": 5.0}
    fake.start()
    wait_active(daemon, "slack", timeout=30)
    assert audit(daemon, "channel.start", "slack")
    assert "channel slack: starting again" in daemon.log()
    # A refusal is for a person to fix: it is not tried again.
    result = configure(daemon, "slack", **{**CASE.config(fake), "bot_token_env": "SLACK_APP_TOKEN"})
    assert result["activated"] is False
    assert "retry_in_secs" not in audit(daemon, "channel.start_failed", "slack")[0]["detail"]


def test_events_api_over_http(daemon, fake, fake_llm):  # noqa: F811
    port = free_port()
    configure(daemon, "slack", api_url=fake.url + "/api", bot_token_env="SLACK_BOT_TOKEN", webhook_port=port,
              signing_secret_env="SLACK_SIGNING_SECRET", default_agent="helper")
    wait_active(daemon, "slack")
    fake.webhook = f"http://127.0.0.1:{port}/slack/events"
    challenge = json.dumps({"token": "x", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
                            "type": "url_verification"}).encode()
    answer = fake.post_signed(challenge)
    assert answer.status_code == 200
    assert answer.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}
    before = len(fake_llm.requests)
    forged = json.dumps({"type": "event_callback", "team_id": TEAM, "event": {
        "type": "message", "channel_type": "im", "user": "U1EVE", "channel": "DU1EVE", "text": "forged",
        "ts": "1.000001"}}).encode()
    stale = str(int(time.time()) - 6 * 60)
    for response in (fake.post_signed(forged, signature="v0=" + "0" * 64),
                     fake.post_signed(forged, signature=""),
                     fake.post_signed(forged, timestamp=stale),  # correctly signed, 6 minutes old
                     fake.post_signed(b"not json at all", signature="v0=bad")):
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}
    fake.user_says("U1ANN", "over http")
    wait_for(lambda: fake.replies("DU1ANN"), what="reply to an HTTP event")
    time.sleep(0.5)
    assert fake.replies("DU1ANN") == ["echo: over http"] and fake.replies("DU1EVE") == []
    assert all(d.status_code == 200 for d in fake.deliveries)
    assert len(fake_llm.requests) == before + 1
    assert audit(daemon, "channel.refused", "slack")[0]["detail"]["reason"] == "bad signature"
    daemon.delete("/api/channels/slack/configure")  # stop() closes the listener
    assert channel(daemon, "slack")["active"] is False
    with pytest.raises(requests.ConnectionError):
        fake.post_signed(challenge)


def test_events_mode_on_the_daemons_own_port(daemon, fake, fake_llm):  # noqa: F811
    bad = daemon.post("/api/channels/slack/configure", json={"mode": "http"})
    assert bad.status_code == 400 and bad.json()["error"].startswith("mode: must be \"socket\"")
    configure(daemon, "slack", api_url=fake.url + "/api", bot_token_env="SLACK_BOT_TOKEN", mode="events",
              signing_secret_env="SLACK_SIGNING_SECRET", default_agent="helper")
    wait_active(daemon, "slack")
    fake.webhook = daemon.url + "/channels/slack/webhook"
    assert not fake.used  # no Socket Mode connection was opened
    answer = fake.post_signed(json.dumps({"token": "x", "challenge": "c-on-the-daemon",
                                          "type": "url_verification"}).encode())
    assert (answer.status_code, answer.json()) == (200, {"challenge": "c-on-the-daemon"})
    before = len(fake_llm.requests)
    forged = json.dumps({"type": "event_callback", "team_id": TEAM, "event": {
        "type": "message", "channel_type": "im", "user": "U1EVE", "channel": "DU1EVE", "text": "forged",
        "ts": "1.000001"}}).encode()
    for response in (fake.post_signed(forged, signature="v0=" + "0" * 64),
                     fake.post_signed(b"not json at all", signature="v0=bad")):
        assert (response.status_code, response.json()) == (401, {"error": "invalid signature"})
    fake.user_says("U1ANN", "on the daemon's port")
    wait_for(lambda: fake.replies("DU1ANN"), what="reply to an event on the daemon's port")
    assert fake.replies("DU1ANN") == ["echo: on the daemon's port"] and fake.replies("DU1EVE") == []
    # The user's event, then (as Slack does) the bot's own reply, which is not answered.
    assert fake.deliveries and all(d.status_code == 200 for d in fake.deliveries)
    time.sleep(0.5)
    assert fake.replies("DU1ANN") == ["echo: on the daemon's port"]
    assert len(fake_llm.requests) == before + 1
    assert audit(daemon, "channel.refused", "slack")[0]["detail"]["reason"] == "bad signature"
