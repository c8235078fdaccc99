"""Channels across daemon restarts: adapters stop on SIGTERM (audited), configured
sections start again on the next start, and long replies are split for IRC."""

from __future__ import annotations

import pytest

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, start_channel_daemon, wait_active
from fakes.servers import IrcUser, Ngircd
from support import Daemon, free_port


@pytest.fixture(scope="module")
def ircd(tmp_path_factory):
    server = Ngircd(tmp_path_factory.mktemp("ircd-life")).start()
    yield server
    server.stop()


def test_shutdown_stops_adapters_and_restart_brings_them_back(tmp_path, fake_llm, ircd):
    daemon = start_channel_daemon(tmp_path, fake_llm, env=CHANNEL_ENV)
    try:
        configure(daemon, "irc", server="127.0.0.1", port=ircd.port, nick="lifebot", send_interval_secs=0.05)
        configure(daemon, "webhook", listen_port=free_port(), callback_url="http://127.0.0.1:9/")
        wait_active(daemon, "irc")
        wait_active(daemon, "webhook")
        user = IrcUser(ircd.port, "frank")
        try:
            # A long reply is split into lines IRC accepts, all delivered in order.
            user.send("PRIVMSG lifebot :[[chunks:300]] go")
            expected = " ".join(f"w{i}" for i in range(1, 301))
            got: list[str] = []

            def collect(line: str) -> bool:
                if line.startswith(":lifebot!") and "PRIVMSG frank :" in line:
                    got.append(line.split("PRIVMSG frank :", 1)[1])
                return " ".join(got) == expected

            user.wait(collect, timeout=30)
            assert len(got) > 1 and all(len(part.encode()) <= 400 for part in got)
        finally:
            user.close()
        # The exit code is not asserted: under load the process has been seen to abort *after*
        # a clean shutdown ("terminate called without an active exception", a C++ library
        # loaded by the memory service); the audit entries below prove channels stopped cleanly.
        daemon.expect_crash("seen under load: an abort after the clean shutdown ('terminate called without "
                            "an active exception', a C++ library the memory service loads); the audit "
                            "entries checked below prove the channels stopped cleanly")
        daemon.stop()
        daemon = Daemon(daemon.home, port=daemon.port, env_extra=daemon.env_extra).start()
        stops = [e for e in audit(daemon, "channel.stop") if e["detail"]["reason"] == "shutdown"]
        assert sorted(e["subject"] for e in stops[:2]) == ["irc", "webhook"]
        assert audit(daemon, "kernel.shutdown")
        wait_active(daemon, "irc")
        wait_active(daemon, "webhook")
        assert channel(daemon, "irc")["configured"] is True
    finally:
        daemon.stop()
