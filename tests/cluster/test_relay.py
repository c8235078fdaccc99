"""The pieces of webhook relaying between daemons (agentd/cluster/relay.py), on one SQLite
file shared by two clusters as if it were PostgreSQL: `[cluster] advertise_url` and its
derived default, each daemon's URL in `cluster_daemons`, one peer secret for all members,
and which relayed requests a daemon accepts. tests/cluster/test_webhook_relay.py runs the
whole path with two real daemons."""

from __future__ import annotations

import socket
import time

import pytest

from agentd.cluster import Cluster
from agentd.cluster.config import cluster_settings
from agentd.cluster.relay import FORWARDED_BY, FORWARDED_FOR, FORWARDED_SIGNATURE, Inbound, WebhookRelay
from agentd.errors import ConfigError
from agentd.store import open_store

REFUSED = ("config key cluster.advertise_url: must be the http:// or https:// URL other daemons reach this one "
           "at (like http://10.0.0.5:4200), without query or fragment")


@pytest.mark.parametrize("listen, url", [
    ("127.0.0.1:4200", "http://127.0.0.1:4200"),
    ("10.1.2.3:81", "http://10.1.2.3:81"),
    ("[::1]:4200", "http://[::1]:4200"),
    ("0.0.0.0:4200", f"http://{socket.gethostname()}:4200"),
])
def test_advertise_url_defaults_to_the_listen_address(listen: str, url: str) -> None:
    assert cluster_settings({}, listen).advertise_url == url


def test_advertise_url_is_taken_without_its_trailing_slash() -> None:
    table = {"cluster": {"advertise_url": "https://node-2.internal:8443/agentd/"}}
    assert cluster_settings(table, "0.0.0.0:4200").advertise_url == "https://node-2.internal:8443/agentd"


@pytest.mark.parametrize("value", ["node-2:4200", "ftp://node-2", "http://", "http://n?x=1", "http://n#top",
                                   "http://n:99999", 4200, "http://" + "n" * 300])
def test_a_bad_advertise_url_is_refused_naming_the_key(value) -> None:
    with pytest.raises(ConfigError) as err:
        cluster_settings({"cluster": {"advertise_url": value}}, "127.0.0.1:4200")
    assert err.value.message == REFUSED


@pytest.fixture
def pair(tmp_path):
    store = open_store(tmp_path / "agentd.db")
    members = []
    for name, port in (("a", 4201), ("b", 4202)):
        settings = cluster_settings({"cluster": {"daemon_id": name}}, f"127.0.0.1:{port}")
        cluster = Cluster(store, settings, f"127.0.0.1:{port}", shared=True)
        cluster._beat_daemon(started=True)
        members.append(cluster)
    yield members
    store.close()


def request(body: bytes = b'{"x": 1}', headers: dict[str, str] | None = None) -> Inbound:
    return Inbound("POST", "/channels/webhook/webhook", b"a=1&b=%7E", [("a", "1"), ("b", "~")],
                   headers or {}, body, "203.0.113.9")


def relayed_by(relay: WebhookRelay, by: str, inbound: Inbound, stamp: int | None = None) -> dict[str, str]:
    stamp = int(time.time()) if stamp is None else stamp
    return {FORWARDED_BY: by, FORWARDED_FOR: inbound.client,
            FORWARDED_SIGNATURE: f"t={stamp},v1={relay._signature(by, str(stamp), inbound)}"}


def test_members_share_one_peer_secret_and_see_each_others_urls(pair) -> None:
    a, b = pair
    assert len(a.peer_secret()) == 64 and a.peer_secret() == b.peer_secret()
    assert (a.member_url("b"), b.member_url("a")) == ("http://127.0.0.1:4202", "http://127.0.0.1:4201")
    assert {d["id"]: d["url"] for d in a.daemons()} == {"a": "http://127.0.0.1:4201", "b": "http://127.0.0.1:4202"}
    assert a.member_url("gone") is None


def test_only_a_fresh_signature_of_another_member_is_accepted(pair) -> None:
    a, b = pair
    on_a, on_b = WebhookRelay(a, lambda name: "a"), WebhookRelay(b, lambda name: "a")
    sent = request()
    good = relayed_by(on_b, "b", sent)
    assert on_a.accept(request(headers=good)) == "203.0.113.9"
    assert on_a.relayed(good) and not on_a.relayed({"Content-Type": "application/json"})
    refused = [
        {**good, FORWARDED_SIGNATURE: good[FORWARDED_SIGNATURE][:-1] + "0"},  # altered signature
        relayed_by(on_b, "b", sent, stamp=int(time.time()) - 61),  # older than a minute
        relayed_by(on_a, "a", sent),  # "relayed" by the daemon itself
        {**good, FORWARDED_FOR: "127.0.0.1"},  # another client claimed
        {FORWARDED_BY: "b"},  # no signature at all
    ]
    for headers in refused:
        assert on_a.accept(request(headers=headers)) is None, headers
    # The signature covers the body, the path and the query.
    assert on_a.accept(request(body=b'{"x": 2}', headers=good)) is None
    other_path = Inbound("POST", "/channels/line/webhook", sent.query, sent.args, good, sent.body, sent.client)
    assert on_a.accept(other_path) is None
    other_query = Inbound("POST", sent.path, b"a=2", [("a", "2")], good, sent.body, sent.client)
    assert on_a.accept(other_query) is None


def test_nothing_is_relayed_by_a_lone_daemon_or_to_itself(tmp_path) -> None:
    store = open_store(tmp_path / "agentd.db")
    try:
        lone = Cluster(store, cluster_settings({"cluster": {"daemon_id": "a"}}, "127.0.0.1:4201"), "127.0.0.1:4201")
        lone._beat_daemon(started=True)
        assert not lone.shared
        assert WebhookRelay(lone, lambda name: "b").forward("webhook", request()) is None
        assert WebhookRelay(lone, lambda name: "b").accept(request(headers={FORWARDED_BY: "b"})) is None
        shared = Cluster(store, lone.settings, "127.0.0.1:4201", shared=True)
        assert WebhookRelay(shared, lambda name: "a").forward("webhook", request()) is None  # holds it itself
        assert WebhookRelay(shared, lambda name: None).forward("webhook", request()) is None  # nobody holds it
    finally:
        store.close()
