"""Discord adapter against a fake Gateway v10 + REST API v10: IDENTIFY with the intents,
DMs and guild mentions answered (replies reference the message, 2000-character parts), own
and other bots' messages ignored, allow-lists by guild, RESUME after a dropped socket / op
7 / a missing heartbeat ACK (missed events replayed), a fresh IDENTIFY after op 9, the
test call, a bad token. The shared checks (round trip, allow-list, 429, reconnect, stop,
threads) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import audit, daemon  # noqa: F401 - module fixture
from channel_fixtures import channel, configure, wait_for
from fakes.discord import BOT, GUILD

TOKEN = contract.POLL_ENV["DISCORD_BOT_TOKEN"]
CASE = contract.CASES["discord"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_identify_dm_and_guild_mentions(daemon, fake):  # noqa: F811
    contract.round_trip(daemon, CASE, fake)
    identify = fake.identifies()[0]
    assert (identify["token"], identify["intents"]) == (TOKEN, 37376)
    assert set(identify["properties"]) == {"os", "browser", "device"}
    fake.user_says("bob", "plain chatter", channel="general")
    fake.user_says("helperbot", "I am a bot", channel="dm-helperbot", bot=True)
    fake.user_says("bob", "what's up?", channel="general", mention=True)
    wait_for(lambda: fake.replies("general"), what="guild reply")
    time.sleep(0.5)
    asked = next(m for m in fake.messages if m["content"].endswith("what's up?"))
    assert fake.replies("general") == ["echo: what's up?"]  # the mention is stripped, chatter ignored
    assert fake.sent[-1]["reference"] == asked["id"] and fake.sent[-1]["allowed_mentions"] == {"parse": []}
    assert fake.replies("dm-helperbot") == [] and "general" in fake.typing
    # The bot's own messages come back as MESSAGE_CREATE: never answered (one reply each).
    assert len([m for m in fake.messages if m["author"]["id"] == BOT["id"]]) == 2


def test_long_answers_are_split_at_2000_characters(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    words = " ".join(f"w{i:03d}" for i in range(450))  # 2249 characters
    fake.user_says("ann", words)
    wait_for(lambda: len(fake.replies("dm-ann")) == 2, what="two parts")
    parts = fake.replies("dm-ann")
    assert all(len(p) <= 2000 for p in parts) and " ".join(parts) == "echo: " + words


def test_allow_lists_by_guild(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake, allowed_guilds=["some-other-guild"])
    fake.user_says("bob", "not this guild", channel="general", mention=True)
    fake.user_says("bob", "a direct message", channel="dm-bob")
    wait_for(lambda: fake.replies("dm-bob"), what="dm reply")  # DMs are not subject to guild lists
    refused = wait_for(lambda: [e for e in audit(daemon, "channel.refused", "discord")
                                if e["detail"]["chat"] == "general"], what="guild refusal")
    assert refused[0]["detail"]["reason"] == "chat not in allowed_channels" and fake.replies("general") == []
    contract.setup(daemon, CASE, fake, allowed_guilds=[GUILD])
    fake.user_says("bob", "this guild", channel="general", mention=True)
    wait_for(lambda: fake.replies("general") == ["echo: this guild"], what="allowed guild reply")


def test_resume_replays_what_was_missed(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    wait_for(lambda: [f for _, f in fake.received if f.get("op") == 1 and isinstance(f.get("d"), int)],
             what="a heartbeat carrying the sequence number")
    session = list(fake.sessions)[-1]
    fake.drop_connections()  # the socket dies; a message arrives meanwhile
    fake.user_says("ann", "while you were away")
    wait_for(lambda: fake.replies("dm-ann") == ["echo: while you were away"], what="replayed message answered")
    path, resume = fake.resumes()[-1]
    assert (path, resume["token"], resume["session_id"]) == ("/resume", TOKEN, session)
    assert resume["seq"] >= 1 and len(fake.identifies()) == 1
    for trigger in (lambda: fake.send_op(7), lambda: setattr(fake, "ack", False)):
        before = len(fake.resumes())
        trigger()
        wait_for(lambda: len(fake.resumes()) > before, what="resume")
        fake.ack = True
    wait_for(lambda: channel(daemon, "discord")["active"], what="active again")
    assert len(fake.identifies()) == 1
    fake.send_op(9, False)  # session not resumable: identify afresh (after 1-5 s)
    wait_for(lambda: len(fake.identifies()) == 2, what="new identify", timeout=15)
    fake.user_says("ann", "new session")
    wait_for(lambda: "echo: new session" in fake.replies("dm-ann"), what="reply in the new session")


def test_test_call_and_bad_token(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake, default_channel_id="general")
    answer = daemon.post("/api/channels/discord/test", json={"message": "ping from agentd"})
    assert answer.status_code == 200 and answer.json()["status"] == "success"
    assert fake.sent[-1]["channel"] == "general" and fake.sent[-1]["content"] == "ping from agentd"
    result = configure(daemon, "discord", api_url=fake.url + "/api/v10", bot_token_env="DISCORD_OTHER_TOKEN")
    assert result["activated"] is False and channel(daemon, "discord")["active"] is False
    assert "HTTP 401" in audit(daemon, "channel.start_failed", "discord")[0]["detail"]["error"]


def test_disallowed_intents_stop_reconnecting(daemon, fake):  # noqa: F811
    fake.privileged_ok = False
    configure(daemon, "discord", default_agent="helper", **CASE.config(fake))
    error = wait_for(lambda: [e for e in audit(daemon, "channel.error", "discord")
                              if "4014" in e["detail"]["error"]], what="close 4014 reported")
    assert "disallowed intents" in error[0]["detail"]["error"]
    time.sleep(2.0)  # no reconnect loop: one IDENTIFY, never active
    assert len(fake.identifies()) == 1 and channel(daemon, "discord")["active"] is False
