"""Cross-cutting HTTP behaviour, in this order: request id, CORS preflight,
rate limit, auth; and on the way out: rate-limit, CORS and security headers.

Rate limiting runs before auth so a flood of bad keys is throttled too.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import math
import time

from flask import Flask, Response, g, request

from agentd.api import dashauth
from agentd.api.errors import error_response
from agentd.api.ratelimit import GcraLimiter
from agentd.ids import random_uuid
from agentd.config import Config

log = logging.getLogger("agentd.http")

PUBLIC_GET = {"/api/health", "/api/version", "/", "/favicon.ico"}
# The API description documents nothing secret (issue 21); the page listing it (/api) is
# the dashboard's and passes here so the dashboard's own gate can send a browser to /login.
PUBLIC_GET |= {"/api/openapi.json", "/api"}
CORS_ALLOW_HEADERS = "Authorization, Content-Type, X-API-Key, X-Request-Id"
CORS_ALLOW_METHODS = "GET, POST, PUT, DELETE, OPTIONS"
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def is_loopback(addr: str | None) -> bool:
    """True for 127.0.0.0/8 and ::1 (and IPv4-mapped loopback)."""
    if not addr:
        return False
    return _is_loopback(addr)


@functools.lru_cache(maxsize=1024)  # every request asks, about the same few clients
def _is_loopback(addr: str) -> bool:
    try:
        # Python parses an IPv6 scope id itself (`::1%lo` is loopback); an IPv4 address
        # never carries one, so `127.0.0.1%x` is no address at all.
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def allowed_origins(config: Config) -> set[str]:
    """CORS origins per the spec: localhost forms of the port and dev ports 3000/8080,
    plus `[api] cors_origins` when an API key protects the daemon."""
    origins: set[str] = set()
    for port in {config.port, 3000, 8080}:
        origins.add(f"http://127.0.0.1:{port}")
        origins.add(f"http://localhost:{port}")
    if config.api_key:
        origins.update(config.api.cors_origins)
    return origins


def _is_public(path: str, method: str) -> bool:
    if method not in ("GET", "HEAD"):
        return False
    return path in PUBLIC_GET or path.startswith("/static/")


def _presented_key() -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":  # the scheme is case-insensitive (RFC 7235)
        return auth[7:].strip()
    if "X-API-Key" in request.headers:
        return request.headers["X-API-Key"].strip()
    return request.args.get("token")


def is_authorized(config: Config) -> bool:
    """Whether this request carries the configured key (or is loopback with no key set)."""
    if not config.api_key:
        return is_loopback(request.remote_addr)
    presented = _presented_key()
    if presented is None:
        # The dashboard's own fetch/SSE calls carry its login cookie instead of the key.
        return dashauth.cookie_authenticates()
    return hmac.compare_digest(presented.encode(), config.api_key.encode())


def install_middleware(app: Flask, config: Config, clock=time.monotonic) -> None:
    """Register the before/after hooks on `app` (`clock` drives the rate limiter; tests pass a fake)."""
    limiter = app.extensions.get("agentd.limiter") or GcraLimiter(
        config.api.rate_limit_per_second, config.api.rate_limit_burst, clock=clock)
    origins = allowed_origins(config)
    # The dashboard session authority comes from the same config as the key check.
    app.extensions.setdefault("agentd.sessions", dashauth.Sessions(config.api_key))

    @app.before_request
    def _start() -> Response | None:
        g.request_id = random_uuid().hex
        g.started = time.perf_counter()
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS" and origin and "Access-Control-Request-Method" in request.headers:
            if origin.rstrip("/") not in origins:
                return error_response(403, f"CORS origin {origin} is not allowed")
            response = Response(status=204)
            response.headers["Access-Control-Allow-Methods"] = CORS_ALLOW_METHODS
            response.headers["Access-Control-Allow-Headers"] = CORS_ALLOW_HEADERS
            response.headers["Access-Control-Max-Age"] = "600"
            return response
        return None

    @app.before_request
    def _rate_limit() -> Response | None:
        path = request.path
        if not (path.startswith("/api/") or path.startswith("/v1/")):
            return None
        decision = limiter.hit(request.remote_addr or "unknown")
        g.rate = decision
        if not decision.allowed:
            return error_response(429, "rate limit exceeded: too many requests from this client",
                                  code="rate_limit_exceeded", retry_after=decision.retry_after)
        return None

    @app.before_request
    def _auth() -> Response | None:
        if _is_public(request.path, request.method) or request.blueprint == "pages":
            # Dashboard pages authenticate themselves (login redirect, CSRF on forms).
            return None
        if is_authorized(config):
            if (config.api_key and _presented_key() is None and request.method in STATE_CHANGING
                    and not dashauth.csrf_ok(request.headers.get(dashauth.CSRF_HEADER) or "")):
                # Authenticated by the dashboard cookie alone: a change needs the CSRF header too.
                return error_response(403, f"missing or invalid CSRF token: send {dashauth.CSRF_HEADER}")
            return None
        if not config.api_key:
            response = error_response(
                401, "API key required for non-loopback clients: set api_key in config.toml "
                     "(or AGENTD_API_KEY) and send Authorization: Bearer <key>, or bind to 127.0.0.1")
        elif _presented_key() is None:
            response = error_response(401, "missing API key: send Authorization: Bearer <api_key>")
        else:
            response = error_response(401, "invalid API key")
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    @app.after_request
    def _headers(response: Response) -> Response:
        headers = response.headers
        # Setting a header scans the whole list for earlier values; most of these names are
        # new on most responses, so look once and append where nothing is there.
        present = {name.lower() for name in headers.keys()}

        def put(name: str, value: str) -> None:
            if name.lower() in present:
                headers[name] = value
            else:
                headers.add(name, value)

        def default(name: str, value: str) -> None:
            if name.lower() not in present:
                headers.add(name, value)

        put("X-Request-Id", getattr(g, "request_id", "") or random_uuid().hex)
        decision = getattr(g, "rate", None)
        if decision is not None:
            put("X-RateLimit-Limit", str(config.api.rate_limit_burst))
            put("X-RateLimit-Remaining", str(decision.remaining))
            put("X-RateLimit-Reset", str(math.ceil(decision.reset_after)))
        origin = request.headers.get("Origin")
        if origin and origin.rstrip("/") in origins:
            put("Access-Control-Allow-Origin", origin)
            headers.add("Vary", "Origin")
        default("X-Content-Type-Options", "nosniff")
        default("X-Frame-Options", "DENY")
        default("Referrer-Policy", "strict-origin-when-cross-origin")
        if request.path.startswith(("/api/", "/v1/")):
            if response.mimetype != "text/event-stream":
                # Event streams keep their `no-cache` (agentd.api.sse), which proxies know.
                put("Cache-Control", "no-store")
            default("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
        if log.isEnabledFor(logging.DEBUG):
            took = (time.perf_counter() - getattr(g, "started", time.perf_counter())) * 1000
            # remote_addr is the real client; behind a trusted proxy the peer is noted too.
            peer = request.environ.get("agentd.proxy_peer", request.remote_addr)
            via = f" via {peer}" if peer != request.remote_addr else ""
            log.debug("%s %s -> %s (%.1f ms, request %s, client %s%s)", request.method, request.path,
                      response.status_code, took, headers["X-Request-Id"], request.remote_addr, via)
        return response
