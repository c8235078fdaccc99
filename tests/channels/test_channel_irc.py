"""IRC adapter against a real ngircd: DM and addressed channel messages reach the agent
and its reply reaches the user, allow-list refusal, reconnect after a server restart,
clean stop."""

from __future__ import annotations

import threading

import pytest

from channel_fixtures import (audit, channel, channel_daemon, configure, remove, wait_active,  # noqa: F401
                              wait_for)
from fakes.servers import IrcUser, Ngircd


@pytest.fixture(scope="module")
def ircd(tmp_path_factory):
    server = Ngircd(tmp_path_factory.mktemp("ircd")).start()
    yield server
    server.stop()


def irc_config(ircd, **extra):
    return dict(server="127.0.0.1", port=ircd.port, nick="agentbot", channels=["#agents"],
                default_agent="helper", send_interval_secs=0.1, **extra)


def test_dm_and_channel_mention_are_answered(channel_daemon, ircd):
    configure(channel_daemon, "irc", **irc_config(ircd))
    wait_active(channel_daemon, "irc")
    alice = IrcUser(ircd.port, "alice")
    try:
        alice.send("PRIVMSG agentbot :hello there")
        line = alice.wait(lambda l: l.startswith(":agentbot!") and "PRIVMSG alice " in l)
        assert line.endswith("PRIVMSG alice :echo: hello there")

        alice.send("JOIN #agents")
        alice.wait(lambda l: " 366 " in l)  # end of NAMES: joined
        alice.send("PRIVMSG #agents :just chatting")  # not addressed: ignored
        alice.send("PRIVMSG #agents :agentbot: what is up?")
        line = alice.wait(lambda l: l.startswith(":agentbot!") and "PRIVMSG #agents " in l)
        assert line.endswith("PRIVMSG #agents :alice: echo: what is up?")
        assert not any("just chatting" in l for l in alice.lines if l.startswith(":agentbot!"))

        # The test endpoint sends a real message to the configured target (first channel).
        sent = channel_daemon.post("/api/channels/irc/test", json={"message": "test from agentd"})
        assert sent.status_code == 200 and sent.json()["status"] == "success"
        alice.wait(lambda l: l.startswith(":agentbot!") and l.endswith("PRIVMSG #agents :test from agentd"))

        inbound = audit(channel_daemon, "channel.inbound", "irc")
        assert [e["detail"]["conversation"] for e in inbound[:2]] == ["irc:chat:#agents:user:alice", "irc:dm:alice"]
        outbound = [e for e in audit(channel_daemon, "channel.outbound", "irc") if not e["detail"].get("test")]
        assert outbound[0]["detail"]["in_reply_to"] == inbound[0]["detail"]["message_id"]
        # Only ids go to the audit trail, never the text.
        assert "hello there" not in str(audit(channel_daemon))
    finally:
        alice.close()


def test_allowed_users_refusal_is_audited_not_answered(channel_daemon, ircd):
    configure(channel_daemon, "irc", **irc_config(ircd, allowed_users=["bob"]))
    wait_active(channel_daemon, "irc")
    mallory, bob = IrcUser(ircd.port, "mallory"), IrcUser(ircd.port, "bob")
    try:
        mallory.send("PRIVMSG agentbot :let me in")
        wait_for(lambda: [e for e in audit(channel_daemon, "channel.refused", "irc")
                          if e["detail"]["sender"] == "mallory"], what="refusal audited")
        bob.send("PRIVMSG agentbot :hi from bob")
        assert bob.wait(lambda l: "PRIVMSG bob " in l).endswith(":echo: hi from bob")
        with pytest.raises(AssertionError):
            mallory.wait(lambda l: l.startswith(":agentbot!") and "PRIVMSG mallory" in l, timeout=1.0)
    finally:
        mallory.close()
        bob.close()


def test_reconnects_after_server_restart_and_stops_cleanly(channel_daemon, ircd):
    configure(channel_daemon, "irc", **irc_config(ircd))
    wait_active(channel_daemon, "irc")
    ircd.restart()
    wait_for(lambda: audit(channel_daemon, "channel.reconnected", "irc"), what="reconnect audited")
    wait_active(channel_daemon, "irc")
    carol = IrcUser(ircd.port, "carol")
    try:
        carol.send("PRIVMSG agentbot :after restart")
        assert carol.wait(lambda l: "PRIVMSG carol " in l).endswith(":echo: after restart")
        carol.send("JOIN #agents")
        carol.wait(lambda l: " 366 " in l)
        remove(channel_daemon, "irc")
        # The bot leaves with a QUIT the server relays to the channel.
        carol.wait(lambda l: l.startswith(":agentbot!") and " QUIT " in l)
        item = channel(channel_daemon, "irc")
        assert (item["configured"], item["active"]) == (False, False)
        assert audit(channel_daemon, "channel.stop", "irc")[0]["detail"]["reason"] == "removed"
    finally:
        carol.close()


def test_adapter_threads_end_on_stop(ircd):
    """In-process: the real adapter against ngircd leaves no thread behind after stop()."""
    from agentd.channels.adapter import ChannelContext
    from agentd.channels.adapters.irc import IrcAdapter

    got = []
    ctx = ChannelContext("irc", "127.0.0.1", deliver=got.append, audit=lambda *a: None,
                         load_state=dict, save_state=lambda s: None)
    adapter = IrcAdapter(ctx, {"server": "127.0.0.1", "port": ircd.port, "nick": "threadbot",
                               "channels": [], "use_tls": False})
    adapter.start()
    wait_for(adapter.health, what="registered")
    user = IrcUser(ircd.port, "dave")
    try:
        user.send("PRIVMSG threadbot :ping me")
        wait_for(lambda: got, what="inbound message")
        assert (got[0].sender_id, got[0].text, got[0].conversation.key) == ("dave", "ping me", "irc:dm:dave")
    finally:
        user.close()
    adapter.stop()
    assert adapter.threads_alive() == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("channel-irc")]


def test_tls_connection(channel_daemon, tmp_path):
    """use_tls: the adapter talks to ngircd's TLS port (self-signed: tls_verify = false)."""
    server = Ngircd(tmp_path / "tls", tls=True).start()
    try:
        configure(channel_daemon, "irc", server="127.0.0.1", port=server.tls_port, nick="tlsbot",
                  use_tls=True, tls_verify=False, default_agent="helper", send_interval_secs=0.1)
        wait_active(channel_daemon, "irc")
        user = IrcUser(server.port, "erin")  # the user connects in plain text; the server relays
        try:
            user.send("PRIVMSG tlsbot :over tls")
            assert user.wait(lambda l: "PRIVMSG erin " in l).endswith(":echo: over tls")
        finally:
            user.close()
        # With verification on, the self-signed certificate is refused: never active.
        configure(channel_daemon, "irc", server="127.0.0.1", port=server.tls_port, nick="tlsbot",
                  use_tls=True, default_agent="helper")
        wait_for(lambda: [e for e in audit(channel_daemon, "channel.connection_error", "irc")
                          if "CERTIFICATE_VERIFY_FAILED" in e["detail"]["error"]], what="verify failure")
        assert channel(channel_daemon, "irc")["active"] is False
    finally:
        remove(channel_daemon, "irc")
        server.stop()
