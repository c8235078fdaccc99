"""Cross-cutting HTTP behaviour, in this order: CORS preflight, rate limit, auth; on
the way out the rate-limit, CORS and security headers (agentd/api/response_headers.py).

Rate limiting runs before auth so a flood of bad keys is throttled too.
"""

from __future__ import annotations

import functools
import ipaddress
import time
from typing import Iterable

from flask import Flask, Request, Response, g, request

from agentd.api import dashauth
from agentd.api.errors import error_response
from agentd.api.ratelimit import GcraLimiter
from agentd.api.response_headers import RATE, ResponseHeaders
from agentd.config import Config
from agentd.errors import Unauthorized
from agentd.server.webguard import allowed_origins

PUBLIC_GET = {"/api/health", "/api/version", "/", "/favicon.ico"}
# The API description documents nothing secret; the page listing it (/api) is
# the dashboard's and passes here so the dashboard's own gate can send a browser to /login.
PUBLIC_GET |= {"/api/openapi.json", "/api"}
A2A_CARDS = ("/.well-known/agent-card.json", "/.well-known/agent.json")
CORS_ALLOW_HEADERS = "Authorization, Content-Type, X-API-Key, X-Request-Id"
CORS_ALLOW_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
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


def _is_public(path: str, method: str) -> bool:
    if method not in ("GET", "HEAD"):
        return False
    return path in PUBLIC_GET or path.startswith("/static/")


def is_agent_card(path: str, method: str) -> bool:
    """An A2A agent card: public when a key protects the daemon, since a remote client reads
    it to learn how to authenticate (keyless, only loopback clients are served anyway)."""
    return method in ("GET", "HEAD") and (path in A2A_CARDS or (
        path.startswith("/a2a/agents/") and path.endswith(A2A_CARDS)))


def _presented_key() -> str | None:
    from agentd.api.principal import presented_key

    return presented_key()


def is_authorized(config: Config) -> bool:
    """Whether this request carries the admin key or a valid scoped key, or a dashboard
    login (or is loopback with no key set)."""
    from agentd.api.principal import current

    try:
        return current(config) is not None
    except Unauthorized:
        return False


def install_middleware(app: Flask, config: Config, clock=time.monotonic,
                       fixed_headers: Iterable[tuple[str, str]] = ()) -> None:
    """Register the before-request hooks on `app` and wrap it in the response-header layer
    (`clock` drives the rate limiter; tests pass a fake; `fixed_headers` go on every answer)."""
    limiter = app.extensions.get("agentd.limiter") or GcraLimiter(
        config.api.rate_limit_per_second, config.api.rate_limit_burst, clock=clock)
    origins = allowed_origins(config)
    # The dashboard session authority comes from the same config as the key check.
    app.extensions.setdefault("agentd.sessions", dashauth.Sessions(config.api_key))

    # The common response headers are added as the answer leaves (response_headers.py).
    app.wsgi_app = ResponseHeaders(app.wsgi_app, origins, config.api.rate_limit_burst,  # type: ignore[method-assign]
                                   fixed_headers)

    # One hook, in this order: CORS preflight, rate limit, auth. It runs on every request
    # and takes the request from its proxy once.
    @app.before_request
    def _front() -> Response | None:
        req = request._get_current_object()
        g._get_current_object().started = time.perf_counter()
        refusal = _preflight(req)
        if refusal is None:
            refusal = _rate_limit(req)
        return _auth(req) if refusal is None else refusal

    def _preflight(req: Request) -> Response | None:
        if req.method != "OPTIONS":
            return None
        origin = req.headers.get("Origin")
        if origin and "Access-Control-Request-Method" in req.headers:
            if origin.rstrip("/") not in origins:
                return error_response(403, f"CORS origin {origin} is not allowed")
            response = Response(status=204)
            response.headers["Access-Control-Allow-Methods"] = CORS_ALLOW_METHODS
            response.headers["Access-Control-Allow-Headers"] = CORS_ALLOW_HEADERS
            response.headers["Access-Control-Max-Age"] = "600"
            return response
        return None

    def _rate_limit(req: Request) -> Response | None:
        if (not req.path.startswith(("/api/", "/v1/", "/a2a", "/.well-known/")) and req.path not in ("/metrics", "/mcp")
                and req.blueprint != "webhooks"):
            return None
        decision = limiter.hit(req.remote_addr or "unknown")
        req.environ[RATE] = decision
        if not decision.allowed:
            return error_response(429, "rate limit exceeded: too many requests from this client",
                                  code="rate_limit_exceeded", retry_after=decision.retry_after)
        return None

    from agentd.api import principal

    limits = app.extensions.setdefault("agentd.key_limits", principal.KeyLimits())

    def _auth(req: Request) -> Response | None:
        if (_is_public(req.path, req.method) or req.blueprint in ("pages", "webhooks")
                or (config.api_key and is_agent_card(req.path, req.method))):
            # Dashboard pages authenticate themselves (login redirect, CSRF on forms);
            # chat platforms' webhooks by their signatures (agentd/api/routes_webhooks.py).
            return None
        try:
            who = principal.current(config)
        except Unauthorized as exc:
            response = error_response(401, exc.message)
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        if who is not None:
            if (config.api_key and _presented_key() is None and req.method in STATE_CHANGING
                    and not dashauth.csrf_ok(req.headers.get(dashauth.CSRF_HEADER) or "")):
                # Authenticated by the dashboard cookie alone: a change needs the CSRF header too.
                return error_response(403, f"missing or invalid CSRF token: send {dashauth.CSRF_HEADER}")
            # The key's scopes, agent list and rate limit (agentd/api/principal.py).
            return principal.authorize(who, limits)
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
