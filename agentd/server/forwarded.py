"""Who the client is behind trusted proxies (no web framework here: the WSGI layer in
agentd/server/proxy.py uses it, and the app hands `real_client` to the channel webhook
listeners, which know nothing of this layer).

The client is the right-most hop of `X-Forwarded-For` (or of the `for=` values of
`Forwarded`) that is not a trusted proxy: each trusted proxy appends the peer it
saw, so whatever a client writes at the left of the list is never reached. With
both headers, a loopback client named by one loses to a remote one named by the
other (see `forwarded_client`).
"""

from __future__ import annotations

import ipaddress
from typing import Callable, Iterable

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_MAX_HOP = 100


def parse_networks(entries: Iterable[str]) -> list[IPNetwork]:
    """`["127.0.0.1", "10.0.0.0/8", "::1"]` as networks; ValueError names a bad entry."""
    networks: list[IPNetwork] = []
    for entry in entries:
        text = entry.strip()
        try:
            networks.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP address or CIDR network") from None
    return networks


def parse_ip(text: str) -> IPAddress | None:
    """An address from a hop: `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[2001:db8::1]:80`,
    optionally quoted (as in `Forwarded`). None for anything else (`unknown`, `_hidden`)."""
    text = text.strip().strip('"').strip()
    if text.startswith("["):
        end = text.find("]")
        text = text[1:end] if end > 0 else ""
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return ip.ipv4_mapped
    return ip


class TrustedProxies:
    """The set of peers whose forwarding headers are believed."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.networks = parse_networks(entries)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def contains(self, addr: str | IPAddress | None) -> bool:
        """True when `addr` lies in one of the trusted networks."""
        ip = parse_ip(addr) if isinstance(addr, str) else addr
        if ip is None:
            return False
        return any(ip.version == net.version and ip in net for net in self.networks)

    def client_index(self, hops: list[str]) -> int | None:
        """Index of the right-most hop that is not a trusted proxy (0 when all are;
        None when there are no hops). A hop that is no address at all (`unknown`,
        an obfuscated id) is never a proxy we trust, so it ends the walk."""
        for index in range(len(hops) - 1, -1, -1):
            ip = parse_ip(hops[index])
            if ip is None or not self.contains(ip):
                return index
        return 0 if hops else None


def hop_address(hop: str) -> str:
    """A hop as REMOTE_ADDR: the normalised address, else the (bounded) token itself,
    which is never loopback to anything that checks."""
    ip = parse_ip(hop)
    if ip is not None:
        return str(ip)
    return hop.strip().strip('"')[:_MAX_HOP] or "unknown"


def forwarded_elements(value: str) -> list[dict[str, str]]:
    """RFC 7239 `Forwarded`: one dict of lower-cased parameter names per element."""
    elements = []
    for element in value.split(","):
        params: dict[str, str] = {}
        for pair in element.split(";"):
            name, sep, val = pair.strip().partition("=")
            if sep:
                params[name.strip().lower()] = val.strip().strip('"')
        elements.append(params)
    return elements


def _loopback(address: str) -> bool:
    ip = parse_ip(address)
    return ip is not None and ip.is_loopback


def forwarded_client(xff: str | None, forwarded: str | None,
                     trusted: TrustedProxies) -> tuple[str | None, dict[str, str] | None]:
    """The client a trusted proxy forwards for, and the `Forwarded` element naming it (its
    `proto=`/`host=` describe the client's request); (None, None) when neither header is there.

    nginx, Caddy and Traefik append to `X-Forwarded-For`; HAProxy (`option forwarded`) and
    others to `Forwarded`. A proxy that writes one may pass the other on from the client
    unchecked, so when both name clients and they differ, a loopback one loses: a forged
    header can make a request look remote, never local. A header naming no address at all
    (`X-Forwarded-For: ,`) gives an unknown client, which is never loopback.
    """
    from_xff: str | None = None
    if xff is not None:
        hops = [h for h in xff.split(",") if h.strip()]
        index = trusted.client_index(hops)
        from_xff = hop_address(hops[index]) if index is not None else "unknown"
    from_forwarded: str | None = None
    element: dict[str, str] | None = None
    if forwarded:
        elements = forwarded_elements(forwarded)
        index = trusted.client_index([e.get("for", "unknown") for e in elements])
        if index is not None:
            from_forwarded, element = hop_address(elements[index].get("for", "unknown")), elements[index]
    if from_xff is None:
        return from_forwarded, element
    if from_forwarded is not None and _loopback(from_xff) and not _loopback(from_forwarded):
        return from_forwarded, element
    return from_xff, None


def real_client(peer: str, header: Callable[[str], str | None], trusted: TrustedProxies) -> str:
    """The client's address for a connection from `peer`; `header(name)` reads a request
    header. Forwarding headers count only when `peer` is a trusted proxy."""
    if not trusted or not trusted.contains(peer):
        return peer
    client, _ = forwarded_client(header("X-Forwarded-For"), header("Forwarded"), trusted)
    return client if client is not None else peer
