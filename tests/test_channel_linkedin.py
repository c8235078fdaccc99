"""LinkedIn adapter against a fake of the organization messages REST API: a member's
message is answered in the same thread to that member, allow-list, 429, reconnect,
clean stop."""

from __future__ import annotations

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from fakes.linkedin import ORG, FakeLinkedIn

CASE = contract.Case(
    name="linkedin",
    config=lambda fake: {"api_url": fake.url, "access_token_env": "LINKEDIN_ACCESS_TOKEN",
                         "organization_id": ORG.rsplit(":", 1)[-1], "poll_interval_secs": 0.2},
    say=lambda fake, user, text: fake.user_says(user, text),
    replies=lambda fake, chat: fake.replies(chat),
    other_id="urn:li:person:mallory")


@pytest.fixture
def fake(daemon):  # noqa: F811
    server = FakeLinkedIn(contract.POLL_ENV["LINKEDIN_ACCESS_TOKEN"]).start()
    yield server
    daemon.delete("/api/channels/linkedin/configure")
    server.stop()


def test_member_message_round_trip(daemon, fake):  # noqa: F811
    thread = contract.round_trip(daemon, CASE, fake)
    reply = fake.sent[0]
    assert (reply["author"], reply["recipients"], reply["thread"]) == (ORG, ["urn:li:person:ann"], thread)


def test_allow_list(daemon, fake):  # noqa: F811
    contract.refusal(daemon, CASE, fake)


def test_rate_limit(daemon, fake):  # noqa: F811
    contract.rate_limited(daemon, CASE, fake)


def test_reconnect_and_stop(daemon, fake):  # noqa: F811
    contract.reconnect_and_stop(daemon, CASE, fake)


def test_threads_end(fake):
    contract.threads_end(CASE, fake)
