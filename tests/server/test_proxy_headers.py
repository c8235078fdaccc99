"""agentd.server.proxy.ProxyHeaders on its own: which hop is the client, what is applied,
what is dropped. (tests/server/test_proxy.py checks the same through nginx and the daemon.)"""

from __future__ import annotations

import pytest

from agentd.server.proxy import ProxyHeaders, TrustedProxies, parse_ip


def seen(trusted: list[str], peer: str = "127.0.0.1", **headers: str) -> dict:
    """The environ the wrapped app receives for a request from `peer` with `headers`."""
    captured: dict = {}

    def app(environ, start_response):
        captured.update(environ)
        return []

    environ = {"REMOTE_ADDR": peer, "wsgi.url_scheme": "http", "HTTP_HOST": "127.0.0.1:4200",
               "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "4200", "SCRIPT_NAME": "", "PATH_INFO": "/"}
    environ.update({"HTTP_" + k.upper(): v for k, v in headers.items()})
    ProxyHeaders(app, TrustedProxies(trusted))(environ, lambda *a: None)
    return captured


@pytest.mark.parametrize("trusted, peer, xff, client", [
    (["127.0.0.1"], "127.0.0.1", "203.0.113.7", "203.0.113.7"),
    (["127.0.0.1"], "127.0.0.1", "198.51.100.1, 203.0.113.7", "203.0.113.7"),
    (["127.0.0.1"], "127.0.0.1", "127.0.0.1, 203.0.113.7", "203.0.113.7"),
    (["127.0.0.1", "10.0.0.0/8"], "127.0.0.1", "198.51.100.1, 203.0.113.7, 10.1.2.3, 10.9.9.9", "203.0.113.7"),
    (["127.0.0.1", "10.0.0.0/8"], "127.0.0.1", "10.1.2.3, 10.9.9.9", "10.1.2.3"),   # all trusted: left-most
    (["127.0.0.1"], "127.0.0.1", "127.0.0.1", "127.0.0.1"),                         # a local client via nginx
    (["::1"], "::1", "2001:db8::5", "2001:db8::5"),
    (["127.0.0.1"], "127.0.0.1", "[2001:db8::5]:4431", "2001:db8::5"),
    (["127.0.0.1"], "127.0.0.1", "203.0.113.7:5555", "203.0.113.7"),
    (["127.0.0.1"], "127.0.0.1", "unknown, 127.0.0.1", "unknown"),
    (["127.0.0.1"], "127.0.0.1", "::ffff:203.0.113.7", "203.0.113.7"),
    (["10.0.0.0/8"], "127.0.0.1", "203.0.113.7", "127.0.0.1"),                      # peer not trusted
    (["10.0.0.0/8"], "10.200.0.1", "203.0.113.7", "203.0.113.7"),                    # CIDR peer
    ([], "127.0.0.1", "203.0.113.7", "127.0.0.1"),                                  # nothing trusted
])
def test_client_is_the_right_most_untrusted_hop(trusted, peer, xff, client) -> None:
    environ = seen(trusted, peer, x_forwarded_for=xff)
    assert environ["REMOTE_ADDR"] == client
    assert environ["agentd.proxy_peer"] == peer
    assert "HTTP_X_FORWARDED_FOR" not in environ


def test_forwarded_header_when_no_x_forwarded_for() -> None:
    environ = seen(["127.0.0.1"], forwarded='for=198.51.100.1;proto=http, for="[2001:db8::7]:443";'
                                             'proto=https;host="agentd.example.com", for=127.0.0.1')
    assert environ["REMOTE_ADDR"] == "2001:db8::7"
    assert environ["wsgi.url_scheme"] == "https"
    assert environ["HTTP_HOST"] == "agentd.example.com"
    # X-Forwarded-For wins over a Forwarded header that may be the client's own.
    environ = seen(["127.0.0.1"], forwarded="for=127.0.0.1", x_forwarded_for="203.0.113.7")
    assert environ["REMOTE_ADDR"] == "203.0.113.7"


def test_scheme_host_port_and_prefix_from_a_trusted_proxy() -> None:
    environ = seen(["127.0.0.1"], x_forwarded_proto="https", x_forwarded_host="agentd.example.com:8443",
                   x_forwarded_prefix="/agentd/")
    assert (environ["wsgi.url_scheme"], environ["HTTP_HOST"], environ["SERVER_NAME"], environ["SERVER_PORT"],
            environ["SCRIPT_NAME"]) == ("https", "agentd.example.com:8443", "agentd.example.com", "8443", "/agentd")
    environ = seen(["127.0.0.1"], x_forwarded_proto="https", x_forwarded_host="agentd.example.com",
                   x_forwarded_port="443")
    assert (environ["HTTP_HOST"], environ["SERVER_PORT"]) == ("agentd.example.com", "443")
    environ = seen(["127.0.0.1"], x_forwarded_host="[2001:db8::1]:8080")
    assert (environ["HTTP_HOST"], environ["SERVER_NAME"], environ["SERVER_PORT"]) == \
        ("[2001:db8::1]:8080", "2001:db8::1", "8080")
    # Several proxies appended: the value our peer sent (right-most) counts.
    environ = seen(["127.0.0.1"], x_forwarded_proto="http, https", x_forwarded_host="a.example, b.example")
    assert (environ["wsgi.url_scheme"], environ["HTTP_HOST"]) == ("https", "b.example")


@pytest.mark.parametrize("headers", [
    {"x_forwarded_proto": "javascript"}, {"x_forwarded_host": "evil.example/path"},
    {"x_forwarded_host": "a b"}, {"x_forwarded_prefix": "agentd"}, {"x_forwarded_prefix": "/a/../b"},
    {"x_forwarded_prefix": "//evil.example"}, {"x_forwarded_prefix": '/a"><script>'},
    {"x_forwarded_port": "x"},
])
def test_malformed_values_are_not_applied(headers) -> None:
    environ = seen(["127.0.0.1"], **headers)
    assert (environ["wsgi.url_scheme"], environ["HTTP_HOST"], environ["SCRIPT_NAME"]) == \
        ("http", "127.0.0.1:4200", "")


def test_untrusted_peer_gets_nothing_applied_and_headers_dropped() -> None:
    environ = seen(["10.0.0.0/8"], x_forwarded_for="203.0.113.7", x_forwarded_proto="https",
                   x_forwarded_host="evil.example", x_forwarded_prefix="/evil", x_forwarded_port="1",
                   forwarded="for=1.2.3.4")
    assert (environ["REMOTE_ADDR"], environ["wsgi.url_scheme"], environ["HTTP_HOST"], environ["SCRIPT_NAME"]) == \
        ("127.0.0.1", "http", "127.0.0.1:4200", "")
    assert not any(k.startswith(("HTTP_X_FORWARDED", "HTTP_FORWARDED")) for k in environ)


def test_trusted_proxies_parsing() -> None:
    trusted = TrustedProxies(["127.0.0.1", "10.0.0.0/8", "fd00::/8"])
    assert trusted.contains("10.255.0.1") and trusted.contains("fd00::2") and trusted.contains("127.0.0.1")
    assert not trusted.contains("11.0.0.1") and not trusted.contains("::1") and not trusted.contains("junk")
    assert trusted.contains("::ffff:10.0.0.1")
    assert parse_ip('"[::1]:80"') is not None and parse_ip("_hidden") is None
    with pytest.raises(ValueError, match="not an IP address"):
        TrustedProxies(["example.com"])


def test_config_keys() -> None:
    from pathlib import Path

    from agentd.config import ApiConfig, parse_config
    from agentd.errors import ConfigError

    assert (ApiConfig().trusted_proxies, ApiConfig().sse_keepalive_secs) == ([], 15.0)
    cfg = parse_config({"api": {"trusted_proxies": [" 127.0.0.1", "10.0.0.0/8"], "sse_keepalive_secs": 5}}, Path("."))
    assert (cfg.api.trusted_proxies, cfg.api.sse_keepalive_secs) == (["127.0.0.1", "10.0.0.0/8"], 5.0)
    with pytest.raises(ConfigError, match="api.trusted_proxies: 'proxy.lan' is not an IP address"):
        parse_config({"api": {"trusted_proxies": ["proxy.lan"]}}, Path("."))
    with pytest.raises(ConfigError, match="api.trusted_proxies: expected an array"):
        parse_config({"api": {"trusted_proxies": "127.0.0.1"}}, Path("."))
    with pytest.raises(ConfigError, match="sse_keepalive_secs: must be between"):
        parse_config({"api": {"sse_keepalive_secs": 0}}, Path("."))


def test_real_client_for_other_listeners() -> None:
    from agentd.server.forwarded import real_client

    trusted = TrustedProxies(["127.0.0.1"])
    headers = {"X-Forwarded-For": "127.0.0.1, 203.0.113.7", "Forwarded": "for=192.0.2.9"}
    assert real_client("127.0.0.1", headers.get, trusted) == "203.0.113.7"
    assert real_client("127.0.0.1", {"Forwarded": "for=192.0.2.9, for=127.0.0.1"}.get, trusted) == "192.0.2.9"
    assert real_client("198.51.100.3", headers.get, trusted) == "198.51.100.3"
    assert real_client("127.0.0.1", {}.get, trusted) == "127.0.0.1"
    assert real_client("127.0.0.1", headers.get, TrustedProxies([])) == "127.0.0.1"
