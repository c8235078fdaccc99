"""XMPP adapter (slixmpp on its own event loop) against a real prosody: direct chat over
STARTTLS with typing, a MUC room where only messages addressed to the bot are answered,
allow-list, reconnect after the server restarts, clean stop, plain-text mode."""

from __future__ import annotations

import threading
import time

import pytest

import channel_contract as contract
from channel_contract import POLL_ENV, audit, daemon  # noqa: F401 - module fixture
from channel_fixtures import channel, configure, remove, wait_active, wait_for
from fakes.xmpp import DOMAIN, MUC, Prosody, XmppUser

BOT = f"agentbot@{DOMAIN}"
ROOM = f"lobby@{MUC}"


@pytest.fixture(scope="module")
def prosody():
    server = Prosody()
    server.register("agentbot", POLL_ENV["XMPP_PASSWORD"])
    for user in ("ann", "mallory", "bob"):
        server.register(user, "pw")
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def users(prosody):
    made: dict[str, XmppUser] = {}

    def get(name: str) -> XmppUser:
        if name not in made:
            made[name] = XmppUser(prosody, name, "pw")
        return made[name]

    yield get
    for user in made.values():
        user.close()


def config(prosody, **extra):
    return dict(jid=BOT, password_env="XMPP_PASSWORD", server="127.0.0.1", port=prosody.port, rooms=[ROOM],
                nickname="agentbot", tls_verify=False, default_agent="helper", **extra)


def test_direct_chat_reactions(daemon, prosody, users):  # noqa: F811
    """lifecycle_reactions as XEP-0444 reactions: 👀 when taken, then the set becomes ✅."""
    configure(daemon, "xmpp", **config(prosody, overrides={"lifecycle_reactions": True}))
    wait_active(daemon, "xmpp")
    ann = users("ann")
    said = ann.say(BOT, "react please")
    wait_for(lambda: ann.bodies(BOT), what="direct reply")
    wait_for(lambda: [r for r in ann.reactions if r[1] == said and r[2] == {"✅"}], what="✅",
             explain=lambda: ann.reactions)
    assert [r[2] for r in ann.reactions if r[1] == said] == [{"👀"}, {"✅"}]
    assert all(r[0] == BOT for r in ann.reactions)


def test_direct_and_room_round_trip(daemon, prosody, users):  # noqa: F811
    configure(daemon, "xmpp", **config(prosody))
    wait_active(daemon, "xmpp")
    ann = users("ann")
    ann.say(BOT, "hello xmpp")
    wait_for(lambda: ann.bodies(BOT), what="direct reply")
    assert ann.bodies(BOT) == ["echo: hello xmpp"]
    assert (BOT, "composing") in ann.states
    bob = users("bob")
    bob.join(ROOM, "bob")
    bob.say(ROOM, "chatter for everyone", mtype="groupchat")
    bob.say(ROOM, "agentbot: what is new?", mtype="groupchat")
    wait_for(lambda: bob.bodies(f"{ROOM}/agentbot"), what="room reply")
    time.sleep(0.5)
    assert bob.bodies(f"{ROOM}/agentbot") == ["bob: echo: what is new?"]
    inbound = audit(daemon, "channel.inbound", "xmpp")
    assert inbound[0]["detail"]["conversation"].startswith(f"xmpp:chat:{ROOM}:user:")  # a session per sender
    assert inbound[1]["detail"]["conversation"] == f"xmpp:dm:ann@{DOMAIN}"


def test_allow_list(daemon, prosody, users):  # noqa: F811
    configure(daemon, "xmpp", **config(prosody, allowed_users=[f"ann@{DOMAIN}"]))
    wait_active(daemon, "xmpp")
    mallory, ann = users("mallory"), users("ann")
    mallory.say(BOT, "let me in")
    ann.say(BOT, "member here")
    wait_for(lambda: ann.bodies(BOT), what="reply to ann")
    refused = wait_for(lambda: audit(daemon, "channel.refused", "xmpp"), what="refusal")
    assert refused[0]["detail"]["sender"] == f"mallory@{DOMAIN}" and mallory.bodies(BOT) == []


def test_reconnect_and_stop(daemon, prosody, users):  # noqa: F811
    configure(daemon, "xmpp", **config(prosody))
    wait_active(daemon, "xmpp")
    prosody.restart()
    wait_for(lambda: audit(daemon, "channel.reconnected", "xmpp"), timeout=20, what="reconnect")
    wait_active(daemon, "xmpp")
    ann = users("ann")
    ann.say(BOT, "after restart")
    wait_for(lambda: ann.bodies(BOT), what="reply after restart")
    assert ann.bodies(BOT) == ["echo: after restart"]
    remove(daemon, "xmpp")
    assert channel(daemon, "xmpp")["active"] is False
    ann.say(BOT, "anyone?")
    time.sleep(1.0)
    assert ann.bodies(BOT) == ["echo: after restart"]


def test_plain_text_mode_and_threads_end(prosody, users):
    case = contract.Case("xmpp", config=lambda _: config(prosody, use_tls=False), say=None, replies=None)  # type: ignore[arg-type]
    for adapter, got in contract.in_process(case, prosody):
        adapter.start()
        wait_for(adapter.health, what="logged in")
        users("ann").say(BOT, "plain hello")
        wait_for(lambda: got, what="inbound")
        assert (got[0].sender_id, got[0].text, got[0].conversation.key) == (f"ann@{DOMAIN}", "plain hello",
                                                                              f"xmpp:dm:ann@{DOMAIN}")
        adapter.stop()
        assert adapter.threads_alive() == 0
        assert not [t for t in threading.enumerate() if t.name.startswith("channel-xmpp-") and t.is_alive()]
