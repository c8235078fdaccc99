"""Trusted reverse proxies: the real client behind nginx (or Caddy, Traefik, HAProxy).

Behind a proxy every request arrives from the proxy's own address (usually
127.0.0.1), so without this layer every remote client would count as loopback
and need no key. `ProxyHeaders` wraps the Flask app as WSGI middleware, so it
runs before the request guard, the rate limiter, auth and logging. Only when the
socket peer is listed in `[api] trusted_proxies` (addresses or CIDRs) does it
apply what the proxy forwards:

* client address: `X-Forwarded-For` (or, when the proxy sends none, the `for=`
  values of the standard `Forwarded` header), read right to left, skipping
  trusted proxies; the right-most untrusted hop is the client. A client can put
  anything at the left of the list, but the proxies we trust append what they
  saw, so only the left part is forgeable and we never reach it.
* scheme (`X-Forwarded-Proto` / `proto=`), host (`X-Forwarded-Host`, plus
  `X-Forwarded-Port` / `host=`) and path prefix (`X-Forwarded-Prefix` becomes
  SCRIPT_NAME, so `url_for` builds prefixed links). A list in one of these
  headers means several proxies appended to it; the right-most value is the
  one our trusted peer sent.

From any other peer these headers are removed, so nothing downstream can read
a forged value by accident.

Why not waitress's own `trusted_proxy` or werkzeug's `ProxyFix`: waitress
trusts one exact address (or "*"), no list or CIDR, and both count a fixed
number of hops from the right instead of skipping trusted proxies, and neither
checks the peer per request (ProxyFix) or knows X-Forwarded-Prefix (waitress).
"""

from __future__ import annotations

import ipaddress
import logging
import re
from typing import Any, Callable, Iterable

log = logging.getLogger("agentd.proxy")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# WSGI keys of every header this layer interprets; stripped from untrusted peers.
FORWARDED_KEYS = ("HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_HOST",
                  "HTTP_X_FORWARDED_PORT", "HTTP_X_FORWARDED_PREFIX", "HTTP_FORWARDED")
# Where the socket peer is kept once REMOTE_ADDR names the real client (for logs).
PEER_KEY = "agentd.proxy_peer"

_HOST_RE = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::[0-9]{1,5})?$")
_PREFIX_RE = re.compile(r"^(?:/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)+/?$")
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


def _hop_address(hop: str) -> str:
    """A hop as REMOTE_ADDR: the normalised address, else the (bounded) token itself,
    which is never loopback to anything that checks."""
    ip = parse_ip(hop)
    if ip is not None:
        return str(ip)
    return hop.strip().strip('"')[:_MAX_HOP] or "unknown"


def _last(value: str | None) -> str:
    """The right-most comma-separated item of a header ('' when absent)."""
    if not value:
        return ""
    return value.rsplit(",", 1)[-1].strip()


def _forwarded_elements(value: str) -> list[dict[str, str]]:
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


class ProxyHeaders:
    """WSGI middleware applying forwarding headers from trusted peers only."""

    def __init__(self, app: Callable[..., Any], trusted: TrustedProxies) -> None:
        self.app = app
        self.trusted = trusted

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        peer = environ.get("REMOTE_ADDR", "")
        environ[PEER_KEY] = peer
        if self.trusted and self.trusted.contains(peer):
            self._apply(environ)
        for key in FORWARDED_KEYS:
            # Applied values live in the standard keys now; the raw headers are
            # dropped either way so no handler ever reads them directly.
            environ.pop(key, None)
        return self.app(environ, start_response)

    def client_index(self, hops: list[str]) -> int | None:
        """Index of the right-most hop that is not a trusted proxy (0 when all are;
        None when there are no hops). A hop that is no address at all (`unknown`,
        an obfuscated id) is never a proxy we trust, so it ends the walk."""
        for index in range(len(hops) - 1, -1, -1):
            ip = parse_ip(hops[index])
            if ip is None or not self.trusted.contains(ip):
                return index
        return 0 if hops else None

    def _apply(self, environ: dict[str, Any]) -> None:
        xff = environ.get("HTTP_X_FORWARDED_FOR")
        forwarded = environ.get("HTTP_FORWARDED")
        proto = _last(environ.get("HTTP_X_FORWARDED_PROTO")).lower()
        host = _last(environ.get("HTTP_X_FORWARDED_HOST"))
        port = _last(environ.get("HTTP_X_FORWARDED_PORT"))
        # X-Forwarded-For wins: it is what nginx, Caddy and Traefik append to. A
        # `Forwarded` header is used only from a proxy that sends no X-Forwarded-For
        # (otherwise it may simply be the client's own, passed through unchecked).
        hops: list[str] = []
        if xff is not None:
            hops = [h for h in xff.split(",") if h.strip()]
        elif forwarded:
            elements = _forwarded_elements(forwarded)
            hops = [e.get("for", "unknown") for e in elements]
            index = self.client_index(hops)
            if index is not None:
                # The element the first proxy appended describes the client's own
                # request: the Host it asked for and the scheme it used.
                proto = proto or elements[index].get("proto", "").lower()
                host = host or elements[index].get("host", "")
        index = self.client_index(hops)
        if index is not None:
            client = _hop_address(hops[index])
            environ["REMOTE_ADDR"] = client
            environ["REMOTE_HOST"] = client
        if proto in ("http", "https"):
            environ["wsgi.url_scheme"] = proto
        if port and not port.isdigit():
            port = ""
        if host or port:
            self._set_host(environ, host or environ.get("HTTP_HOST", ""), port)
        prefix = _last(environ.get("HTTP_X_FORWARDED_PREFIX"))
        if prefix and _PREFIX_RE.match(prefix) and "/../" not in prefix + "/" and "/./" not in prefix + "/":
            environ["SCRIPT_NAME"] = prefix.rstrip("/") + environ.get("SCRIPT_NAME", "")

    @staticmethod
    def _set_host(environ: dict[str, Any], host: str, port: str) -> None:
        """Make `host` (with `port` replacing its own, when given) the request's Host."""
        if not host or len(host) > 255 or not _HOST_RE.match(host):
            return
        if host.startswith("["):
            end = host.index("]")
            name, own_port = host[:end + 1], host[end + 2:]
        else:
            name, _, own_port = host.partition(":")
        port = port or own_port
        default = "443" if environ["wsgi.url_scheme"] == "https" else "80"
        environ["HTTP_HOST"] = name if port in ("", default) else f"{name}:{port}"
        environ["SERVER_NAME"] = name.strip("[]")
        environ["SERVER_PORT"] = port or default


def install_proxy_headers(app: Any, trusted_proxies: Iterable[str]) -> None:
    """Wrap `app.wsgi_app` (a Flask app) so every request passes through `ProxyHeaders`."""
    trusted = TrustedProxies(trusted_proxies)
    app.wsgi_app = ProxyHeaders(app.wsgi_app, trusted)
    if trusted:
        log.info("trusting forwarding headers from %s", ", ".join(str(n) for n in trusted.networks))
