"""Discourse adapter against a fake forum: mention and category round trips (reply to
the post number), old posts not answered, allow-list, 429, reconnect, clean stop."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.discourse import BOT, FakeDiscourse

CASE = contract.Case(
    name="discourse",
    config=lambda fake: {"base_url": fake.url, "api_key_env": "DISCOURSE_API_KEY", "api_username": BOT,
                         "poll_interval_secs": 0.2},
    say=lambda fake, user, text: fake.user_says(user, f"@{BOT} {text}"),
    replies=lambda fake, chat: fake.replies(chat))


@pytest.fixture
def fake(daemon):  # noqa: F811
    server = FakeDiscourse(contract.POLL_ENV["DISCOURSE_API_KEY"]).start()
    yield server
    daemon.delete("/api/channels/discourse/configure")
    server.stop()


def test_mention_and_category_round_trip(daemon, fake):  # noqa: F811
    old = fake.user_says("ann", f"@{BOT} from before the bot started")
    topic = contract.round_trip(daemon, CASE, fake)
    assert fake.sent[0]["reply_to_post_number"] == 1 and fake.replies(old) == []
    contract.setup(daemon, CASE, fake, categories=["support"])
    fake.user_says("bob", "no mention in the lounge")
    support = fake.user_says("bob", "a question in support", category=4)
    wait_for(lambda: fake.replies(support), what="category reply")
    time.sleep(0.5)
    assert fake.replies(support) == ["echo: a question in support"]
    assert len(fake.sent) == 2 and fake.replies(topic) == ["echo: hello discourse"]


def test_allow_list(daemon, fake):  # noqa: F811
    contract.refusal(daemon, CASE, fake)


def test_rate_limit(daemon, fake):  # noqa: F811
    contract.rate_limited(daemon, CASE, fake)


def test_reconnect_and_stop(daemon, fake):  # noqa: F811
    contract.reconnect_and_stop(daemon, CASE, fake)


def test_threads_end(fake):
    contract.threads_end(CASE, fake)
