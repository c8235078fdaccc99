"""LinkedIn adapter against a fake of the organization messages REST API: a member's
message is answered in the same thread to that member. The shared checks (round trip,
allow-list, 429, reconnect, stop, threads) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from fakes.linkedin import ORG

CASE = contract.CASES["linkedin"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_member_message_round_trip(daemon, fake):  # noqa: F811
    thread = contract.round_trip(daemon, CASE, fake)
    reply = fake.sent[0]
    assert (reply["author"], reply["recipients"], reply["thread"]) == (ORG, ["urn:li:person:ann"], thread)
