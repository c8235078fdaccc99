"""A channel's webhook that reaches a standby daemon is relayed to the daemon holding it.

Behind a proxy that spreads requests over every daemon, a platform's delivery lands on
any of them, while the adapter runs on one (agentd/channels/leaders.py). The standby
passes the request on as it came (method, path, query, body, every header but the
hop-by-hop ones: the platform's signature headers and Host included) to the holder's
`[cluster] advertise_url` with a short timeout, and answers the holder's status and body.
It never parses the body: the holder checks the platform's signature, as for a request
that came to it directly.

Three headers travel with it: `X-Agentd-Forwarded-By` (the standby's id),
`X-Agentd-Forwarded-For` (the client the standby saw: the holder judges the request as
from that client) and `X-Agentd-Forwarded-Signature` (`t=<unix time>,v1=<hex>`: an
HMAC-SHA256 under the cluster's peer secret of those, the time, method, path, query and a
hash of the body). The holder accepts a forwarded request only with a valid signature less
than a minute old, and never forwards one again, so a relay is one hop at most.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping
from urllib.parse import quote

from agentd import hmacs
from agentd.cluster.coordinator import Cluster

log = logging.getLogger("agentd.cluster.relay")

FORWARDED_BY = "X-Agentd-Forwarded-By"
FORWARDED_FOR = "X-Agentd-Forwarded-For"
FORWARDED_SIGNATURE = "X-Agentd-Forwarded-Signature"
FORWARDED_TO = "X-Agentd-Forwarded-To"  # on the standby's answer: the daemon that gave it
TIMEOUT = (2.0, 10.0)  # connect, read: platforms give up after a few seconds, then retry
WINDOW_SECS = 60.0
# Hop-by-hop headers (RFC 9110 7.6.1) and what the HTTP client sets itself.
NOT_RELAYED = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authenticate",
                         "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
                         "content-length", "accept-encoding"})
RELAYED_ANSWER = ("Content-Type", "Retry-After")


@dataclass
class Inbound:
    """A webhook request as the receiving daemon saw it (its body read, not parsed)."""

    method: str
    path: str  # decoded, as routed: /channels/<name>/webhook[/...]
    query: bytes  # the raw query string
    args: list[tuple[str, str]]  # the query decoded, in order
    headers: Mapping[str, str]
    body: bytes
    client: str  # the client's address


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str]


class WebhookRelay:
    """Relays webhooks from standby daemons and checks the ones relayed to this daemon."""

    def __init__(self, cluster: Cluster, holder: Callable[[str], str | None]) -> None:
        self.cluster = cluster
        self.holder = holder  # channel name -> the id of the daemon holding it, or None
        self._http: Any = None  # a requests.Session, made by the first relay (an idle daemon loads no requests)
        self._lock = threading.Lock()

    def _session(self) -> Any:
        import requests

        with self._lock:
            if self._http is None:
                self._http = requests.Session()
                # Daemon to daemon: never through a proxy meant for outbound calls (model providers).
                self._http.trust_env = False
            return self._http

    def _signature(self, by: str, stamp: str, request: Inbound) -> str:
        canonical = "\n".join([by, stamp, request.client, request.method, request.path,
                               json.dumps(request.args), hashlib.sha256(request.body).hexdigest()])
        return hmacs.hex_digest(self.cluster.peer_secret(), canonical)

    def forward(self, name: str, request: Inbound) -> Answer | None:
        """The holder's answer to `request` for channel `name`; None when no other live
        daemon holds the channel or it did not answer."""
        if not self.cluster.shared:
            return None
        holder = self.holder(name)
        if holder is None or holder == self.cluster.id:
            return None
        base = self.cluster.member_url(holder)
        if base is None:
            return None
        import requests

        http = self._session()
        stamp = str(int(time.time()))
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in NOT_RELAYED and not k.lower().startswith("x-agentd-forwarded-")}
        headers.update({FORWARDED_BY: self.cluster.id, FORWARDED_FOR: request.client,
                        FORWARDED_SIGNATURE: f"t={stamp},v1={self._signature(self.cluster.id, stamp, request)}"})
        prepared = http.prepare_request(requests.Request(request.method, base, headers=headers,
                                                               data=request.body))
        # The path and query exactly as they came (the client would re-quote them).
        prepared.url = base + quote(request.path, safe="/:@!$&'()*+,;=~") + (
            "?" + request.query.decode("latin-1") if request.query else "")
        try:
            response = http.send(prepared, timeout=TIMEOUT, allow_redirects=False)
        except requests.RequestException as exc:
            log.warning("channel %s: webhook not relayed to daemon %s at %s: %s", name, holder, base, exc)
            return None
        answer = {k: response.headers[k] for k in RELAYED_ANSWER if k in response.headers}
        answer[FORWARDED_TO] = holder
        return Answer(response.status_code, response.content, answer)

    @staticmethod
    def relayed(headers: Mapping[str, str]) -> bool:
        """Whether a request says it was relayed by another daemon (it is never relayed again)."""
        return any(headers.get(h) is not None for h in (FORWARDED_BY, FORWARDED_FOR, FORWARDED_SIGNATURE))

    def accept(self, request: Inbound) -> str | None:
        """The original client of a request relayed by a member of this cluster, or None when
        it does not carry a valid, fresh signature of one."""
        by = request.headers.get(FORWARDED_BY) or ""
        client = request.headers.get(FORWARDED_FOR) or ""
        fields = dict(part.split("=", 1) for part in (request.headers.get(FORWARDED_SIGNATURE) or "").split(",")
                      if "=" in part)
        stamp = fields.get("t", "")
        if not (self.cluster.shared and by and by != self.cluster.id and client and stamp.isdigit()
                and abs(time.time() - int(stamp)) <= WINDOW_SECS):
            return None
        original = Inbound(request.method, request.path, request.query, request.args, {}, request.body, client)
        return client if hmacs.same(fields.get("v1"), self._signature(by, stamp, original)) else None

    def close(self) -> None:
        with self._lock:
            http, self._http = self._http, None
        if http is not None:
            http.close()
