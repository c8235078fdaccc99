"""agentd/server/early_refusal.py: requests judged once their headers are in, body still due.

The daemon-level checks (a refused request answered although its body never comes, no
100 Continue, an allowed slow body still read) are in tests/api/test_web_security.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from waitress.adjustments import Adjustments

from agentd.server.early_refusal import EarlyRefusal, GuardedParser, request_check
from agentd.config import parse_config


def parser(calls: list, answer=None) -> GuardedParser:
    def check(p: GuardedParser):
        calls.append((p.command, p.path, dict(p.headers)))
        return answer
    return GuardedParser(Adjustments(), check)


HEAD = b"POST /api/x HTTP/1.1\r\nHost: 127.0.0.1:4200\r\nContent-Length: 10\r\n\r\n"


def test_judged_once_when_the_headers_are_in_and_a_body_is_due() -> None:
    calls: list = []
    p = parser(calls)
    assert p.received(HEAD[:20]) == 20 and calls == []
    assert p.received(HEAD[20:] + b"01234") == len(HEAD) - 20, "the headers only: the body is parsed next"
    assert [c[:2] for c in calls] == [("POST", "/api/x")]
    assert p.received(b"01234") == 5 and p.received(b"56789") == 5
    assert p.completed and p.error is None and len(calls) == 1, "asked once, not per body read"


def test_a_request_without_a_body_is_left_to_the_app() -> None:
    calls: list = []
    p = parser(calls, (403, "no"))
    p.received(b"GET / HTTP/1.1\r\nHost: h\r\nOrigin: http://evil.example\r\n\r\n")
    assert p.completed and p.error is None and calls == []


def test_a_refusal_completes_the_request_and_swallows_the_read() -> None:
    calls: list = []
    p = parser(calls, (403, "cross-site request refused"))
    data = HEAD.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n") + b"0123"
    assert p.received(data) == len(data), "the rest of the read is the refused body"
    assert p.completed and p.expect_continue is False
    assert isinstance(p.error, EarlyRefusal)
    status, headers, body = p.error.to_response("agentd")
    assert (status, body) == ("403 Forbidden", b'{"error": "cross-site request refused"}')
    assert headers[:3] == [("Content-Type", "application/json"), ("X-Content-Type-Options", "nosniff"),
                           ("Cache-Control", "no-store")]
    assert headers[3][0] == "X-Request-Id" and len(headers[3][1]) == 32 and len(headers) == 4
    assert EarlyRefusal(400, "host not allowed").to_response()[0] == "400 Bad Request"


def test_a_parse_error_is_waitress_own() -> None:
    calls: list = []
    p = parser(calls, (403, "no"))
    p.received(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: nope\r\n\r\n")
    assert calls == [] and p.error is not None and not isinstance(p.error, EarlyRefusal)


def test_a_refusal_is_one_log_line(caplog) -> None:
    p = parser([], (403, "cross-site request refused"))
    with caplog.at_level("INFO", logger="agentd.http"):
        p.received(HEAD)
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("agentd.http", "INFO", "refused before its body: POST /api/x (cross-site request refused)")]


def head(method: str = "POST", **headers: str) -> GuardedParser:
    p = GuardedParser(Adjustments(), lambda _: None)
    lines = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    p.received(f"{method} /api/agents HTTP/1.1\r\n{lines}Content-Length: 5\r\n\r\n".encode())
    return p


@pytest.mark.parametrize("headers, verdict", [
    ({"Host": "127.0.0.1:4200"}, None),
    ({"Host": "localhost:4200", "Origin": "http://localhost:4200"}, None),
    ({"Host": "127.0.0.1:4200", "Origin": "http://127.0.0.1:4200", "Sec-Fetch-Site": "same-origin"}, None),
    ({"Host": "127.0.0.1:4200", "Origin": "https://app.example.com"}, None),       # configured
    ({"Host": "agents.internal"}, None),                                              # allowed host
    ({"Host": "agents.internal", "Origin": "http://agents.internal"}, None),          # its own origin
    ({"Host": "127.0.0.1:4200", "Origin": "http://localhost:4200"}, None),            # a loopback alias
    ({"Host": "attacker.example"}, (400, "host not allowed")),
    ({"Host": "attacker.example", "Origin": "http://evil.example"}, (400, "host not allowed")),
    ({"Host": "127.0.0.1:4200", "Origin": "http://evil.example"}, (403, "cross-site request refused")),
    ({"Host": "127.0.0.1:4200", "Origin": "null"}, (403, "cross-site request refused")),
    ({"Host": "127.0.0.1:4200", "Sec-Fetch-Site": "cross-site"}, (403, "cross-site request refused")),
    ({"Host": "127.0.0.1:4200", "Origin": "http://127.0.0.1:4200", "Sec-Fetch-Site": "same-site"},
     (403, "cross-site request refused")),
])
def test_the_check_is_the_guards_policy(tmp_path: Path, headers: dict, verdict) -> None:
    config = parse_config({"api_key": "k" * 32, "api": {"allowed_hosts": ["agents.internal"],
                                                       "cors_origins": ["https://app.example.com"]}}, tmp_path)
    assert request_check(config)(head(**headers)) == verdict


def test_the_check_lets_in_the_origins_cors_allows(tmp_path: Path) -> None:
    keyless = request_check(parse_config({"api": {"cors_origins": ["https://app.example.com"]}}, tmp_path))
    dev = {"Host": "127.0.0.1:4200", "Sec-Fetch-Site": "same-site"}
    assert keyless(head(Origin="http://localhost:3000", **dev)) is None
    assert keyless(head(Origin="http://127.0.0.1:8080", **dev)) is None
    assert keyless(head(Host="127.0.0.1:4200", Origin="https://app.example.com")) == (403, "cross-site request refused")


def test_a_websocket_handshake_with_a_body_is_judged_like_a_post(tmp_path: Path) -> None:
    check = request_check(parse_config({}, tmp_path))
    evil = {"Host": "127.0.0.1:4200", "Origin": "http://evil.example"}
    assert check(head("GET", **evil)) is None, "a plain GET changes nothing"
    assert check(head("GET", Upgrade="websocket", **evil)) == (403, "cross-site request refused")


def test_nothing_is_installed_behind_trusted_proxies(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from agentd.server import early_refusal
    from waitress.channel import HTTPChannel
    server = SimpleNamespace(channel_class=HTTPChannel)
    early_refusal.install(server, parse_config({"api": {"trusted_proxies": ["127.0.0.1"]}}, tmp_path))
    # Behind trusted proxies: JSON errors, but waitress's own parser.
    assert server.channel_class.parser_class is HTTPChannel.parser_class
    assert server.channel_class.error_task_class is early_refusal.JsonErrorTask
    server = SimpleNamespace(channel_class=HTTPChannel)
    early_refusal.install(server, parse_config({}, tmp_path))
    assert issubclass(server.channel_class, HTTPChannel) and server.channel_class is not HTTPChannel
    assert server.channel_class.error_task_class is early_refusal.JsonErrorTask
    assert server.channel_class.__name__ == "GuardedChannel"
    assert server.channel_class.__doc__ == "HTTPChannel whose requests are judged once their headers are in."
    made = server.channel_class.parser_class.fget(object())(Adjustments())
    assert isinstance(made, GuardedParser)
    # ... asking the configured policy: a cross-site post is refused by the installed parser.
    made.received(HEAD.replace(b"\r\n\r\n", b"\r\nOrigin: http://evil.example\r\n\r\n"))
    assert isinstance(made.error, EarlyRefusal) and made.error.body == "cross-site request refused"
    assert json.loads(EarlyRefusal(403, "x").to_response()[2]) == {"error": "x"}
