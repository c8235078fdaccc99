"""agentd/api/middleware.py: near misses of the loopback check that the table in
tests/api/test_core.py does not cover (addresses with text around them, scope ids)."""

from __future__ import annotations

import time

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


def test_response_headers_replace_what_a_view_set_and_keep_what_it_chose(tmp_path) -> None:
    """The after-request hook sets its headers once each: the request id, rate-limit and
    Cache-Control values replace a view's own; the security headers are defaults a view may
    override; Vary is added to a view's."""
    from flask import Flask, Response

    from agentd.api.middleware import install_middleware
    from agentd.config import parse_config

    config = parse_config({"api": {"rate_limit_per_second": 5, "rate_limit_burst": 7}}, tmp_path)
    app = Flask("headers-test")
    install_middleware(app, config)

    def view() -> Response:
        r = Response("{}", content_type="application/json")
        for name, value in [("X-Request-Id", "mine"), ("X-RateLimit-Limit", "1"), ("X-RateLimit-Remaining", "1"),
                            ("X-RateLimit-Reset", "9"), ("Cache-Control", "public"), ("Vary", "Accept"),
                            ("X-Frame-Options", "SAMEORIGIN"), ("Referrer-Policy", "no-referrer"),
                            ("X-Content-Type-Options", "other"), ("Content-Security-Policy", "default-src 'self'"),
                            ("Access-Control-Allow-Origin", "http://elsewhere")]:
            r.headers[name] = value
        return r

    app.add_url_rule("/api/own", "own", view)
    app.add_url_rule("/plain", "plain", lambda: Response("x"))
    origin = f"http://127.0.0.1:{config.port}"
    r = app.test_client().get("/api/own", headers={"Origin": origin}, environ_base={"REMOTE_ADDR": "127.0.0.1"})
    got = [(k, v) for k, v in r.headers.items() if k not in ("Content-Type", "Content-Length")]
    request_id = r.headers["X-Request-Id"]
    assert len(request_id) == 32 and request_id != "mine"
    assert sorted(got) == sorted([
        ("X-Request-Id", request_id), ("X-RateLimit-Limit", "7"), ("X-RateLimit-Remaining", "6"),
        ("X-RateLimit-Reset", "1"), ("Cache-Control", "no-store"), ("Vary", "Accept"), ("Vary", "Origin"),
        ("X-Frame-Options", "SAMEORIGIN"), ("Referrer-Policy", "no-referrer"), ("X-Content-Type-Options", "other"),
        ("Content-Security-Policy", "default-src 'self'"), ("Access-Control-Allow-Origin", origin)])
    # Fixed headers (the daemon's name) replace a view's own, whatever their case.
    named = Flask("fixed-test")
    install_middleware(named, config, fixed_headers=[("X-Agentd-Daemon", "d-1")])
    named.add_url_rule("/api/own", "own", lambda: Response("{}", headers={"x-agentd-daemon": "other"}))
    for path in ("/api/own", "/missing"):
        answer = named.test_client().get(path, environ_base={"REMOTE_ADDR": "127.0.0.1"})
        assert [(k, v) for k, v in answer.headers.items() if k.lower() == "x-agentd-daemon"] == [
            ("X-Agentd-Daemon", "d-1")], path
    plain = app.test_client().get("/plain", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert [(k, v) for k, v in plain.headers.items() if k not in ("Content-Type", "Content-Length")] == [
        ("X-Request-Id", plain.headers["X-Request-Id"]), ("X-Content-Type-Options", "nosniff"),
        ("X-Frame-Options", "DENY"), ("Referrer-Policy", "strict-origin-when-cross-origin")]


def test_response_headers_match_names_in_any_case_and_log_each_answer(tmp_path, caplog) -> None:
    """Header names are case-insensitive: a view's `cache-control` is replaced, not doubled;
    an event stream (with a charset) keeps its own; an origin with a trailing slash counts;
    the debug log names status, time, request id and the proxy a client came through."""
    import logging

    from flask import Flask, Response

    from agentd.api.middleware import install_middleware
    from agentd.api.response_headers import API_CSP
    from agentd.config import parse_config

    config = parse_config({}, tmp_path)
    app = Flask("headers-case")
    install_middleware(app, config)

    def slow() -> Response:
        time.sleep(0.03)
        return Response("{}", status=404, headers={"cache-control": "max-age=60", "x-frame-options": "SAMEORIGIN"})

    app.add_url_rule("/api/lower", "lower", slow)
    app.add_url_rule("/v1/events", "events", lambda: Response(
        "data: x\n\n", headers={"Cache-Control": "no-cache", "Content-Type": "Text/Event-Stream; charset=utf-8"}))
    client = app.test_client()
    origin = f"http://localhost:{config.port}"
    with caplog.at_level(logging.DEBUG, logger="agentd.http"):
        r = client.get("/api/lower", headers={"Origin": origin + "/"},
                       environ_base={"REMOTE_ADDR": "127.0.0.2", "agentd.proxy_peer": "10.9.8.7"})
    assert r.headers.getlist("Cache-Control") == ["no-store"]
    assert r.headers.getlist("X-Frame-Options") == ["SAMEORIGIN"]
    assert ("Content-Security-Policy", API_CSP) in list(r.headers.items()), "BUG: the header's name is not as sent"
    assert r.headers["Access-Control-Allow-Origin"] == origin + "/"
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "agentd.http"]
    assert len(lines) == 1, lines
    head, _, rest = lines[0].partition(" (")
    took = float(rest.split(" ms,", 1)[0])
    assert head == "GET /api/lower -> 404" and 30 <= took < 5000, lines
    assert rest.endswith(f"request {r.headers['X-Request-Id']}, client 127.0.0.2 via 10.9.8.7)"), lines
    stream = client.get("/v1/events", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert stream.headers.getlist("Cache-Control") == ["no-cache"]
    assert stream.headers["Content-Security-Policy"] == API_CSP
    assert client.get("/api/lower").headers["X-Request-Id"] != r.headers["X-Request-Id"]


def test_the_header_layer_passes_an_errors_exc_info_on() -> None:
    from agentd.api.response_headers import ResponseHeaders

    got: list = []
    try:
        raise ValueError("late failure")
    except ValueError:
        import sys
        info = sys.exc_info()

    def app(environ, start_response):
        start_response("500 INTERNAL SERVER ERROR", [("Content-Type", "text/plain")], info)
        return [b"x"]

    layer = ResponseHeaders(app, set(), burst=5, fixed=[("X-Agentd-Daemon", "d")])
    assert b"".join(layer({"REQUEST_METHOD": "GET", "PATH_INFO": "/x"},
                          lambda status, headers, exc_info=None: got.append((status, dict(headers), exc_info)))) == b"x"
    assert got[0][0].startswith("500") and got[0][1]["X-Agentd-Daemon"] == "d"
    assert got[0][2] is info, "BUG: the app's exc_info did not reach the server"


def test_the_header_layer_takes_an_environ_without_a_path() -> None:
    from agentd.api.response_headers import REQUEST_ID, ResponseHeaders

    seen: list[tuple[str, list[tuple[str, str]]]] = []

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [environ[REQUEST_ID].encode()]

    layer = ResponseHeaders(app, set(), burst=5)
    body = b"".join(layer({"REQUEST_METHOD": "GET"}, lambda status, headers, exc=None: seen.append((status, headers))))
    assert seen == [("200 OK", [("Content-Type", "text/plain"), ("X-Request-Id", body.decode()),
                                ("X-Content-Type-Options", "nosniff"), ("X-Frame-Options", "DENY"),
                                ("Referrer-Policy", "strict-origin-when-cross-origin")])]


def test_an_unexpected_error_outside_the_header_layer_names_no_request_id() -> None:
    """The error handlers on an app without the response-header layer (no request id in the
    environ) still answer 500 in the API's shape, naming the id as "-"."""
    from flask import Flask

    from agentd.api.errors import register_error_handlers

    app = Flask("errors-alone")
    register_error_handlers(app)

    def boom():
        raise RuntimeError("boom")

    app.add_url_rule("/api/boom", "boom", boom)
    r = app.test_client().get("/api/boom")
    assert r.status_code == 500 and r.get_json() == {"error": "internal server error (request id -)"}
