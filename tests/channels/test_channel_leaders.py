"""Which daemon runs a channel's adapter (agentd/channels/leaders.py): two daemons'
clusters on one store, each with its channels, taking the adapter's lease in turn."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from agentd.channels.leaders import ChannelLeaders
from agentd.cluster.config import ClusterSettings
from agentd.cluster.coordinator import Cluster
from agentd.store import leases as leases_module
from agentd.store import open_store
from agentd.store.outage import DatabaseUnavailable, Outage


class Channels:
    """The part of ChannelManager the leaders drive: its sections, running adapters and
    `_start` (which asks `may_run` first, as the manager does) and `_stop`."""

    def __init__(self, fail: bool | str = False) -> None:
        self._lock = threading.Lock()
        self.sections = {"ntfy": {"topic": "t"}}
        self.running: dict[str, object] = {}
        self.starts: list[str] = []
        self.stops: list[tuple[str, str]] = []
        self.audits: list[tuple] = []
        self.fail = fail

    def _start(self, name: str) -> bool:
        if self.fail == "raise":  # as loading an adapter's module can, before it asks
            raise ImportError("no module named 'nio'")
        if not self.may_run(name):
            return False
        self.starts.append(name)
        if self.fail:
            self.on_stopped(name)
            return False
        self.running[name] = object()
        return True

    def _stop(self, name: str, reason: str) -> None:
        self.stops.append((name, reason))
        self.running.pop(name, None)
        self.on_stopped(name)

    def audit(self, *entry: object) -> None:
        self.audits.append(entry)


@pytest.fixture()
def store(tmp_path: Path):
    s = open_store(tmp_path / "agentd.db")
    yield s
    s.close()


LEASE = 2.0  # long enough that a busy host's pause between two steps does not span it


def daemon(store, name: str, channels: Channels) -> tuple[Cluster, ChannelLeaders]:
    cluster = Cluster(store, ClusterSettings(name, lease_secs=LEASE), f"x:{name}", shared=True)
    return cluster, ChannelLeaders(cluster, channels)


def test_a_lease_kept_after_a_database_outage_is_taken_at_a_later_heartbeat(store, monkeypatch, caplog) -> None:
    """B led the channel and was cut off by the outage as A was: for one lease after the
    database's return its lapsed lease is still B's. A waits, without counting that as a
    failed start, and takes the adapter over at the first heartbeat after."""
    outage = Outage()
    monkeypatch.setattr(leases_module, "OUTAGE", outage)
    channels_a, channels_b = Channels(), Channels()
    a, leaders_a = daemon(store, "A", channels_a)
    b, _ = daemon(store, "B", channels_b)
    assert channels_b._start("ntfy") and leaders_a.view() == {"ntfy": "B"}
    outage.noticed(DatabaseUnavailable("gone"))
    time.sleep(LEASE + 0.2)  # B's lease runs out while nobody reaches the database
    outage.cleared(wrote=True)

    a.tick()  # the heartbeat: leases renewed, then the leaders' turn
    assert (channels_a.starts, channels_a.running, leaders_a.view()) == ([], {}, {"ntfy": None})
    time.sleep(LEASE + 0.05)  # B had a whole lease since the return and renewed nothing
    a.tick()
    assert (channels_a.starts, list(channels_a.running), leaders_a.view()) == (["ntfy"], ["ntfy"], {"ntfy": "A"})
    assert channels_a.audits == [("channel.leader", "ntfy", {"daemon_id": "A"})]
    b.tick()  # B, back, finds its lease taken and stops its adapter
    assert (channels_b.running, channels_b.stops) == ({}, [("ntfy", "leader lease lost")])
    assert "channel ntfy: leader lease lost; stopping it here" in [r.getMessage() for r in caplog.records]


def test_each_adapter_has_its_leader_and_standbys_say_who_it_is(store, caplog) -> None:
    caplog.set_level(logging.INFO, "agentd.channels.leader")
    channels_a, channels_b = Channels(), Channels()
    channels_a.sections = channels_b.sections = {"ntfy": {}, "telegram": {}}
    a, leaders_a = daemon(store, "A", channels_a)
    b, leaders_b = daemon(store, "B", channels_b)
    assert channels_b._start("ntfy")  # B leads ntfy; telegram is free
    a.tick()
    assert (channels_a.starts, sorted(channels_a.running), leaders_a.view()) == (
        ["telegram"], ["telegram"], {"ntfy": "B", "telegram": "A"})
    assert (leaders_a.holder("ntfy"), leaders_a.holder("telegram")) == ("B", "A")
    a.tick()  # what runs here under its own lease keeps running
    assert (channels_a.starts, channels_a.stops, sorted(channels_a.running)) == (["telegram"], [], ["telegram"])
    assert channels_a._start("ntfy") is False and channels_a.starts == ["telegram"]
    assert [r.getMessage() for r in caplog.records] == [
        "channel telegram: took over as leader on daemon A",
        "channel ntfy runs on daemon B; this daemon is on standby"]


def test_an_adapter_that_failed_to_start_is_not_tried_again_for_a_minute(store) -> None:
    channels = Channels(fail=True)
    cluster, leaders = daemon(store, "A", channels)
    cluster.tick()
    cluster.tick()
    assert (channels.starts, channels.running, cluster.holds("channel:ntfy"), leaders.view()) == (
        ["ntfy"], {}, False, {"ntfy": None})


def test_a_start_that_raises_leaves_the_lease_free(store) -> None:
    channels = Channels(fail="raise")
    cluster, leaders = daemon(store, "A", channels)
    with pytest.raises(ImportError):
        leaders.tick()
    assert (cluster.holds("channel:ntfy"), leaders.view()) == (False, {"ntfy": None})
