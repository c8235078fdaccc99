"""Telegram adapter against a fake Bot API: long-poll round trip with typing, per-user
sessions, allow-list refusal, 429 retried after retry_after, reconnect, clean stop."""

from __future__ import annotations

import time

import pytest

from channel_fixtures import (CHANNEL_ENV, audit, channel, channel_daemon, configure, remove,  # noqa: F401
                              wait_active, wait_for)
from fakes.telegram import FakeTelegram


@pytest.fixture
def telegram(channel_daemon):
    fake = FakeTelegram(CHANNEL_ENV["TELEGRAM_BOT_TOKEN"]).start()
    yield fake
    channel_daemon.delete("/api/channels/telegram/configure")
    fake.stop()


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


def test_allow_list_refusal(channel_daemon, telegram):
    setup(channel_daemon, telegram, allowed_users=["ann"])
    telegram.user_says(601, "intruder", username="mallory")
    telegram.user_says(602, "member", username="ann")  # allowed by username
    wait_for(lambda: telegram.replies_to(602), what="reply to ann")
    refused = [e for e in audit(channel_daemon, "channel.refused", "telegram") if e["detail"]["sender"] == "601"]
    assert refused and telegram.replies_to(601) == []


def test_rate_limited_send_is_retried(channel_daemon, telegram):
    setup(channel_daemon, telegram)
    telegram.throttle = [1]
    telegram.user_says(701, "throttled")
    asked = time.time()
    wait_for(lambda: telegram.replies_to(701), what="reply after 429")
    assert telegram.replies_to(701) == ["echo: throttled"] and telegram.throttle == []
    assert telegram.sent[-1]["at"] - asked >= 1.0  # waited retry_after before trying again


def test_reconnect_and_clean_stop(channel_daemon, telegram):
    setup(channel_daemon, telegram)
    telegram.restart()
    wait_for(lambda: audit(channel_daemon, "channel.reconnected", "telegram"), what="reconnect")
    telegram.user_says(801, "after restart")
    wait_for(lambda: telegram.replies_to(801), what="reply after restart")
    remove(channel_daemon, "telegram")
    assert channel(channel_daemon, "telegram")["active"] is False
    time.sleep(1.5)  # a poll in flight when stop() ran has ended by now
    polls = len(telegram.polls)
    time.sleep(1.5)
    assert len(telegram.polls) == polls  # nothing polls any more
    assert audit(channel_daemon, "channel.stop", "telegram")[0]["detail"]["reason"] == "removed"
