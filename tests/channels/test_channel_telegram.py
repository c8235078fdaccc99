"""Telegram adapter against a fake Bot API: long-poll round trip with typing, per-user
sessions, order per conversation, errors and think tags, the test message, a failing
platform backed off from. The shared checks (round trip, allow-list, 429 retried after
retry_after, reconnect, stop, threads) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_fixtures import audit, channel, channel_daemon, configure, wait_active, wait_for  # noqa: F401


@pytest.fixture
def telegram(channel_daemon):
    yield from contract.serve(channel_daemon, contract.CASES["telegram"])


def setup(daemon, fake, **extra):
    configure(daemon, "telegram", bot_token_env="TELEGRAM_BOT_TOKEN", api_url=fake.url, long_poll_secs=1,
              default_agent="helper", **extra)
    wait_active(daemon, "telegram")


def test_message_reaches_agent_and_reply_reaches_user(channel_daemon, telegram, fake_llm):
    setup(channel_daemon, telegram)
    telegram.user_says(501, "hello bot", username="ann")
    wait_for(lambda: telegram.replies_to(501), what="reply")
    assert telegram.replies_to(501) == ["echo: hello bot"]
    assert {"chat_id": 501, "action": "typing"} in telegram.actions
    # A second user gets their own session: ann's words never reach bob's model call.
    telegram.user_says(502, "second user here", username="bob")
    wait_for(lambda: telegram.replies_to(502), what="reply to bob")
    bob_call = next(r for r in reversed(fake_llm.requests)
                    if "second user here" in str(r["json"]))
    assert "hello bot" not in str(bob_call["json"]["messages"])
    telegram.user_says(501, "and again", username="ann")
    wait_for(lambda: len(telegram.replies_to(501)) == 2, what="second reply")
    ann_call = next(r for r in reversed(fake_llm.requests) if "and again" in str(r["json"]))
    assert "hello bot" in str(ann_call["json"]["messages"])  # ann's own history is kept


def test_order_per_conversation_errors_and_think_tags(channel_daemon, telegram, fake_llm):
    setup(channel_daemon, telegram)
    telegram.user_says(901, "[[slow:0.6]] first")
    telegram.user_says(901, "second")
    telegram.user_says(902, "[[slow:0.6]] other user")
    wait_for(lambda: len(telegram.replies_to(901)) == 2 and telegram.replies_to(902), what="replies")
    assert telegram.replies_to(901) == ["echo: first", "echo: second"]  # in order despite the slow first
    # 902's model call started while 901's slow one was still running: conversations run in parallel.
    # The fake's log is shared by every test of this worker: other tests send list contents.
    calls = {r["json"]["messages"][-1]["content"]: r for r in list(fake_llm.requests)
             if r["path"].endswith("/chat/completions") and r["json"]["messages"][-1]["role"] == "user"
             and isinstance(r["json"]["messages"][-1]["content"], str)}
    first, other = calls["[[slow:0.6]] first"], calls["[[slow:0.6]] other user"]
    assert other["time"] < first["done"] and first["time"] < other["done"]
    telegram.user_says(903, "[[think]] ponder")
    wait_for(lambda: telegram.replies_to(903), what="think reply")
    assert telegram.replies_to(903) == ["echo: ponder"]
    telegram.user_says(904, "[[fail:500]] boom")
    wait_for(lambda: telegram.replies_to(904), what="apology")
    assert telegram.replies_to(904)[0].startswith("Sorry, something went wrong")
    error = audit(channel_daemon, "channel.error", "telegram")[0]["detail"]
    assert "500" in error["error"] and "boom" not in str(error)
    telegram.user_says(901, "/new")
    wait_for(lambda: len(telegram.replies_to(901)) == 3, what="/new answer")
    assert telegram.replies_to(901)[2] == "Started a new conversation."
    telegram.user_says(901, "fresh start")
    wait_for(lambda: len(telegram.replies_to(901)) == 4, what="reply after /new")
    call = next(r for r in reversed(fake_llm.requests) if "fresh start" in str(r["json"]))
    assert "second" not in str(call["json"]["messages"])  # history of 901 was cleared


def test_test_endpoint_delivers_or_says_why(channel_daemon, telegram):
    setup(channel_daemon, telegram, default_chat_id="4242")
    response = channel_daemon.post("/api/channels/telegram/test", json={"message": "are you there"})
    assert response.json() == {"status": "success", "message": "test message delivered to 4242"}
    assert telegram.replies_to(4242) == ["are you there"]
    telegram.stop()  # platform down: a clear error, not a fake success
    response = channel_daemon.post("/api/channels/telegram/test", json={"message": "again", "chat_id": "77"})
    assert response.status_code == 502 and response.json()["error"].startswith("test message not delivered")
    telegram.start()


def test_failing_platform_backs_off_and_recovers(channel_daemon, telegram):
    setup(channel_daemon, telegram)
    telegram.broken = True
    wait_for(lambda: not channel(channel_daemon, "telegram")["active"], what="inactive while failing")
    polls = len(telegram.polls)
    time.sleep(2.0)
    errors = [e for e in audit(channel_daemon, "channel.connection_error", "telegram")
              if "502" in e["detail"]["error"]]
    # One entry per outage, not one per retry. (On failure, show every telegram audit row:
    # a restart of the adapter in between would explain a second entry.)
    assert len(errors) == 1, [(e["id"], e["event"], e["timestamp"], e["detail"])
                              for e in channel_daemon.get("/api/audit/recent?limit=100").json()
                              if e["subject"] == "telegram"]
    assert channel_daemon.get("/api/health").status_code == 200
    telegram.broken = False
    wait_active(channel_daemon, "telegram", timeout=15)
    assert len(telegram.polls) > polls
    telegram.user_says(1001, "recovered")
    wait_for(lambda: telegram.replies_to(1001), what="reply after recovery")


def test_poll_interval_secs_pauses_between_get_updates(channel_daemon, telegram):
    setup(channel_daemon, telegram, poll_interval_secs=1)
    start = len(telegram.polls)
    wait_for(lambda: len(telegram.polls) >= start + 3, timeout=15, what="three polls")
    starts = [p["at"] for p in telegram.polls[start:start + 3]]
    # Each empty long poll waits 1 s, then the adapter pauses 1 s before the next one.
    assert all(later - earlier >= 1.8 for earlier, later in zip(starts, starts[1:])), starts
    setup(channel_daemon, telegram)  # the default: no pause on top of the long poll
    start = len(telegram.polls)
    wait_for(lambda: len(telegram.polls) >= start + 3, timeout=15, what="three polls")
    starts = [p["at"] for p in telegram.polls[start:start + 3]]
    assert all(later - earlier < 1.8 for earlier, later in zip(starts[1:], starts[2:])), starts


def test_poll_interval_secs_pauses_between_get_updates_calls(channel_daemon, telegram):
    setup(channel_daemon, telegram, poll_interval_secs=1.5)
    wait_for(lambda: len(telegram.polls) >= 2, what="polling")
    said = time.time()
    telegram.user_says(531, "paced", username="ann")  # the long poll in flight returns it at once
    wait_for(lambda: telegram.replies_to(531), what="reply")
    wait_for(lambda: [p for p in telegram.polls if p["at"] > said], what="the next getUpdates")
    following = [p["at"] for p in telegram.polls if p["at"] > said]
    assert following[0] - said >= 1.4  # not at once: the pause came first
