"""Twitch adapter against a real ngircd standing in for Twitch's IRC gateway (which is
plain IRC): the server requires the `oauth:` password, the bot joins the channel and
answers "@bot ..." mentions (IRCv3 tags stripped) as "@user: ...", allow-list,
reconnect after the server restarts, clean stop."""

from __future__ import annotations

import threading

import pytest

from channel_contract import POLL_ENV, audit, daemon, in_process  # noqa: F401 - module fixture
from channel_fixtures import channel, configure, remove, wait_active, wait_for
from fakes.servers import IrcUser, Ngircd

TOKEN = POLL_ENV["TWITCH_OAUTH_TOKEN"]


class TwitchGateway(Ngircd):
    """ngircd with a server password: only `PASS oauth:<token>` gets in, as on Twitch."""

    def __init__(self, root) -> None:  # type: ignore[no-untyped-def]
        super().__init__(root)
        conf = self.root / "ngircd.conf"
        conf.write_text(conf.read_text().replace("[Global]\n", f"[Global]\nPassword = oauth:{TOKEN}\n"))


class Viewer(IrcUser):
    def __init__(self, port: int, nick: str) -> None:  # noqa: D107 - PASS must come before NICK/USER
        import socket
        self.nick, self.buffer, self.lines = nick, b"", []
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        for line in (f"PASS oauth:{TOKEN}", f"NICK {nick}", f"USER {nick} 0 * :viewer"):
            self.send(line)
        self.wait(lambda line: " 001 " in line)
        self.send("JOIN #streamer")
        self.wait(lambda line: " 366 " in line)


def bot_joined(viewer: Viewer) -> None:
    def joined() -> bool:
        viewer.send("NAMES #streamer")
        return "agentbot" in viewer.wait(lambda l: " 353 " in l)
    wait_for(joined, what="the bot in #streamer")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    server = TwitchGateway(tmp_path_factory.mktemp("twitch")).start()
    yield server
    server.stop()


def config(gateway, **extra):
    return dict(server="127.0.0.1", port=gateway.port, nick="AgentBot", channels=["Streamer"],
                oauth_token_env="TWITCH_OAUTH_TOKEN", send_interval_secs=0.1, default_agent="helper", **extra)


def test_mention_round_trip_and_allow_list(daemon, gateway):  # noqa: F811
    configure(daemon, "twitch", **config(gateway, allowed_users=["ann"]))
    wait_active(daemon, "twitch")
    ann, mallory = Viewer(gateway.port, "ann"), Viewer(gateway.port, "mallory")
    try:
        bot_joined(ann)
        ann.send("PRIVMSG #streamer :just chatting")
        mallory.send("PRIVMSG #streamer :@agentbot let me in")
        ann.send("PRIVMSG #streamer :@AgentBot what is the schedule?")
        line = ann.wait(lambda l: l.startswith(":agentbot!") and "PRIVMSG #streamer " in l)
        assert line.endswith("PRIVMSG #streamer :@ann: echo: what is the schedule?")
        refused = wait_for(lambda: audit(daemon, "channel.refused", "twitch"), what="refusal")
        assert refused[0]["detail"]["sender"] == "mallory"
        assert not any("just chatting" in l or "let me in" in l for l in ann.lines if l.startswith(":agentbot!"))
        # A long answer goes as IRC lines of at most 400 UTF-8 bytes, whole characters each.
        ann.send("PRIVMSG #streamer :@AgentBot " + "✅" * 140)
        got = [ann.wait(lambda l: l.startswith(":agentbot!") and "✅" in l).split(" :", 1)[1] for _ in range(2)]
        assert got == ["@ann: " + "✅" * 131, "@ann: " + "✅" * 9]
    finally:
        ann.close()
        mallory.close()


def test_reconnect_and_stop(daemon, gateway):  # noqa: F811
    configure(daemon, "twitch", **config(gateway))
    wait_active(daemon, "twitch")
    gateway.restart()
    wait_for(lambda: audit(daemon, "channel.reconnected", "twitch"), what="reconnect")
    wait_active(daemon, "twitch")
    bob = Viewer(gateway.port, "bob")
    try:
        bot_joined(bob)
        bob.send("PRIVMSG #streamer :@agentbot back again?")
        assert bob.wait(lambda l: l.startswith(":agentbot!")).endswith(":@bob: echo: back again?")
        remove(daemon, "twitch")
        bob.wait(lambda l: l.startswith(":agentbot!") and " QUIT " in l)
        assert channel(daemon, "twitch")["active"] is False
    finally:
        bob.close()


def test_wrong_token_is_refused_by_the_gateway_and_threads_end(gateway, monkeypatch):
    from channel_contract import Case

    case = Case("twitch", config=lambda _: config(gateway), say=None, replies=None)  # type: ignore[arg-type]
    for adapter, _ in in_process(case, gateway):
        adapter.password = "oauth:wrong"
        adapter.start()
        wait_for(lambda: adapter.backoff.attempt > 0, what="login refused")
        assert not adapter.health()
        adapter.stop()
        assert adapter.threads_alive() == 0
        assert not [t for t in threading.enumerate() if t.name.startswith("channel-twitch-") and t.is_alive()]
