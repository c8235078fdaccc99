"""Trusted reverse proxies: the real client behind nginx (or Caddy, Traefik, HAProxy).

Behind a proxy every request arrives from the proxy's own address (usually
127.0.0.1), so without this layer every remote client would count as loopback
and need no key. `ProxyHeaders` wraps the Flask app as WSGI middleware, so it
runs before the request guard, the rate limiter, auth and logging. Only when the
socket peer is listed in `[api] trusted_proxies` (addresses or CIDRs) does it
apply what the proxy forwards:

* client address: `X-Forwarded-For` or the `for=` values of the standard
  `Forwarded` header (with both, a loopback client named by one loses to a remote
  one named by the other), read right to left, skipping trusted proxies; the
  right-most untrusted hop is the client. A client can put
  anything at the left of the list, but the proxies we trust append what they
  saw, so only the left part is forgeable and we never reach it. (The walk itself
  is in agentd/server/forwarded.py, shared with the channel webhook listeners.)
* scheme (`X-Forwarded-Proto` / `proto=`), host (`X-Forwarded-Host`, plus
  `X-Forwarded-Port` / `host=`) and path prefix (`X-Forwarded-Prefix` becomes
  SCRIPT_NAME, so `url_for` builds prefixed links). A list in one of these
  headers means several proxies appended to it; the right-most value is the
  one our trusted peer sent.

From any other peer these headers are removed, so nothing downstream can read
a forged value by accident.

Why not waitress's own `trusted_proxy` or werkzeug's `ProxyFix`: both count a
fixed number of hops from the right instead of skipping trusted proxies;
waitress trusts one exact address (or "*"), no list or CIDR, and knows no
X-Forwarded-Prefix; ProxyFix never looks at the peer at all. waitress's header
clearing is turned off when trusted_proxies is set (agentd/daemon.py), because
it would remove the headers before this layer could judge them.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Iterable

from agentd.server.forwarded import TrustedProxies, forwarded_client, parse_ip, parse_networks

__all__ = ["ARRIVED_HOST_KEY", "ProxyHeaders", "TrustedProxies", "install_proxy_headers", "parse_ip", "parse_networks"]

log = logging.getLogger("agentd.proxy")

# WSGI keys of every header this layer interprets; stripped from untrusted peers.
FORWARDED_KEYS = ("HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_HOST",
                  "HTTP_X_FORWARDED_PORT", "HTTP_X_FORWARDED_PREFIX", "HTTP_FORWARDED")
_FORWARDED = frozenset(FORWARDED_KEYS)
# Where the socket peer is kept once REMOTE_ADDR names the real client (for logs).
PEER_KEY = "agentd.proxy_peer"
# The Host a loopback peer's request arrived with, before a forwarded host replaced it: the
# guard judges it too. A browser on this machine is a loopback peer as much as a local proxy,
# and may set X-Forwarded-Host itself; after DNS rebinding only its own Host gives it away.
ARRIVED_HOST_KEY = "agentd.arrived_host"

_HOST_RE = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::[0-9]{1,5})?$")
# A forwarded port: ASCII digits only (str.isdigit also accepts "０" and "²").
_PORT_RE = re.compile(r"^[0-9]{1,5}$")
_PREFIX_RE = re.compile(r"^(?:/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)+/?$")


def _last(value: str | None) -> str:
    """The right-most comma-separated item of a header ('' when absent)."""
    if not value:
        return ""
    return value.rpartition(",")[2].strip()


class ProxyHeaders:
    """WSGI middleware applying forwarding headers from trusted peers only."""

    def __init__(self, app: Callable[..., Any], trusted: TrustedProxies) -> None:
        self.app = app
        self.trusted = trusted

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        peer = environ.get("REMOTE_ADDR", "")
        environ[PEER_KEY] = peer
        if self.trusted and self.trusted.contains(peer):
            ip = parse_ip(peer)
            if ip is not None and ip.is_loopback:
                environ[ARRIVED_HOST_KEY] = environ.get("HTTP_HOST")
            self._apply(environ)
        # Applied values live in the standard keys now; the raw headers are dropped
        # either way so no handler ever reads them directly.
        for key in _FORWARDED.intersection(environ):
            del environ[key]
        return self.app(environ, start_response)

    def _apply(self, environ: dict[str, Any]) -> None:
        xff = environ.get("HTTP_X_FORWARDED_FOR")
        forwarded = environ.get("HTTP_FORWARDED")
        proto = _last(environ.get("HTTP_X_FORWARDED_PROTO")).lower()
        host = _last(environ.get("HTTP_X_FORWARDED_HOST"))
        port = _last(environ.get("HTTP_X_FORWARDED_PORT"))
        client, element = forwarded_client(xff, forwarded, self.trusted)
        if element is not None:
            # The element the first proxy appended describes the client's own request:
            # the Host it asked for and the scheme it used.
            proto = proto or element.get("proto", "").lower()
            host = host or element.get("host", "")
        if client is not None:
            environ["REMOTE_ADDR"] = client
            environ["REMOTE_HOST"] = client
        if proto in ("http", "https"):
            environ["wsgi.url_scheme"] = proto
        if not _PORT_RE.match(port):
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


def install_proxy_headers(app: Any, trusted_proxies: Iterable[str] | TrustedProxies) -> None:
    """Wrap `app.wsgi_app` (a Flask app) so every request passes through `ProxyHeaders`."""
    trusted = trusted_proxies if isinstance(trusted_proxies, TrustedProxies) else TrustedProxies(trusted_proxies)
    app.wsgi_app = ProxyHeaders(app.wsgi_app, trusted)
    if trusted:
        log.info("trusting forwarding headers from %s", ", ".join(str(n) for n in trusted.networks))
