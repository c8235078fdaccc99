"""Signal adapter against a fake signal-cli REST API: direct and group round trips,
typing, allow-list, 429, reconnect, clean stop."""

from __future__ import annotations

import base64

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.signal import BOT, NUMBERS, FakeSignal

CASE = contract.Case(
    name="signal",
    config=lambda fake: {"api_url": fake.url, "phone_number": BOT, "poll_interval_secs": 0.1},
    say=lambda fake, user, text: fake.user_says(user, text),
    replies=lambda fake, chat: fake.replies(chat),
    user=NUMBERS["ann"], other="mallory", other_id=NUMBERS["mallory"])


@pytest.fixture
def fake(daemon):  # noqa: F811
    server = FakeSignal().start()
    yield server
    daemon.delete("/api/channels/signal/configure")
    server.stop()


def test_direct_and_group_round_trip(daemon, fake):  # noqa: F811
    contract.round_trip(daemon, CASE, fake)
    assert NUMBERS["ann"] in fake.typing
    fake.user_says("bob", "in the group", group="grp-internal-1")
    group = "group." + base64.b64encode(b"grp-internal-1").decode()
    wait_for(lambda: fake.replies(group), what="group reply")
    assert fake.replies(group) == ["echo: in the group"]
    assert fake.sent[-1]["number"] == BOT


def test_allow_list(daemon, fake):  # noqa: F811
    contract.refusal(daemon, CASE, fake)


def test_rate_limit(daemon, fake):  # noqa: F811
    contract.rate_limited(daemon, CASE, fake)


def test_reconnect_and_stop(daemon, fake):  # noqa: F811
    contract.reconnect_and_stop(daemon, CASE, fake)


def test_threads_end(fake):
    contract.threads_end(CASE, fake)
