"""Reddit adapter against a fake API: password-grant token, mention and reply-to-bot
round trips as threaded comments, old comments not answered, allow-list, 429,
reconnect, clean stop."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.reddit import BOT, CLIENT_ID, FakeReddit

CASE = contract.Case(
    name="reddit",
    config=lambda fake: {"api_url": fake.url, "auth_url": fake.url, "client_id": CLIENT_ID, "username": BOT,
                         "client_secret_env": "REDDIT_CLIENT_SECRET", "password_env": "REDDIT_PASSWORD",
                         "subreddits": ["agents"], "poll_interval_secs": 0.2},
    say=lambda fake, user, text: fake.user_says(user, f"u/{BOT} {text}"),
    replies=lambda fake, chat: fake.replies(chat))


@pytest.fixture
def fake(daemon):  # noqa: F811
    server = FakeReddit(contract.POLL_ENV["REDDIT_CLIENT_SECRET"], contract.POLL_ENV["REDDIT_PASSWORD"]).start()
    yield server
    daemon.delete("/api/channels/reddit/configure")
    server.stop()


def test_mention_and_follow_up_round_trip(daemon, fake):  # noqa: F811
    old = fake.user_says("ann", f"u/{BOT} an old question")
    asked = contract.round_trip(daemon, CASE, fake)
    assert fake.replies(old) == [] and len(fake.tokens) == 1
    fake.user_says("bob", "a comment about something else")
    follow_up = fake.user_says("ann", "and a follow-up", parent=fake.sent[0]["name"])  # no mention needed
    wait_for(lambda: fake.replies(follow_up), what="follow-up reply")
    time.sleep(0.5)
    assert fake.replies(follow_up) == ["echo: and a follow-up"] and len(fake.sent) == 2
    assert fake.sent[0]["parent_id"] == asked


def test_allow_list(daemon, fake):  # noqa: F811
    contract.refusal(daemon, CASE, fake)


def test_rate_limit(daemon, fake):  # noqa: F811
    contract.rate_limited(daemon, CASE, fake)


def test_reconnect_and_stop(daemon, fake):  # noqa: F811
    contract.reconnect_and_stop(daemon, CASE, fake)


def test_threads_end(fake):
    contract.threads_end(CASE, fake)
