"""The pieces of webhook relaying between daemons (agentd/cluster/relay.py), on one SQLite
file shared by two clusters as if it were PostgreSQL: `[cluster] advertise_url` and its
derived default, each daemon's URL in `cluster_daemons`, one peer secret for all members,
and which relayed requests a daemon accepts. tests/cluster/test_webhook_relay.py runs the
whole path with two real daemons."""

from __future__ import annotations

import hashlib
import hmac
import socket
import time
from types import SimpleNamespace

import pytest
from flask import Flask, request as flask_request
from pony import orm

import agentd.cluster.relay as relay_module
from agentd.cluster.coordinator import Cluster
from agentd.cluster.config import cluster_settings
from agentd.cluster.relay import FORWARDED_BY, FORWARDED_FOR, FORWARDED_SIGNATURE, Inbound, WebhookRelay
from agentd.errors import ConfigError
from agentd.store import open_store
from fakes.http import FakeServer

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
        cluster.members.beat(started=True)
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
        {**good, FORWARDED_SIGNATURE: good[FORWARDED_SIGNATURE][:-1]
         + ("1" if good[FORWARDED_SIGNATURE].endswith("0") else "0")},  # altered signature
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
        lone.members.beat(started=True)
        assert not lone.shared
        assert WebhookRelay(lone, lambda name: "b").forward("webhook", request()) is None
        assert WebhookRelay(lone, lambda name: "b").accept(request(headers={FORWARDED_BY: "b"})) is None
        shared = Cluster(store, lone.settings, "127.0.0.1:4201", shared=True)
        assert WebhookRelay(shared, lambda name: "a").forward("webhook", request()) is None  # holds it itself
        assert WebhookRelay(shared, lambda name: None).forward("webhook", request()) is None  # nobody holds it
    finally:
        store.close()


ACCEPTED = (b'{"status": "accepted"}', 202, {"Content-Type": "application/json", "Retry-After": "7",
                                              "X-Other": "kept here"})


class Holder(FakeServer):
    """Stands in for the daemon holding the channel: records what reaches it, answers `reply`."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.reply: tuple = ACCEPTED
        self.delay = 0.0
        app = Flask("holder")

        @app.route("/", defaults={"path": ""}, methods=["GET", "POST", "PUT"])
        @app.route("/<path:path>", methods=["GET", "POST", "PUT"])
        def serve(path: str):
            self.seen.append({"method": flask_request.method, "uri": flask_request.environ["RAW_URI"],
                              "headers": dict(flask_request.headers), "body": flask_request.get_data(),
                              "args": list(flask_request.args.items(multi=True))})
            time.sleep(self.delay)
            return self.reply

        super().__init__(app)


@pytest.fixture(scope="module")
def holder():
    server = Holder().start()
    yield server
    server.stop()


def two_members(tmp_path, holder: Holder) -> tuple[Cluster, Cluster]:
    """Daemons "a" (reached at the holder stand-in's URL) and "b" on one store, both beating."""
    holder.seen.clear()
    store = open_store(tmp_path / "agentd.db")
    a = Cluster(store, cluster_settings({"cluster": {"daemon_id": "a", "advertise_url": holder.url}},
                                        "127.0.0.1:4201"), "127.0.0.1:4201", shared=True)
    b = Cluster(store, cluster_settings({"cluster": {"daemon_id": "b"}}, "127.0.0.1:4202"), "127.0.0.1:4202",
                shared=True)
    for member in (a, b):
        member.members.beat(started=True)
    return a, b


@pytest.fixture
def relaying(tmp_path, holder):
    """Daemon "a" reached at the holder's URL, holding every channel; "b" relays to it."""
    a, b = two_members(tmp_path, holder)
    on_b = WebhookRelay(b, {"webhook": "a"}.get)
    yield a, on_b
    on_b.close()
    a.store.close()


def sent_as_is(path: str = "/channels/webhook/webhook/a b~", headers: dict[str, str] | None = None) -> Inbound:
    # The query decoded as werkzeug reads it on either daemon: by name, then in order.
    return Inbound("POST", path, b"a=1&b=%7E&a=2", [("a", "1"), ("a", "2"), ("b", "~")],
                   headers or {"Content-Type": "application/json", "X-Webhook-Signature": "sha256=abc",
                               "Host": "agentd.example.com"},
                   b'{"x": 1}', "203.0.113.9")


def test_a_relay_passes_the_request_on_as_it_came_and_answers_the_holders_answer(relaying, holder) -> None:
    a, on_b = relaying
    headers = {"Content-Type": "application/json", "X-Webhook-Signature": "sha256=abc", "Host": "agentd.example.com",
               "Connection": "keep-alive", "Keep-Alive": "timeout=5", "TE": "trailers", "Upgrade": "h2c",
               "Proxy-Authorization": "Basic eA==", "X-Agentd-Forwarded-By": "a", "x-agentd-forwarded-for": "127.0.0.1",
               "X-Agentd-Forwarded-Hops": "0"}
    inbound = sent_as_is(headers=headers)
    answer = on_b.forward("webhook", inbound)
    assert answer is not None
    assert (answer.status, answer.body) == (202, b'{"status": "accepted"}')
    assert answer.headers == {"Content-Type": "application/json", "Retry-After": "7", "X-Agentd-Forwarded-To": "a"}
    [seen] = holder.seen
    # Path and query byte for byte (the query's own quoting kept), the body untouched.
    assert (seen["method"], seen["uri"], seen["body"]) == ("POST", "/channels/webhook/webhook/a%20b~?a=1&b=%7E&a=2",
                                                           b'{"x": 1}')
    got = {k.lower(): v for k, v in seen["headers"].items()}
    assert (got["x-webhook-signature"], got["host"], got["content-type"]) == ("sha256=abc", "agentd.example.com",
                                                                              "application/json")
    for hop in ("keep-alive", "te", "upgrade", "proxy-authorization", "x-agentd-forwarded-hops"):
        assert hop not in got, hop
    assert got.get("connection", "keep-alive") == "keep-alive"  # the HTTP client's own, not the client's
    # The client's claims to be a relay are replaced by b's own, signed, which a accepts.
    assert (got["x-agentd-forwarded-by"], got["x-agentd-forwarded-for"]) == ("b", "203.0.113.9")
    received = Inbound(seen["method"], inbound.path, b"a=1&b=%7E&a=2", seen["args"], seen["headers"], seen["body"],
                       "127.0.0.1")
    assert WebhookRelay(a, lambda name: "a").accept(received) == "203.0.113.9"


def test_a_relay_never_goes_through_the_environments_proxy_nor_follows_redirects(relaying, holder,
                                                                                 monkeypatch) -> None:
    _, on_b = relaying
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    holder.reply = (b"", 307, {"Location": "http://127.0.0.1:9/elsewhere", "Content-Type": "text/plain"})
    try:
        first = on_b.forward("webhook", sent_as_is())
        second = on_b.forward("webhook", sent_as_is())
    finally:
        holder.reply = ACCEPTED
    assert first is not None and second is not None
    assert (first.status, first.headers) == (307, {"Content-Type": "text/plain", "X-Agentd-Forwarded-To": "a"})
    assert len(holder.seen) == 2
    on_b.close()  # a new session after close
    assert on_b.forward("webhook", sent_as_is()).status == 202
    assert len(holder.seen) == 3


def test_a_path_goes_as_it_came_and_no_query_adds_no_question_mark(relaying, holder) -> None:
    _, on_b = relaying
    plain = Inbound("POST", "/channels/webhook/webhook/a b:@!$&'()*+,;=~", b"", [], {}, b"{}", "203.0.113.9")
    assert on_b.forward("webhook", plain).status == 202
    assert holder.seen[-1]["uri"] == "/channels/webhook/webhook/a%20b:@!$&'()*+,;=~"


def test_only_the_holder_of_that_channel_is_relayed_to_never_this_daemon(relaying, holder) -> None:
    a, on_b = relaying
    assert on_b.forward("line", sent_as_is()) is None  # nobody holds it
    assert WebhookRelay(a, {"webhook": "a"}.get).forward("webhook", sent_as_is()) is None  # a holds it itself
    assert holder.seen == []


def test_a_holder_that_went_silent_or_does_not_answer_is_no_answer(relaying, holder, monkeypatch, caplog) -> None:
    a, on_b = relaying
    with orm.db_session:  # a's heartbeat older than a lease period: not a live member any more
        a.store.db.execute("UPDATE cluster_daemons SET heartbeat_at = $t WHERE id = 'a'",
                           {"t": time.time() - a.settings.lease_secs - 1})
    assert on_b.forward("webhook", sent_as_is()) is None
    assert holder.seen == []
    dead = Cluster(a.store, cluster_settings({"cluster": {"daemon_id": "c", "advertise_url": "http://127.0.0.1:9"}},
                                             "127.0.0.1:4203"), "127.0.0.1:4203", shared=True)
    dead.members.beat(started=True)
    caplog.clear()
    assert WebhookRelay(on_b.cluster, lambda name: "c").forward("webhook", sent_as_is()) is None
    [line] = [r.getMessage() for r in caplog.records if r.name == "agentd.cluster.relay"]
    assert line.startswith("channel webhook: webhook not relayed to daemon c at http://127.0.0.1:9: ")
    assert "Connection refused" in line  # why, as the HTTP client said it
    # A holder that takes longer than the read timeout: the standby stops waiting.
    a.members.beat()
    monkeypatch.setattr(relay_module, "TIMEOUT", (1.0, 0.3))
    holder.delay = 1.5
    try:
        started = time.monotonic()
        assert on_b.forward("webhook", sent_as_is()) is None
        assert time.monotonic() - started < 1.2
    finally:
        holder.delay = 0.0


def test_the_signature_is_the_documented_hmac_and_tolerates_unknown_fields(pair, monkeypatch) -> None:
    a, _ = pair
    on_a = WebhookRelay(a, lambda name: "a")
    sent = request()
    stamp = int(time.time())
    canonical = "\n".join(["b", str(stamp), sent.client, "POST", sent.path, '[["a", "1"], ["b", "~"]]',
                           hashlib.sha256(sent.body).hexdigest()])
    mac = hmac.new(a.peer_secret(), canonical.encode(), hashlib.sha256).hexdigest()
    headers = {FORWARDED_BY: "b", FORWARDED_FOR: sent.client, FORWARDED_SIGNATURE: f"t={stamp},v1={mac}"}
    assert on_a.accept(request(headers=headers)) == "203.0.113.9"
    # Fields a later version may add, values with "=" included, are left aside.
    later = {**headers, FORWARDED_SIGNATURE: f"t={stamp},v1={mac},v2=YWJj==,"}
    assert on_a.accept(request(headers=later)) == "203.0.113.9"
    for broken in (f"v1={mac}", f"t=,v1={mac}", f"t=x{stamp},v1={mac}", f"t={stamp}", ""):
        assert on_a.accept(request(headers={**headers, FORWARDED_SIGNATURE: broken})) is None, broken
    unnamed = {FORWARDED_FOR: sent.client, FORWARDED_SIGNATURE: f"t={stamp},v1={mac}"}  # no Forwarded-By
    assert on_a.accept(request(headers=unnamed)) is None


def test_a_relay_is_accepted_a_minute_either_side_and_no_more(pair, monkeypatch) -> None:
    a, b = pair
    on_a, on_b = WebhookRelay(a, lambda name: "a"), WebhookRelay(b, lambda name: "a")
    a.peer_secret()
    sent = request()
    stamp = 1_800_000_000
    headers = relayed_by(on_b, "b", sent, stamp=stamp)
    for now, accepted in ((stamp + 60.0, True), (stamp - 60.0, True), (stamp + 60.5, False), (stamp - 61.0, False)):
        monkeypatch.setattr(relay_module, "time", SimpleNamespace(time=lambda now=now: now))
        assert (on_a.accept(request(headers=headers)) is not None) is accepted, now
