"""Who answers a chat platform's request to `/channels/<name>/webhook`: this daemon's
adapter, the cluster daemon holding the channel (agentd/cluster/relay.py), or nobody yet.

The route (agentd/api/routes_webhooks.py) hands over the request as it came, its body
still unread; `WebhookIntake.deliver` makes every decision and returns the reply:

- 404 for a channel that is not configured, 403 for a browser's request (it carries
  `Origin` or `Sec-Fetch-Site`), both before the body is read;
- a request relayed by another daemon is judged as from the client that daemon saw,
  once its signature proves a member of this cluster sent it (403 otherwise), and is
  never relayed again;
- a channel configured here but not running is relayed to the daemon holding it, whose
  answer is the reply; 503 with Retry-After when none answers (platforms retry a 503, so
  no event is lost while the channel comes back);
- an adapter without a signing secret serves loopback clients only (401 for others);
- otherwise the adapter serves it, checking the platform's signature first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from agentd.cluster.relay import Inbound, WebhookRelay

if TYPE_CHECKING:
    from agentd.channels.runtime import ChannelManager

RETRY_AFTER_SECS = 5
TOO_LARGE = {"error": "body too large"}
CROSS_SITE = {"error": "cross-site request refused"}
RELAY_REFUSED = {"error": "relayed webhook refused: not signed by a daemon of this cluster"}
TEXT = {"Content-Type": "text/plain; charset=utf-8"}


@dataclass
class Delivery:
    """A platform's request as the HTTP layer received it, its body not yet read."""

    method: str
    path: str  # decoded, as routed: /channels/<name>/webhook[/...]
    rest: str  # the path below the webhook's root, "/" for the root itself
    query: bytes  # the raw query string
    args: list[tuple[str, str]]  # the query decoded, in order
    headers: Mapping[str, str]
    client: str  # the client's address
    read_body: Callable[[], bytes | None]  # the body, or None when it is over the limit
    is_loopback: Callable[[str], bool]  # whether an address is this host's own


@dataclass
class Reply:
    status: int
    body: Any  # JSON-able, or bytes sent verbatim
    headers: dict[str, str] = field(default_factory=dict)


def not_running(name: str) -> Reply:
    return Reply(503, {"error": f"channel {name} is not running on this daemon"},
                 {"Retry-After": str(RETRY_AFTER_SECS)})


class WebhookIntake:
    """The one decision over a channel's inbound webhook request (see the module doc)."""

    def __init__(self, channels: ChannelManager, relay: WebhookRelay) -> None:
        self.channels = channels
        self.relay = relay

    def deliver(self, name: str, delivery: Delivery) -> Reply:
        from agentd.channels.bases.webhook import Request

        adapter = self.channels.webhook(name)
        if adapter is None and name not in self.channels.sections:
            return Reply(404, {"error": f"no webhook channel {name!r} is configured"})
        if adapter is None and name in self.channels.running:
            # Running here, receiving by polling or a socket: no daemon takes its webhooks.
            return Reply(404, {"error": f"channel {name} receives messages by polling or a socket, "
                                        "not by webhook"})
        headers = delivery.headers
        if delivery.method != "GET" and (headers.get("Origin") is not None
                                         or headers.get("Sec-Fetch-Site") is not None):
            return Reply(403, CROSS_SITE)
        client = delivery.client
        relayed = self.relay.relayed(headers)
        body = None
        if relayed or adapter is None:
            body = delivery.read_body()
            if body is None:
                return Reply(413, TOO_LARGE)
            inbound = Inbound(delivery.method, delivery.path, delivery.query, delivery.args, headers, body, client)
            if not relayed:
                answer = self.relay.forward(name, inbound)
                if answer is None:
                    return not_running(name)
                return Reply(answer.status, answer.body, answer.headers)
            client = self.relay.accept(inbound) or ""
            if not client:
                return Reply(403, RELAY_REFUSED)
            if adapter is None:
                return not_running(name)
        if not adapter.signed() and not delivery.is_loopback(client):
            return Reply(401, {"error": f"channel {name} has no signing secret: its webhook serves "
                                        "loopback clients only (set its secret to accept others)"})
        if body is None:
            body = delivery.read_body()
            if body is None:
                return Reply(413, TOO_LARGE)
        query: dict[str, list[str]] = {}
        for key, value in delivery.args:
            query.setdefault(key, []).append(value)
        platform_request = Request(delivery.method, delivery.rest, query,
                                   {k.lower(): v for k, v in headers.items()}, body)
        status, answer = adapter.serve(platform_request, client, root=True)
        return Reply(status, answer, TEXT if isinstance(answer, bytes) else {})
