"""Which Host headers and browser origins a keyless daemon answers (no web framework here).

The request guard (agentd/api/guard.py) applies these to every request the app sees; the
early refusal (agentd/server/early_refusal.py) applies them to a request whose body has not
arrived yet, before waitress reads it; `agentd doctor` reads listen names with `host_name`.
See the guard's docstring for why.
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
import re
from typing import Iterable

from agentd.config import Config

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
CROSS_SITE_VALUES = frozenset({"cross-site", "same-site"})
CROSS_SITE_MESSAGE = "cross-site request refused"
HOST_MESSAGE = "host not allowed"
HOST_CHARS = re.compile(r"[a-z0-9._:%-]+")  # what a DNS name or an IP literal (zone included) holds


def allowed_origins(config: Config) -> set[str]:
    """The browser origins that may call the daemon, for CORS and the guard alike (the spec's
    list): the loopback forms of its own port and of the dev ports 3000 and 8080, plus
    `[api] cors_origins` when an API key protects the daemon."""
    origins: set[str] = set()
    for port in {config.port, 3000, 8080}:
        origins.add(f"http://127.0.0.1:{port}")
        origins.add(f"http://localhost:{port}")
    if config.api_key:
        origins.update(config.api.cors_origins)
    return origins


def host_name(host_header: str) -> str:
    """The name part of a Host header: lowercase, no port, no brackets, no trailing dot."""
    host = host_header.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else host
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


# Every request is judged twice (as its head arrives and in the app), nearly always with the
# same one or two names: parsing an address costs more than the rest of the check.
@functools.lru_cache(maxsize=256)
def _is_loopback_host(name: str) -> bool:
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class HostPolicy:
    """Which Host headers the daemon answers."""

    def __init__(self, listen_host: str, allowed: Iterable[str]) -> None:
        self.listen_host = host_name(listen_host)
        self.any = False
        self.exact: set[str] = set()
        self.patterns: list[str] = []
        for entry in allowed:
            entry = entry.strip().lower().rstrip(".")
            if entry == "*":
                self.any = True
            elif "*" in entry:
                self.patterns.append(entry)
            else:
                # A blank entry adds "", which never matches: an empty name is refused first.
                self.exact.add(host_name(entry))

    def allows(self, host_header: str | None) -> bool:
        """True when a request carrying this Host header may be served."""
        if self.any or host_header is None:
            # No Host header at all (HTTP/1.0): not a browser on a rebinding name.
            return True
        name = host_name(host_header)
        if not HOST_CHARS.fullmatch(name):
            return False  # empty, or not a host name at all (`evil.com/.example.com`)
        if _is_loopback_host(name) or name == self.listen_host or name in self.exact:
            return True
        # `*.example.com` matches sub.example.com (any depth), never example.com itself.
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)


class OriginPolicy:
    """Which browser origins may send state-changing requests."""

    def __init__(self, port: int, allowed: Iterable[str]) -> None:
        # The daemon's own loopback origins are the same daemon under another name.
        self.own = {f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}"}
        # Other sites allowed_origins(config) lets in: cross-site by definition, so a browser's
        # Sec-Fetch-Site does not count against them (it does against the daemon's own).
        self.configured = {o.rstrip("/").lower() for o in allowed} - self.own

    def refuses(self, method: str, origin: str | None, fetch_site: str | None, own_origin: str,
                upgrade: str | None = None) -> bool:
        """True when this request is a cross-site state change.

        A WebSocket handshake is a GET, but the socket sends messages to agents and
        browsers apply no CORS to it, so it is judged like a POST.
        """
        if method not in STATE_CHANGING and (upgrade or "").lower() != "websocket":
            return False
        crossing = fetch_site is not None and fetch_site.strip().lower() in CROSS_SITE_VALUES
        if origin is None:
            return crossing
        normalized = origin.strip().rstrip("/").lower()
        if normalized in self.configured:
            return False  # a configured origin is another site by definition
        # `Origin: null` (sandboxed frames, file: pages) is never trusted; the daemon's own
        # origin is, unless the browser says the request came from another site.
        return crossing or not (normalized == own_origin.lower() or normalized in self.own)
