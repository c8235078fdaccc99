"""Gitter adapter (Matrix client-server API on Gitter's homeserver, since Gitter's own API
was shut down in 2023) against a fake gitter.im front (discovery) and a fake homeserver:
discovery, join, room messages answered in the configured room only, alias room ids,
legacy Gitter ids refused with a clear error, the test message. The shared checks (round
trip, allow-list, 429, reconnect, stop, threads) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import channel, configure, wait_active, wait_for
from fakes.gitter import ALIAS, ROOM


CASE = contract.CASES["gitter"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_room_round_trip_through_discovery(daemon, fake):  # noqa: F811
    fake.user_says(ROOM, "@ann:gitter.im", "history from before the bot started")
    contract.setup(daemon, CASE, fake)  # returns once the initial sync is done
    assert fake.joins == [ROOM] and len(fake.front.asked) == 1
    assert "Authorization" not in fake.front.asked[0]  # the token only goes to the homeserver
    fake.user_says("!elsewhere:gitter.im", "@ann:gitter.im", "another room the account is in")
    fake.user_says(ROOM, "@ann:gitter.im", "hello gitter")
    wait_for(lambda: fake.bot_messages(ROOM), what="reply")
    time.sleep(0.5)
    assert fake.bot_messages(ROOM) == ["echo: hello gitter"] and fake.bot_messages("!elsewhere:gitter.im") == []


def test_room_alias_is_resolved(daemon, fake):  # noqa: F811
    configure(daemon, "gitter", default_agent="helper", **{**CASE.config(fake), "room_id": ALIAS})
    wait_active(daemon, "gitter")
    assert fake.joins == [ROOM]


def test_legacy_gitter_room_id_is_refused_with_the_reason(daemon, fake):  # noqa: F811
    configure(daemon, "gitter", default_agent="helper", **{**CASE.config(fake), "room_id": "5f1b2c3d4e5f6a7b8c9d0e1f"})
    failed = wait_for(lambda: contract.audit(daemon, "channel.start_failed", "gitter"), what="start failure")
    assert "legacy Gitter id" in failed[0]["detail"]["error"]
    assert channel(daemon, "gitter")["active"] is False


def test_test_message_goes_to_the_room(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    answer = daemon.post("/api/channels/gitter/test", json={"message": "ping"})
    assert answer.status_code == 200, answer.text
    assert fake.bot_messages(ROOM) == ["ping"]
