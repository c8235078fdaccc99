"""Who answers a channel's webhook request (agentd/cluster/webhook_intake.py), without a
daemon: two clusters on one SQLite file shared as if it were PostgreSQL, a stand-in for the
daemon holding the channel, and adapters that record what they were asked. Through real
daemons: tests/api/test_routes_webhooks.py, tests/cluster/test_webhook_relay.py."""

from __future__ import annotations

from typing import Any

import pytest

from agentd.api.middleware import is_loopback
from agentd.channels.bases.webhook import Request
from agentd.cluster.relay import Inbound, WebhookRelay
from agentd.cluster.webhook_intake import Delivery, Reply, WebhookIntake
from tests.cluster.test_relay import holder, relayed_by, two_members  # noqa: F401 (holder: a fixture)

HOOK = "/channels/hook/webhook"
NOT_RUNNING = Reply(503, {"error": "channel hook is not running on this daemon"}, {"Retry-After": "5"})
RELAY_REFUSED = Reply(403, {"error": "relayed webhook refused: not signed by a daemon of this cluster"})
UNSIGNED = Reply(401, {"error": "channel hook has no signing secret: its webhook serves loopback clients only "
                                "(set its secret to accept others)"})


class Adapter:
    """A running webhook adapter: says whether it is signed, records each request it serves."""

    def __init__(self, signed: bool = True, answer: tuple[int, Any] = (202, {"status": "accepted"})) -> None:
        self._signed = signed
        self.answer = answer
        self.served: list[tuple[Request, str, bool]] = []

    def signed(self) -> bool:
        return self._signed

    def serve(self, request: Request, remote: str, root: bool = False) -> tuple[int, Any]:
        self.served.append((request, remote, root))
        return self.answer


class Channels:
    """The channel runtime as the intake sees it: the running webhook adapters and the
    configured sections."""

    def __init__(self) -> None:
        self.running: dict[str, Adapter] = {}
        self.sections: dict[str, dict] = {}

    def webhook(self, name: str) -> Adapter | None:
        return self.running.get(name)


class Body:
    """The request body, counting reads (a refusal must come before the body is read)."""

    def __init__(self, data: bytes | None = b'{"message": "hi"}') -> None:
        self.data = data
        self.reads = 0

    def __call__(self) -> bytes | None:
        self.reads += 1
        return self.data


def delivery(body: Body, headers: dict[str, str] | None = None, method: str = "POST", client: str = "203.0.113.9",
             rest: str = "/", path: str = HOOK) -> Delivery:
    return Delivery(method, path, rest, b"a=1&b=2&a=3", [("a", "1"), ("a", "3"), ("b", "2")],
                    headers if headers is not None else {"Content-Type": "application/json", "X-Sig": "s"},
                    client, body, is_loopback)


@pytest.fixture
def world(tmp_path, holder):
    """Daemon "b" (the one under test) and "a", reached at the holder stand-in's URL."""
    a, b = two_members(tmp_path, holder)
    holders: dict[str, str] = {}
    relay = WebhookRelay(b, holders.get)
    channels = Channels()
    yield WebhookIntake(channels, relay), channels, holders, WebhookRelay(a, holders.get)
    relay.close()
    a.store.close()


def signed_by_a(on_a: WebhookRelay, body: bytes, client: str = "127.0.0.1", method: str = "POST") -> dict[str, str]:
    sent = Inbound(method, HOOK, b"", [("a", "1"), ("a", "3"), ("b", "2")], {}, body, client)
    return relayed_by(on_a, "a", sent)


def test_an_unknown_channel_is_404_before_anything_is_read(world) -> None:
    intake, channels, _, _ = world
    body = Body()
    channels.sections["other"] = {}
    assert intake.deliver("hook", delivery(body)) == Reply(404, {"error": "no webhook channel 'hook' is configured"})
    assert body.reads == 0


@pytest.mark.parametrize("header", ["Origin", "Sec-Fetch-Site"])
def test_a_browsers_request_is_refused_unread_whatever_it_carries(world, header) -> None:
    intake, channels, _, _ = world
    channels.running["hook"] = adapter = Adapter()
    body = Body()
    for method in ("POST", "PUT"):
        reply = intake.deliver("hook", delivery(body, {header: "null", "X-Sig": "s"}, method=method))
        assert reply == Reply(403, {"error": "cross-site request refused"})
    assert body.reads == 0 and adapter.served == []
    # A verification handshake (GET) is answered: the adapter checks it.
    assert intake.deliver("hook", delivery(body, {header: "null"}, method="GET")).status == 202


def test_the_running_adapter_serves_the_request_as_the_platform_sent_it(world) -> None:
    intake, channels, _, _ = world
    channels.running["hook"] = adapter = Adapter(answer=(200, {"ok": True}))
    body = Body()
    reply = intake.deliver("hook", delivery(body, {"Content-Type": "application/json", "X-Line-Signature": "s"},
                                            rest="/events"))
    assert reply == Reply(200, {"ok": True}, {})
    [(request, remote, root)] = adapter.served
    assert (request.method, request.path, request.query, request.body) == (
        "POST", "/events", {"a": ["1", "3"], "b": ["2"]}, b'{"message": "hi"}')
    assert request.headers == {"content-type": "application/json", "x-line-signature": "s"}
    assert (remote, root, body.reads) == ("203.0.113.9", True, 1)


def test_a_verification_challenge_is_sent_back_as_text(world) -> None:
    intake, channels, _, _ = world
    channels.running["hook"] = Adapter(answer=(200, b"challenge-123"))
    reply = intake.deliver("hook", delivery(Body(b""), {}, method="GET"))
    assert reply == Reply(200, b"challenge-123", {"Content-Type": "text/plain; charset=utf-8"})


def test_an_unsigned_adapter_serves_loopback_clients_only(world) -> None:
    intake, channels, _, _ = world
    channels.running["hook"] = adapter = Adapter(signed=False)
    body = Body()
    for client in ("203.0.113.9", "", "10.0.0.1"):
        assert intake.deliver("hook", delivery(body, client=client)) == UNSIGNED
    assert body.reads == 0 and adapter.served == []
    for client in ("127.0.0.1", "::1"):
        assert intake.deliver("hook", delivery(body, client=client)).status == 202
    assert [remote for _, remote, _ in adapter.served] == ["127.0.0.1", "::1"]


def test_a_body_over_the_limit_is_413_and_never_served_or_relayed(world, holder) -> None:
    intake, channels, holders, on_a = world
    too_large = Reply(413, {"error": "body too large"})
    channels.running["hook"] = adapter = Adapter()
    assert intake.deliver("hook", delivery(Body(None))) == too_large
    relayed = signed_by_a(on_a, b"")
    assert intake.deliver("hook", delivery(Body(None), relayed)) == too_large
    assert adapter.served == []
    del channels.running["hook"]
    channels.sections["hook"] = {}
    holders["hook"] = "a"
    assert intake.deliver("hook", delivery(Body(None))) == too_large
    assert holder.seen == []


def test_a_channel_held_elsewhere_is_relayed_and_its_answer_returned(world, holder) -> None:
    intake, channels, holders, _ = world
    channels.sections["hook"] = {}
    body = Body()
    assert intake.deliver("hook", delivery(body)) == NOT_RUNNING  # nobody holds it
    holders["hook"] = "b"
    assert intake.deliver("hook", delivery(body)) == NOT_RUNNING  # "held" here, yet not running here
    assert holder.seen == []
    holders["hook"] = "a"
    reply = intake.deliver("hook", delivery(body, {"Content-Type": "application/json", "X-Sig": "s"}))
    assert reply == Reply(202, b'{"status": "accepted"}', {"Content-Type": "application/json", "Retry-After": "7",
                                                             "X-Agentd-Forwarded-To": "a"})
    [seen] = holder.seen
    assert (seen["uri"], seen["body"], seen["headers"]["X-Sig"]) == (HOOK + "?a=1&b=2&a=3", b'{"message": "hi"}', "s")
    assert seen["headers"]["X-Agentd-Forwarded-For"] == "203.0.113.9"


def test_a_relayed_request_is_judged_as_from_its_client_and_never_relayed_again(world, holder) -> None:
    intake, channels, holders, on_a = world
    channels.running["hook"] = adapter = Adapter(signed=False)
    body = b'{"message": "hi"}'
    # From a remote address (daemon a), for a loopback client: served as loopback's.
    assert intake.deliver("hook", delivery(Body(), signed_by_a(on_a, body), client="10.0.0.5")).status == 202
    assert adapter.served[-1][1] == "127.0.0.1"
    # For a remote client, from a loopback address: the adapter's loopback-only rule holds.
    assert intake.deliver("hook", delivery(Body(), signed_by_a(on_a, body, "203.0.113.9"),
                                           client="127.0.0.1")) == UNSIGNED
    channels.running["hook"] = Adapter()
    assert intake.deliver("hook", delivery(Body(), signed_by_a(on_a, body, "203.0.113.9"))).status == 202
    # Not signed by a member: refused, whatever the adapter; a bad one on a channel not running here too.
    forged = {**signed_by_a(on_a, b"other body")}
    assert intake.deliver("hook", delivery(Body(), forged)) == RELAY_REFUSED
    del channels.running["hook"]
    channels.sections["hook"] = {}
    holders["hook"] = "a"
    assert intake.deliver("hook", delivery(Body(), forged)) == RELAY_REFUSED
    # Signed, but this daemon does not run the channel: it stops here, the holder never sees it.
    assert intake.deliver("hook", delivery(Body(), signed_by_a(on_a, body))) == NOT_RUNNING
    assert holder.seen == []
