"""Matrix adapter against a fake homeserver: /sync since-tokens (history not answered),
room send, typing, allow-lists by room and user. The shared checks (round trip, allow-list,
429, reconnect, stop, threads) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_fixtures import audit, channel_daemon, configure, wait_active, wait_for  # noqa: F401

ROOM = "!room1:test"


@pytest.fixture
def matrix(channel_daemon):
    yield from contract.serve(channel_daemon, contract.CASES["matrix"])


def setup(daemon, fake, **extra):
    configure(daemon, "matrix", access_token_env="MATRIX_ACCESS_TOKEN", homeserver_url=fake.url,
              long_poll_secs=1, default_agent="helper", **extra)
    wait_active(daemon, "matrix")
    wait_for(lambda: any(s["since"] for s in fake.syncs), what="initial sync done")


def test_room_message_round_trip_history_ignored(channel_daemon, matrix):
    matrix.user_says(ROOM, "@ann:test", "old message before the bot started")
    setup(channel_daemon, matrix)
    matrix.user_says(ROOM, "@ann:test", "hi matrix")
    wait_for(lambda: matrix.bot_messages(ROOM), what="reply")
    assert matrix.bot_messages(ROOM) == ["echo: hi matrix"]
    assert (ROOM, "@bot:test", True) in matrix.typing
    time.sleep(0.5)  # the bot's own message came back through /sync and was not answered
    assert matrix.bot_messages(ROOM) == ["echo: hi matrix"]


def test_allow_lists(channel_daemon, matrix):
    setup(channel_daemon, matrix, allowed_rooms=[ROOM], allowed_users=["@ann:test"])
    matrix.user_says("!other:test", "@ann:test", "wrong room")
    matrix.user_says(ROOM, "@eve:test", "wrong user")
    matrix.user_says(ROOM, "@ann:test", "right place")
    wait_for(lambda: matrix.bot_messages(ROOM), what="reply")
    assert matrix.bot_messages(ROOM) == ["echo: right place"] and matrix.bot_messages("!other:test") == []
    reasons = {e["detail"]["reason"] for e in audit(channel_daemon, "channel.refused", "matrix")[:2]}
    assert reasons == {"chat not in allowed_channels", "sender not in allowed_users"}



def refreshing_setup(daemon, fake, refresh_token):
    configure(daemon, "matrix", access_token_env="MATRIX_BOT_ACCESS", refresh_token_env="MATRIX_BOT_REFRESH",
              secrets={"access_token_env": fake.token, "refresh_token_env": refresh_token},
              homeserver_url=fake.url, long_poll_secs=1, default_agent="helper")
    wait_active(daemon, "matrix")
    wait_for(lambda: any(s["since"] for s in fake.syncs), what="initial sync done")


def secrets_env(daemon) -> dict[str, str]:
    lines = (daemon.home / "secrets.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


@pytest.fixture
def refreshing():
    from fakes.matrix import FakeMatrix

    fake = FakeMatrix("syt_short_lived", refresh_token="syr_first").start()
    yield fake
    fake.stop()


def test_expired_access_token_is_refreshed_and_the_new_pair_kept(channel_daemon, refreshing):
    try:
        refreshing_setup(channel_daemon, refreshing, "syr_first")
        refreshing.user_says(ROOM, "@ann:test", "before expiry")
        wait_for(lambda: refreshing.bot_messages(ROOM), what="first reply")
        refreshing.expire()
        refreshing.user_says(ROOM, "@ann:test", "after expiry")
        wait_for(lambda: len(refreshing.bot_messages(ROOM)) == 2, what="reply after the refresh")
        assert refreshing.bot_messages(ROOM) == ["echo: before expiry", "echo: after expiry"]
        assert [r["used"] for r in refreshing.refreshes] == ["syr_first"]
        stored = secrets_env(channel_daemon)
        assert stored["MATRIX_BOT_ACCESS"] == refreshing.token != "syt_short_lived"
        assert stored["MATRIX_BOT_REFRESH"] == refreshing.refresh_token != "syr_first"
        config = (channel_daemon.home / "config.toml").read_text()
        assert 'refresh_token_env = "MATRIX_BOT_REFRESH"' in config and refreshing.refresh_token not in config
        assert audit(channel_daemon, "channel.connection_error", "matrix") == []
        # A restart of the channel starts from the new pair, not the spent refresh token.
        assert channel_daemon.post("/api/channels/reload").status_code == 200
        configure(channel_daemon, "matrix", access_token_env="MATRIX_BOT_ACCESS",
                  refresh_token_env="MATRIX_BOT_REFRESH", homeserver_url=refreshing.url, long_poll_secs=1,
                  default_agent="helper", user_id="@bot:test")
        wait_active(channel_daemon, "matrix")
        refreshing.expire()
        refreshing.user_says(ROOM, "@ann:test", "after the restart")
        wait_for(lambda: len(refreshing.bot_messages(ROOM)) == 3, what="reply after a second refresh")
        assert len(refreshing.refreshes) == 2 and refreshing.refreshes[1]["used"] == stored["MATRIX_BOT_REFRESH"]
    finally:
        channel_daemon.delete("/api/channels/matrix/configure")


def test_a_refused_refresh_token_is_a_connection_error_naming_the_refresh(channel_daemon, refreshing):
    try:
        refreshing_setup(channel_daemon, refreshing, "syr_first")
        refreshing.refresh_token = "syr_someone_else"  # the homeserver no longer knows ours
        refreshing.expire()
        errors = wait_for(lambda: audit(channel_daemon, "channel.connection_error", "matrix"), what="error")
        assert errors[0]["detail"]["error"].startswith(
            "POST /_matrix/client/v3/refresh: HTTP 401 M_UNKNOWN_TOKEN (the refresh token was refused")
        assert refreshing.refreshes == []
        assert "syr_first" not in str(audit(channel_daemon))
    finally:
        channel_daemon.delete("/api/channels/matrix/configure")


def test_a_refresh_token_without_a_variable_name_is_stored_under_matrix_refresh_token(channel_daemon):
    try:
        response = channel_daemon.post("/api/channels/matrix/configure", json={
            "access_token_env": "MATRIX_ACCESS_TOKEN", "homeserver_url": "http://127.0.0.1:9",
            "secrets": {"refresh_token_env": "syr_named_by_default"}})
        assert response.status_code == 200, response.text
        assert response.json()["secrets_saved"] == ["MATRIX_REFRESH_TOKEN"]
        assert secrets_env(channel_daemon)["MATRIX_REFRESH_TOKEN"] == "syr_named_by_default"
        assert 'refresh_token_env = "MATRIX_REFRESH_TOKEN"' in (channel_daemon.home / "config.toml").read_text()
    finally:
        channel_daemon.delete("/api/channels/matrix/configure")
