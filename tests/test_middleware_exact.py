"""agentd/api/middleware.py: near misses of the loopback check that the table in
test_core_exact.py does not cover (addresses with text around them, scope ids)."""

from __future__ import annotations

import pytest

from agentd.api.middleware import is_loopback


@pytest.mark.parametrize("addr, expected", [
    ("::1%lo", True), ("::1%1", True), ("::ffff:127.0.0.1%lo", True), ("fe80::1%lo", False),
    # A REMOTE_ADDR that is no address (a forwarded hop token) is never loopback, even when
    # it starts like one.
    ("127.0.0.1 evil", False), ("127.0.0.1%lo", False), ("127.0.0.1, 203.0.113.7", False),
    (" 127.0.0.1", False), ("127.0.0.1:80", False), ("[::1]", False), ("unknown", False),
])
def test_loopback_near_misses(addr: str, expected: bool) -> None:
    assert is_loopback(addr) is expected, f"BUG: {addr!r} judged {'not ' if expected else ''}loopback"


def test_the_start_gates_limiter_is_used(tmp_path) -> None:
    """The daemon counts requests in its start gate before the app loads and hands that
    limiter to the app (`app.extensions["agentd.limiter"]`): the app must keep counting on it."""
    from flask import Flask, jsonify

    from agentd.api.errors import register_error_handlers
    from agentd.api.middleware import install_middleware
    from agentd.api.ratelimit import GcraLimiter
    from agentd.config import parse_config

    now = [1000.0]
    config = parse_config({"api": {"rate_limit_per_second": 1, "rate_limit_burst": 5}}, tmp_path)
    gate = GcraLimiter(1, 5, clock=lambda: now[0])
    for _ in range(4):   # four requests already answered by the start gate
        assert gate.hit("127.0.0.1").allowed
    app = Flask("gate-test")
    app.extensions["agentd.limiter"] = gate
    install_middleware(app, config, clock=lambda: now[0])
    register_error_handlers(app)
    app.add_url_rule("/api/ping", "ping", lambda: jsonify({"ok": True}))
    client = app.test_client()
    assert client.get("/api/ping").status_code == 200
    r = client.get("/api/ping")
    assert r.status_code == 429, "BUG: the app started a fresh rate-limit budget instead of the start gate's"
    assert r.headers["X-RateLimit-Remaining"] == "0"


def test_dashboard_sessions_use_the_configured_key(tmp_path) -> None:
    """A login cookie signed before a restart (same api_key) still reads in the new app."""
    from flask import Flask

    from agentd.api import dashauth
    from agentd.api.middleware import install_middleware
    from agentd.config import parse_config

    config = parse_config({"api_key": "mw-k3y"}, tmp_path)
    app = Flask("sessions-test")
    install_middleware(app, config)
    cookie, data = dashauth.Sessions("mw-k3y").issue(authenticated=True)
    assert app.extensions["agentd.sessions"].read(cookie) == data, \
        "BUG: the dashboard's sessions are not signed with the configured API key"
