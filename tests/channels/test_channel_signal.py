"""Signal adapter against a fake signal-cli REST API: direct and group round trips,
typing. The shared checks (round trip, allow-list, 429, reconnect, stop, threads) run in
tests/channels/test_channel_contract.py."""

from __future__ import annotations

import base64

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for
from fakes.signal import BOT, NUMBERS

CASE = contract.CASES["signal"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_direct_and_group_round_trip(daemon, fake):  # noqa: F811
    contract.round_trip(daemon, CASE, fake)
    assert NUMBERS["ann"] in fake.typing
    fake.user_says("bob", "in the group", group="grp-internal-1")
    group = "group." + base64.b64encode(b"grp-internal-1").decode()
    wait_for(lambda: fake.replies(group), what="group reply")
    assert fake.replies(group) == ["echo: in the group"]
    assert fake.sent[-1]["number"] == BOT
