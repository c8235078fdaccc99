"""Mumble adapter against a real murmurd over TLS: private messages and channel
messages addressed to the bot are answered (HTML escaped), allow-list, a rejected
login, reconnect after the server restarts, clean stop."""

from __future__ import annotations

import threading
import time

import pytest

import channel_contract as contract
from channel_contract import audit, daemon  # noqa: F401 - module fixture
from channel_fixtures import channel, configure, remove, wait_active, wait_for
from fakes.mumble import MumbleUser, Murmur


@pytest.fixture(scope="module")
def murmur():
    server = Murmur().start()
    yield server
    server.cleanup()


def config(murmur, username="agentbot", **extra):
    return dict(host="127.0.0.1", port=murmur.port, username=username, default_agent="helper", **extra)


def test_private_and_channel_round_trip(daemon, murmur):  # noqa: F811
    configure(daemon, "mumble", **config(murmur, channel="Root"))
    wait_active(daemon, "mumble")
    ann = MumbleUser(murmur.port, "ann")
    try:
        wait_for(lambda: "agentbot" in ann.users.values(), what="bot visible")
        ann.tell("agentbot", "hello <b>mumble</b> & co")
        wait_for(lambda: ann.from_user("agentbot"), what="private reply",
                 explain=lambda: (ann.ended, ann.texts, ann.users, audit(daemon, subject="mumble")[:8]))
        assert ann.from_user("agentbot", private=True) == ["echo: hello mumble &amp; co"]
        ann.say_in_channel("just chatting")
        ann.say_in_channel("agentbot: what is new?")
        wait_for(lambda: ann.from_user("agentbot", private=False), what="channel reply")
        time.sleep(0.5)
        assert ann.from_user("agentbot", private=False) == ["ann: echo: what is new?"]
        assert audit(daemon, "channel.inbound", "mumble")[0]["detail"]["conversation"] == "mumble:chat:Root:user:ann"
    finally:
        ann.close()


def test_allow_list(daemon, murmur):  # noqa: F811
    configure(daemon, "mumble", **config(murmur, allowed_users=["bob"]))
    wait_active(daemon, "mumble")
    mallory, bob = MumbleUser(murmur.port, "mallory"), MumbleUser(murmur.port, "bob")
    try:
        wait_for(lambda: "agentbot" in bob.users.values() and "agentbot" in mallory.users.values(), what="bot")
        mallory.tell("agentbot", "let me in")
        bob.tell("agentbot", "hi from bob")
        wait_for(lambda: bob.from_user("agentbot"), what="reply to bob")
        refused = wait_for(lambda: audit(daemon, "channel.refused", "mumble"), what="refusal")
        assert refused[0]["detail"]["sender"] == "mallory" and mallory.from_user("agentbot") == []
    finally:
        mallory.close()
        bob.close()


def test_reconnect_and_stop(daemon, murmur):  # noqa: F811
    configure(daemon, "mumble", **config(murmur, ping_secs=1))
    wait_active(daemon, "mumble")
    murmur.restart()
    wait_for(lambda: audit(daemon, "channel.reconnected", "mumble"), timeout=20, what="reconnect")
    carol = MumbleUser(murmur.port, "carol")
    try:
        wait_for(lambda: "agentbot" in carol.users.values(), what="bot back")
        carol.tell("agentbot", "after restart")
        wait_for(lambda: carol.from_user("agentbot"), what="reply after restart")
        assert carol.from_user("agentbot") == ["echo: after restart"]
        remove(daemon, "mumble")
        wait_for(lambda: "agentbot" not in carol.users.values(), what="the bot left the server")
        assert channel(daemon, "mumble")["active"] is False
    finally:
        carol.close()


def test_rejected_login_and_threads_end(murmur):
    # The server's username rule refuses "!": the login is rejected, audited, retried with backoff.
    case = contract.Case("mumble", config=lambda _: config(murmur, username="bad!name"),
                         say=None, replies=None)  # type: ignore[arg-type]
    audits: list = []
    for adapter, _ in contract.in_process(case, murmur):
        adapter.ctx._audit = lambda event, name, detail: audits.append((event, detail))
        adapter.start()
        wait_for(lambda: audits, what="rejection audited")
        assert audits[0][0] == "channel.connection_error" and "invalid username" in audits[0][1]["error"]
        assert not adapter.health()
        adapter.stop()
        assert adapter.threads_alive() == 0
        assert not [t for t in threading.enumerate() if t.name.startswith("channel-mumble-") and t.is_alive()]
