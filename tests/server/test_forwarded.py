"""agentd/server/proxy.py exactly: near-miss peers and hops, spoofed headers, every field the
layer writes, boundaries of host length and default ports, and the wrapper installed on a
Flask app. In process and fast (mutation testing runs these per mutant); the nginx and
daemon paths are in tests/server/test_proxy.py.
"""

from __future__ import annotations

import logging

import pytest
from flask import Flask, jsonify, request

from agentd.server.proxy import FORWARDED_KEYS, PEER_KEY, ProxyHeaders, TrustedProxies, _last, install_proxy_headers

BASE = {"wsgi.url_scheme": "http", "HTTP_HOST": "127.0.0.1:4200", "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "4200", "SCRIPT_NAME": "", "PATH_INFO": "/"}


def seen(trusted: list[str], environ: dict) -> dict:
    """The environ the wrapped app receives (the caller's dict is not changed)."""
    captured: dict = {}

    def app(env, start_response):
        captured.update(env)
        return [b"ok"]

    assert ProxyHeaders(app, TrustedProxies(trusted))(dict(environ), lambda *a: None) == [b"ok"]
    return captured


def from_peer(trusted: list[str], peer: str = "127.0.0.1", **headers: str) -> dict:
    environ = {**BASE, "REMOTE_ADDR": peer}
    environ.update({"HTTP_" + k.upper(): v for k, v in headers.items()})
    return seen(trusted, environ)


# -- _last ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, last", [
    (None, ""), ("", ""), ("https", "https"), ("http,https", "https"), ("http, https ", "https"),
    ("a,b,c", "c"), ("a b,c d", "c d"), ("a,", ""),
])
def test_last_is_the_right_most_item(value, last: str) -> None:
    assert _last(value) == last, f"BUG: the right-most value of {value!r} read as {_last(value)!r}"


# -- which peer is trusted -------------------------------------------------------------------------

@pytest.mark.parametrize("peer", ["127.0.0.2", "10.0.0.1", "127.0.0.10", "::1", "", "junk", "127.0.0.1.evil"])
def test_near_misses_of_a_trusted_peer_apply_nothing(peer: str) -> None:
    environ = from_peer(["127.0.0.1"], peer, x_forwarded_for="203.0.113.7", x_forwarded_proto="https",
                        x_forwarded_host="evil.example", x_forwarded_port="8443", x_forwarded_prefix="/evil",
                        forwarded="for=198.51.100.9;proto=https;host=evil2.example")
    assert environ["REMOTE_ADDR"] == peer, f"BUG: peer {peer!r} near a trusted proxy could set the client"
    assert (environ["wsgi.url_scheme"], environ["HTTP_HOST"], environ["SERVER_NAME"], environ["SERVER_PORT"],
            environ["SCRIPT_NAME"]) == ("http", "127.0.0.1:4200", "127.0.0.1", "4200", "")
    assert "REMOTE_HOST" not in environ
    for key in FORWARDED_KEYS:
        assert key not in environ, f"BUG: spoofed {key} left for handlers to read"


def test_cidr_edges() -> None:
    trusted = ["10.0.0.0/30"]
    assert from_peer(trusted, "10.0.0.3", x_forwarded_for="203.0.113.7")["REMOTE_ADDR"] == "203.0.113.7"
    assert from_peer(trusted, "10.0.0.4", x_forwarded_for="203.0.113.7")["REMOTE_ADDR"] == "10.0.0.4", \
        "BUG: the address just past a trusted CIDR is trusted"


def test_forwarded_keys_are_exactly_these_and_all_dropped() -> None:
    assert FORWARDED_KEYS == ("HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_HOST",
                              "HTTP_X_FORWARDED_PORT", "HTTP_X_FORWARDED_PREFIX", "HTTP_FORWARDED")
    for key in FORWARDED_KEYS:
        for trusted in ([], ["127.0.0.1"]):
            environ = seen(trusted, {**BASE, "REMOTE_ADDR": "127.0.0.1", key: "x"})
            assert key not in environ, f"BUG: {key} reaches the app (trusted={trusted})"


def test_request_without_any_forwarding_header_or_peer() -> None:
    environ = seen(["127.0.0.1"], dict(BASE))
    assert environ[PEER_KEY] == "" and PEER_KEY == "agentd.proxy_peer"
    assert "REMOTE_ADDR" not in environ and environ["HTTP_HOST"] == "127.0.0.1:4200"
    environ = from_peer(["127.0.0.1"])
    assert environ["REMOTE_ADDR"] == "127.0.0.1" and "REMOTE_HOST" not in environ
    assert (environ["wsgi.url_scheme"], environ["HTTP_HOST"], environ["SCRIPT_NAME"]) == ("http", "127.0.0.1:4200", "")


# -- client address ---------------------------------------------------------------------------------

@pytest.mark.parametrize("xff, client", [
    ("203.0.113.7,127.0.0.1", "203.0.113.7"),          # no spaces between hops
    ("198.51.100.1,203.0.113.7", "203.0.113.7"),
    ("203.0.113.7, ,127.0.0.1", "203.0.113.7"),        # an empty item is skipped, not a hop
    ("203.0.113.7,", "203.0.113.7"),
    ("127.0.0.1", "127.0.0.1"),                        # every hop trusted: the left-most one
    ("unknown, 127.0.0.1", "unknown"),
    ("[2001:db8::7]:443", "2001:db8::7"),
    ("::ffff:203.0.113.7", "203.0.113.7"),
])
def test_client_from_x_forwarded_for(xff: str, client: str) -> None:
    environ = from_peer(["127.0.0.1"], x_forwarded_for=xff)
    assert environ["REMOTE_ADDR"] == client, f"BUG: X-Forwarded-For {xff!r} gave client {environ['REMOTE_ADDR']!r}"
    assert environ["REMOTE_HOST"] == client
    assert environ[PEER_KEY] == "127.0.0.1"


def test_an_empty_x_forwarded_for_names_an_unknown_client_never_the_peer() -> None:
    """A proxy that passes a client's `X-Forwarded-For: ,` on unchanged must not make the
    client its own (loopback) address."""
    environ = from_peer(["127.0.0.1"], x_forwarded_for="", forwarded="for=203.0.113.7;proto=https;host=a.example")
    assert environ["REMOTE_ADDR"] == environ["REMOTE_HOST"] == "unknown"
    assert (environ["wsgi.url_scheme"], environ["HTTP_HOST"]) == ("http", "127.0.0.1:4200")
    environ = from_peer(["127.0.0.1"], x_forwarded_for=" , ")
    assert environ["REMOTE_ADDR"] == environ["REMOTE_HOST"] == "unknown"


@pytest.mark.parametrize("xff, forwarded, client", [
    # The proxy sends Forwarded and passes the client's own X-Forwarded-For on: the remote one wins.
    ("127.0.0.1", "for=203.0.113.5", "203.0.113.5"),
    ("::1", 'for="[2001:db8::9]:4711";proto=https;host=a.example', "2001:db8::9"),
    # ... and the other way round.
    ("203.0.113.5", "for=127.0.0.1", "203.0.113.5"),
    # Both remote (or both loopback): X-Forwarded-For's, as before.
    ("198.51.100.1", "for=203.0.113.5", "198.51.100.1"),
    ("127.0.0.1", "for=127.0.0.1", "127.0.0.1"),
    ("127.0.0.1", "for=unknown", "unknown"),
])
def test_with_both_headers_a_loopback_client_loses(xff: str, forwarded: str, client: str) -> None:
    environ = from_peer(["127.0.0.1"], x_forwarded_for=xff, forwarded=forwarded)
    assert environ["REMOTE_ADDR"] == client


def test_the_chosen_forwarded_element_gives_scheme_and_host() -> None:
    environ = from_peer(["127.0.0.1"], x_forwarded_for="127.0.0.1",
                        forwarded="for=203.0.113.5;proto=https;host=a.example")
    assert (environ["REMOTE_ADDR"], environ["wsgi.url_scheme"], environ["HTTP_HOST"]) == \
        ("203.0.113.5", "https", "a.example")
    environ = from_peer(["127.0.0.1"], x_forwarded_for="198.51.100.1",
                        forwarded="for=203.0.113.5;proto=https;host=a.example")
    assert (environ["wsgi.url_scheme"], environ["HTTP_HOST"]) == ("http", "127.0.0.1:4200")


def test_forwarded_element_without_for_is_unknown() -> None:
    environ = from_peer(["127.0.0.1"], forwarded="proto=https")
    assert environ["REMOTE_ADDR"] == "unknown", "BUG: a Forwarded element without for= named a client"
    assert environ["wsgi.url_scheme"] == "https"
    assert environ["HTTP_HOST"] == "127.0.0.1:4200", "BUG: a Forwarded element without host= changed the Host"


def test_forwarded_values_come_from_the_clients_element_only() -> None:
    environ = from_peer(["127.0.0.1"], forwarded="for=203.0.113.7;proto=HTTPS;host=A.example:8443, "
                                                 "for=127.0.0.1;proto=http;host=inner.local")
    assert (environ["REMOTE_ADDR"], environ["wsgi.url_scheme"], environ["HTTP_HOST"], environ["SERVER_PORT"]) == \
        ("203.0.113.7", "https", "A.example:8443", "8443")
    # X-Forwarded-Proto / -Host, when sent, win over the element's values.
    environ = from_peer(["127.0.0.1"], forwarded="for=203.0.113.7;proto=https;host=a.example",
                        x_forwarded_proto="http", x_forwarded_host="b.example")
    assert (environ["wsgi.url_scheme"], environ["HTTP_HOST"]) == ("http", "b.example")
    # Nothing usable in Forwarded: nothing applied.
    environ = from_peer(["127.0.0.1"], forwarded="garbage")
    assert environ["REMOTE_ADDR"] == "unknown" and environ["HTTP_HOST"] == "127.0.0.1:4200"


# -- scheme, host, port -----------------------------------------------------------------------------

@pytest.mark.parametrize("proto, scheme", [("https", "https"), ("HTTPS", "https"), ("http", "http"),
                                           ("ftp", "http"), ("https2", "http"), ("", "http"), ("http, https", "https")])
def test_scheme(proto: str, scheme: str) -> None:
    assert from_peer(["127.0.0.1"], x_forwarded_proto=proto)["wsgi.url_scheme"] == scheme


@pytest.mark.parametrize("scheme, host, port, http_host, server_name, server_port", [
    ("https", "a.example", "8443", "a.example:8443", "a.example", "8443"),
    ("https", "a.example:443", "", "a.example", "a.example", "443"),
    ("https", "a.example:80", "", "a.example:80", "a.example", "80"),
    ("http", "a.example:80", "", "a.example", "a.example", "80"),
    ("http", "a.example", "", "a.example", "a.example", "80"),
    ("https", "a.example", "", "a.example", "a.example", "443"),
    ("http", "a.example:443", "", "a.example:443", "a.example", "443"),
    ("http", "a.example:8080", "9090", "a.example:9090", "a.example", "9090"),
    ("http", "a.example", "80", "a.example", "a.example", "80"),
    ("http", "Xbox.example", "", "Xbox.example", "Xbox.example", "80"),
    ("http", "[::1]", "", "[::1]", "::1", "80"),
    ("https", "[2001:db8::1]:8443", "", "[2001:db8::1]:8443", "2001:db8::1", "8443"),
    ("http", "[2001:db8::1]", "8080", "[2001:db8::1]:8080", "2001:db8::1", "8080"),
])
def test_host_and_port(scheme, host, port, http_host, server_name, server_port) -> None:
    headers = {"x_forwarded_proto": scheme, "x_forwarded_host": host}
    if port:
        headers["x_forwarded_port"] = port
    environ = from_peer(["127.0.0.1"], **headers)
    assert (environ["HTTP_HOST"], environ["SERVER_NAME"], environ["SERVER_PORT"]) == \
        (http_host, server_name, server_port), f"BUG: forwarded host {host!r} port {port!r} over {scheme}"


def test_port_alone_replaces_the_requests_own_port() -> None:
    environ = from_peer(["127.0.0.1"], x_forwarded_port="8080")
    assert (environ["HTTP_HOST"], environ["SERVER_NAME"], environ["SERVER_PORT"]) == \
        ("127.0.0.1:8080", "127.0.0.1", "8080"), "BUG: X-Forwarded-Port alone was not applied"
    environ = from_peer(["127.0.0.1"], x_forwarded_port="80")
    assert (environ["HTTP_HOST"], environ["SERVER_PORT"]) == ("127.0.0.1", "80")
    # No Host of its own to put the port on: nothing to change.
    env = {k: v for k, v in BASE.items() if k != "HTTP_HOST"}
    environ = seen(["127.0.0.1"], {**env, "REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_PORT": "8080"})
    assert "HTTP_HOST" not in environ and environ["SERVER_PORT"] == "4200"


@pytest.mark.parametrize("port", ["x", "80a", "-1", "8 0", "０", "²", "123456", "80,x"])
def test_non_numeric_port_is_ignored(port: str) -> None:
    # "０" (full-width) and "²" are digits to str.isdigit but no port an HTTP client can use.
    environ = from_peer(["127.0.0.1"], x_forwarded_host="a.example:8443", x_forwarded_port=port)
    assert (environ["HTTP_HOST"], environ["SERVER_PORT"]) == ("a.example:8443", "8443"), \
        f"BUG: a non-numeric X-Forwarded-Port {port!r} was applied"


def test_host_length_boundary() -> None:
    name = "a" * 251 + ".com"
    assert len(name) == 255
    assert from_peer(["127.0.0.1"], x_forwarded_host=name)["HTTP_HOST"] == name, "BUG: a 255-byte host refused"
    longer = "a" * 252 + ".com"
    assert from_peer(["127.0.0.1"], x_forwarded_host=longer)["HTTP_HOST"] == "127.0.0.1:4200", \
        "BUG: a 256-byte forwarded host was applied"


@pytest.mark.parametrize("host", ["evil.example/x", "a b", "a.example:123456", "[::1]x", "[zz]", "user@a.example",
                                  "a.example:", ":80", "a.example:80:80"])
def test_malformed_hosts_are_not_applied(host: str) -> None:
    environ = from_peer(["127.0.0.1"], x_forwarded_host=host)
    assert (environ["HTTP_HOST"], environ["SERVER_NAME"], environ["SERVER_PORT"]) == \
        ("127.0.0.1:4200", "127.0.0.1", "4200"), f"BUG: malformed forwarded host {host!r} applied"


# -- prefix ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix, script_name", [
    ("/agentd", "/agentd"), ("/agentd/", "/agentd"), ("/a/b", "/a/b"), ("/a/b/", "/a/b"), ("/x, /agentd", "/agentd"),
    ("/a..b", "/a..b"), ("/.well", "/.well"), ("/appX/", "/appX"), ("/X", "/X"),
    ("/a/../b", ""), ("/a/..", ""), ("/..", ""), ("/../", ""), ("/a/./b", ""), ("/a/.", ""), ("/.", ""),
    ("agentd", ""), ("//evil.example", ""), ("/", ""), ("/a b", ""), ("", ""),
])
def test_prefix(prefix: str, script_name: str) -> None:
    environ = from_peer(["127.0.0.1"], x_forwarded_prefix=prefix)
    assert environ["SCRIPT_NAME"] == script_name, f"BUG: X-Forwarded-Prefix {prefix!r} gave {environ['SCRIPT_NAME']!r}"


def test_prefix_goes_in_front_of_an_existing_script_name() -> None:
    environ = seen(["127.0.0.1"], {**BASE, "REMOTE_ADDR": "127.0.0.1", "SCRIPT_NAME": "/inner",
                                   "HTTP_X_FORWARDED_PREFIX": "/outer/"})
    assert environ["SCRIPT_NAME"] == "/outer/inner"
    env = {k: v for k, v in BASE.items() if k != "SCRIPT_NAME"}
    environ = seen(["127.0.0.1"], {**env, "REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_PREFIX": "/outer"})
    assert environ["SCRIPT_NAME"] == "/outer"


# -- installed on a Flask app -------------------------------------------------------------------------

def flask_app() -> Flask:
    app = Flask("proxy-test")

    @app.route("/who")
    def who():
        return jsonify({"addr": request.remote_addr, "scheme": request.scheme, "host": request.host,
                        "root": request.script_root, "xff": request.headers.get("X-Forwarded-For")})

    return app


def test_install_wraps_the_app_and_logs_what_it_trusts(caplog: pytest.LogCaptureFixture) -> None:
    app = flask_app()
    with caplog.at_level(logging.INFO, logger="agentd.proxy"):
        install_proxy_headers(app, ["127.0.0.1", "10.0.0.0/8"])
    assert [r.getMessage() for r in caplog.records if r.name == "agentd.proxy"] == \
        ["trusting forwarding headers from 127.0.0.1/32, 10.0.0.0/8"]
    assert [r.levelno for r in caplog.records if r.name == "agentd.proxy"] == [logging.INFO]
    assert isinstance(app.wsgi_app, ProxyHeaders)
    r = app.test_client().get("/who", headers={"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https",
                                               "X-Forwarded-Host": "agentd.example.com",
                                               "X-Forwarded-Prefix": "/agentd"})
    assert r.get_json() == {"addr": "203.0.113.7", "scheme": "https", "host": "agentd.example.com",
                            "root": "/agentd", "xff": None}


def test_install_without_trusted_proxies_logs_nothing_and_drops_headers(caplog: pytest.LogCaptureFixture) -> None:
    app = flask_app()
    with caplog.at_level(logging.DEBUG, logger="agentd.proxy"):
        install_proxy_headers(app, [])
    assert [r for r in caplog.records if r.name == "agentd.proxy"] == []
    r = app.test_client().get("/who", headers={"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https"})
    assert r.get_json() == {"addr": "127.0.0.1", "scheme": "http", "host": "localhost", "root": "", "xff": None}


def test_plain_http_from_the_proxy_replaces_an_https_scheme() -> None:
    # The proxy's word on the scheme counts both ways: http is applied too, not only https.
    environ = seen(["127.0.0.1"], {**BASE, "wsgi.url_scheme": "https", "REMOTE_ADDR": "127.0.0.1",
                                   "HTTP_X_FORWARDED_PROTO": "http"})
    assert environ["wsgi.url_scheme"] == "http", "BUG: X-Forwarded-Proto http from a trusted proxy ignored"
    environ = seen(["127.0.0.1"], {**BASE, "wsgi.url_scheme": "https", "REMOTE_ADDR": "127.0.0.1",
                                   "HTTP_X_FORWARDED_PROTO": "HTTP"})
    assert environ["wsgi.url_scheme"] == "http"
    environ = seen(["127.0.0.1"], {**BASE, "wsgi.url_scheme": "https", "REMOTE_ADDR": "127.0.0.1",
                                   "HTTP_FORWARDED": "for=203.0.113.7;proto=http"})
    assert environ["wsgi.url_scheme"] == "http"
    environ = seen(["127.0.0.1"], {**BASE, "wsgi.url_scheme": "https", "REMOTE_ADDR": "10.0.0.1",
                                   "HTTP_X_FORWARDED_PROTO": "http"})
    assert environ["wsgi.url_scheme"] == "https", "BUG: an untrusted peer downgraded the scheme"


# -- agentd/server/forwarded.py helpers -----------------------------------------------------------------

@pytest.mark.parametrize("hop, address", [
    ("203.0.113.7", "203.0.113.7"), (' "203.0.113.7" ', "203.0.113.7"),
    ("_hidden", "_hidden"), ('"_hidden"', "_hidden"), ("  ", "unknown"), ('""', "unknown"),
    ("x" * 150, "x" * 100),
])
def test_hop_address_keeps_a_token_that_is_no_address(hop: str, address: str) -> None:
    from agentd.server.forwarded import hop_address
    assert hop_address(hop) == address


def test_forwarded_elements_split_each_pair_at_its_first_equals_sign() -> None:
    from agentd.server.forwarded import forwarded_elements
    assert forwarded_elements('for="_a=b";Proto=https, for=192.0.2.1;by') == [
        {"for": "_a=b", "proto": "https"}, {"for": "192.0.2.1"}]


def test_a_network_with_host_bits_set_is_taken_as_its_network() -> None:
    """`10.1.2.3/8` in trusted_proxies means 10.0.0.0/8 (as nginx's set_real_ip_from reads it)."""
    trusted = TrustedProxies(["10.1.2.3/8", "2001:db8::1/32"])
    assert trusted.contains("10.200.0.1") and trusted.contains("2001:db8:ffff::9")
    assert not trusted.contains("11.0.0.1")
