"""The request guard (agentd/api/guard.py) in process: exact Host and Origin decisions,
near-miss names and origins, every state-changing method, and the guard's place before
every other hook. Fast, so mutation testing can afford them; the same rules are checked
through the real daemon in tests/api/test_web_security.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask, jsonify

from agentd.api.errors import register_error_handlers
from agentd.api.guard import (CROSS_SITE_MESSAGE, HOST_MESSAGE, LOOPBACK_NAMES, STATE_CHANGING, HostPolicy,
                              OriginPolicy, host_name, install_guard)
from agentd.config import parse_config

EVIL = "http://evil.example"
OWN = "http://agents.internal:4200"


# -- host_name ------------------------------------------------------------------------------------

@pytest.mark.parametrize("header, name", [
    ("localhost", "localhost"),
    ("LocalHost:4200", "localhost"),
    ("  Example.COM:80  ", "example.com"),
    ("example.com.", "example.com"),
    ("example.com.:80", "example.com"),
    ("[::1]:4200", "::1"),
    ("[::1]", "::1"),
    ("[2001:DB8::1]:443", "2001:db8::1"),
    ("::1", "::1"),                      # two colons: an unbracketed IPv6 address, no port split off
    ("2001:db8::1", "2001:db8::1"),
    ("[::1", "[::1"),                   # no closing bracket: kept whole (and refused later)
    ("[]", ""),
    ("[::1]]:80", "::1"),               # the name ends at the first closing bracket
    (":4200", ""),
    ("a:b", "a"),
])
def test_host_name_exact(header: str, name: str) -> None:
    assert host_name(header) == name, f"BUG: Host {header!r} read as {host_name(header)!r}, not {name!r}"


# -- HostPolicy -----------------------------------------------------------------------------------

def test_loopback_names_are_exactly_these() -> None:
    assert LOOPBACK_NAMES == {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
    policy = HostPolicy("127.0.0.1", [])
    for name in sorted(LOOPBACK_NAMES):
        assert policy.allows(name), f"BUG: loopback name {name} refused"
        assert policy.allows(f"{name.upper()}:4200"), f"BUG: loopback name {name} with a port refused"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:4200", "127.0.0.2", "127.255.255.254:80",
                                  "[::1]:4200", "[::1]", "::1", "localhost.", "LOCALHOST:4200"])
def test_loopback_hosts_are_served(host: str) -> None:
    assert HostPolicy("127.0.0.1", []).allows(host), f"BUG: loopback Host {host} refused"


@pytest.mark.parametrize("host", [
    "attacker.example", "localhost.attacker.example", "attacker.localhost.example", "127.0.0.1.nip.io",
    "localhost1", "xlocalhost", "ip6-localhost.evil", "128.0.0.1", "126.255.255.255", "[::2]:4200",
    "0x7f.0.0.1", "attacker.example:4200", "", "   ", ":4200", "[]", "[::1",
])
def test_foreign_and_malformed_hosts_are_refused(host: str) -> None:
    assert not HostPolicy("127.0.0.1", []).allows(host), f"BUG: DNS-rebinding Host {host!r} served"


def test_missing_host_header_is_served() -> None:
    # HTTP/1.0 without Host: not a browser on a rebinding name.
    assert HostPolicy("127.0.0.1", []).allows(None)
    assert HostPolicy("127.0.0.1", ["agents.internal"]).allows(None)


def test_listen_address_is_served_and_its_near_misses_are_not() -> None:
    policy = HostPolicy("192.168.1.5", [])
    assert policy.listen_host == "192.168.1.5"
    assert policy.allows("192.168.1.5") and policy.allows("192.168.1.5:4200")
    for near in ("192.168.1.50", "192.168.1.", "92.168.1.5", "192.168.1.5.evil.example", "192.168.1.6"):
        assert not policy.allows(near), f"BUG: near miss {near} of the listen address served"
    bracketed = HostPolicy("[FD00::5]", [])
    assert bracketed.listen_host == "fd00::5"
    assert bracketed.allows("[fd00::5]:4200") and not bracketed.allows("[fd00::50]:4200")


def test_empty_listen_host_serves_no_empty_name() -> None:
    policy = HostPolicy("", [])
    assert policy.listen_host == ""
    for host in ("", ":80", "[]", " "):
        assert not policy.allows(host), f"BUG: empty Host name {host!r} matched the empty listen address"
    assert policy.allows("localhost") and not policy.allows("example.com")


def test_allowed_hosts_exact_entries() -> None:
    policy = HostPolicy("127.0.0.1", ["Agents.Internal.", " box.lan:8443 ", "[FD00::7]:80"])
    assert policy.exact == {"agents.internal", "box.lan", "fd00::7"}
    assert policy.patterns == [] and policy.any is False
    for host in ("agents.internal", "AGENTS.INTERNAL:8443", "agents.internal.", "box.lan", "box.lan:1",
                 "[fd00::7]:4200"):
        assert policy.allows(host), f"BUG: allowed host {host} refused"
    for host in ("agents.internal.evil", "sub.agents.internal", "gents.internal", "box.la", "box.lan2",
                 "[fd00::70]", "other.internal"):
        assert not policy.allows(host), f"BUG: near miss {host} of an allowed host served"


def test_allowed_hosts_wildcards() -> None:
    policy = HostPolicy("127.0.0.1", ["*.Example.com.", "api-*.corp"])
    assert policy.patterns == ["*.example.com", "api-*.corp"] and policy.exact == set() and not policy.any
    for host in ("a.example.com", "a.b.example.com:443", "A.EXAMPLE.COM", "api-1.corp", "api-x.y.corp"):
        assert policy.allows(host), f"BUG: host {host} matching a wildcard refused"
    for host in ("example.com", "evilexample.com", "example.com.evil.net", "a.example.co", "api.corp",
                 "xapi-1.corp", "api-1.corp.evil"):
        assert not policy.allows(host), f"BUG: {host} matched a wildcard it does not match"


def test_star_allows_every_host_even_an_empty_one() -> None:
    policy = HostPolicy("127.0.0.1", ["agents.internal", " * "])
    assert policy.any is True
    assert "*" not in policy.exact and policy.patterns == []
    for host in ("anything.example", "", "[]", "attacker.example:4200"):
        assert policy.allows(host)


def test_blank_entries_allow_nothing() -> None:
    policy = HostPolicy("127.0.0.1", ["", "  ", "."])
    assert not policy.any and policy.patterns == []
    for host in ("", " ", ".", "example.com"):
        assert not policy.allows(host), f"BUG: a blank allowed_hosts entry let {host!r} through"


# -- OriginPolicy ---------------------------------------------------------------------------------

def test_state_changing_methods_are_exactly_these() -> None:
    assert STATE_CHANGING == {"POST", "PUT", "PATCH", "DELETE"}
    policy = OriginPolicy(4200, [])
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert policy.refuses(method, EVIL, None, OWN), f"BUG: cross-site {method} served"
        assert policy.refuses(method, None, "cross-site", OWN), f"BUG: Sec-Fetch-Site cross-site {method} served"
    for method in ("GET", "HEAD", "OPTIONS", "TRACE", "post"):
        assert not policy.refuses(method, EVIL, "cross-site", OWN), f"BUG: a cross-site {method} was refused"


def test_the_daemons_own_loopback_origins_are_trusted() -> None:
    policy = OriginPolicy(4200, [])
    assert policy.own == {"http://127.0.0.1:4200", "http://localhost:4200", "http://[::1]:4200"}
    for origin in ("http://127.0.0.1:4200", "http://localhost:4200", "http://[::1]:4200",
                   "HTTP://LOCALHOST:4200/", " http://127.0.0.1:4200 "):
        for site in (None, "same-origin", "none"):
            assert not policy.refuses("POST", origin, site, OWN), f"BUG: own origin {origin} refused"
        # ... but not when the browser says the request came from another site (the rule).
        assert policy.refuses("POST", origin, "cross-site", OWN) and policy.refuses("POST", origin, "same-site", OWN)


@pytest.mark.parametrize("origin", [
    EVIL, "null", "", "http://127.0.0.1:42001", "http://127.0.0.1:420", "https://127.0.0.1:4200",
    "http://localhost:4201", "http://127.0.0.1.evil.example", "http://localhost.evil.example:4200",
    "http://127.0.0.1:4200.evil.example", "http://[::1]:4201", "http://127.0.0.2:4200",
    "http://agents.internal:42001", "https://agents.internal:4200", "http://agents.internal",
])
def test_near_miss_origins_are_refused(origin: str) -> None:
    policy = OriginPolicy(4200, [])
    assert policy.refuses("POST", origin, None, OWN), f"BUG: near-miss origin {origin!r} may post"
    # A same-origin Sec-Fetch-Site does not rescue a foreign Origin.
    assert policy.refuses("POST", origin, "same-origin", OWN)


def test_configured_cors_origins_are_normalized_and_exact() -> None:
    policy = OriginPolicy(4200, ["https://App.Example.com/", "http://dev.local:3000"])
    assert {"https://app.example.com", "http://dev.local:3000"} <= policy.configured
    assert len(policy.configured) == 2
    for origin in ("https://app.example.com", "https://APP.example.com/", "http://dev.local:3000"):
        assert not policy.refuses("POST", origin, "cross-site", OWN), f"BUG: configured origin {origin} refused"
    for near in ("https://app.example.com.evil.example", "http://app.example.com", "https://evil-app.example.com",
                 "https://app.example.co", "http://dev.local:30000", "http://dev.local"):
        assert policy.refuses("POST", near, None, OWN), f"BUG: near miss {near} of a CORS origin may post"


def test_own_origin_is_compared_case_insensitively_and_exactly() -> None:
    policy = OriginPolicy(4200, [])
    assert not policy.refuses("POST", "http://agents.internal:4200", None, "http://Agents.Internal:4200")
    assert not policy.refuses("POST", "HTTP://AGENTS.INTERNAL:4200/", None, OWN)
    assert policy.refuses("POST", "http://agents.internal:4200", None, "https://agents.internal:4200")


@pytest.mark.parametrize("fetch_site, refused", [
    ("cross-site", True), ("same-site", True), (" Cross-Site ", True), ("SAME-SITE", True),
    ("same-origin", False), ("none", False), ("", False), (None, False), ("cross-sites", False),
])
def test_sec_fetch_site_without_origin(fetch_site, refused: bool) -> None:
    policy = OriginPolicy(4200, [])
    assert policy.refuses("DELETE", None, fetch_site, OWN) is refused, \
        f"BUG: Sec-Fetch-Site {fetch_site!r} without Origin judged {'safe' if refused else 'cross-site'}"


def test_a_trusted_origin_wins_over_sec_fetch_site() -> None:
    # A configured CORS origin is cross-site by definition; its Origin decides.
    policy = OriginPolicy(4200, ["https://app.example.com"])
    assert policy.refuses("POST", "https://app.example.com", "cross-site", OWN) is False


@pytest.mark.parametrize("upgrade, refused", [
    ("websocket", True), ("WebSocket", True), ("WEBSOCKET", True), ("h2c", False), ("", False), (None, False),
])
def test_websocket_handshake_is_judged_like_a_post(upgrade, refused: bool) -> None:
    policy = OriginPolicy(4200, [])
    assert policy.refuses("GET", EVIL, None, OWN, upgrade) is refused, \
        f"BUG: a cross-site GET with Upgrade {upgrade!r} judged wrongly"
    assert policy.refuses("GET", "http://localhost:4200", None, OWN, upgrade) is False


# -- the installed guard --------------------------------------------------------------------------

def make_app(tmp_path: Path, api: dict | None = None, listen: str = "127.0.0.1:4200",
             api_key: str = "") -> tuple[Flask, list]:
    """A Flask app with the guard installed after another before-request hook."""
    config = parse_config({"api": api or {}, "api_listen": listen, "api_key": api_key}, tmp_path)
    app = Flask("agentd-guard-test")
    ran: list[str] = []

    @app.before_request
    def earlier_hook():
        ran.append("hook")

    install_guard(app, config)
    register_error_handlers(app)

    @app.route("/api/things", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    def things():
        ran.append("handler")
        return jsonify({"ok": True})

    @app.route("/v1/things", methods=["POST"])
    def v1_things():
        ran.append("handler")
        return jsonify({"ok": True})

    return app, ran


def test_guard_is_the_first_hook_and_refuses_before_anything_runs(tmp_path: Path) -> None:
    app, ran = make_app(tmp_path)
    client = app.test_client()
    r = client.post("/api/things", headers={"Origin": EVIL}, data="x=1", content_type="text/plain")
    assert r.status_code == 403 and r.get_json() == {"error": CROSS_SITE_MESSAGE}
    assert CROSS_SITE_MESSAGE == "cross-site request refused"
    assert ran == [], "BUG: a hook or handler ran for a refused cross-site request"
    r = client.get("/api/things", headers={"Host": "attacker.example"})
    assert r.status_code == 400 and r.get_json() == {"error": HOST_MESSAGE}
    assert HOST_MESSAGE == "host not allowed"
    assert ran == [], "BUG: a hook or handler ran for a foreign Host"
    r = client.post("/api/things", headers={"Host": "localhost:4200"})
    assert r.status_code == 200 and ran == ["hook", "handler"]


def test_guard_on_a_fresh_app_is_installed(tmp_path: Path) -> None:
    config = parse_config({"api_listen": "127.0.0.1:4200"}, tmp_path)
    app = Flask("fresh")
    install_guard(app, config)
    register_error_handlers(app)
    app.add_url_rule("/api/x", "x", lambda: jsonify({"ok": True}), methods=["POST"])
    assert app.test_client().post("/api/x", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert app.test_client().post("/api/x").status_code == 200


@pytest.mark.parametrize("path", ["/v1/things", "/api/things", "/agents", "/nowhere"])
def test_guard_answers_one_json_body_on_every_route(tmp_path: Path, path: str) -> None:
    """API, /v1 and dashboard alike: 403 {"error": "cross-site request refused"}."""
    app, ran = make_app(tmp_path)
    r = app.test_client().post(path, headers={"Sec-Fetch-Site": "same-site"})
    assert (r.status_code, r.get_json()) == (403, {"error": CROSS_SITE_MESSAGE})
    assert ran == []


def test_a_foreign_host_gets_json_on_v1_and_a_page_on_the_dashboard(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    r = app.test_client().get("/v1/things", headers={"Host": "attacker.example"})
    assert (r.status_code, r.get_json()) == (400, {"error": HOST_MESSAGE})
    r = app.test_client().get("/agents", headers={"Host": "attacker.example"})
    assert r.status_code == 400 and r.mimetype == "text/html" and HOST_MESSAGE in r.get_data(as_text=True)


def test_the_own_origin_marked_cross_site_is_refused(tmp_path: Path) -> None:
    """The issue's rule is "Sec-Fetch-Site cross-site (or same-site), or a foreign Origin"."""
    app, ran = make_app(tmp_path)
    own = {"Host": "127.0.0.1:4200", "Origin": "http://127.0.0.1:4200"}
    for site in ("cross-site", "same-site"):
        r = app.test_client().post("/api/things", headers={**own, "Sec-Fetch-Site": site})
        assert (r.status_code, r.get_json()) == (403, {"error": CROSS_SITE_MESSAGE}), site
    assert ran == []
    r = app.test_client().post("/api/things", headers={**own, "Sec-Fetch-Site": "same-origin"})
    assert r.status_code != 403


def test_a_host_that_is_not_a_host_name_is_refused(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, {"allowed_hosts": ["*.example.com"]})
    for host in ("evil.com/.example.com", "evil.com?.example.com", "a b.example.com", "evil.com#.example.com"):
        r = app.test_client().get("/api/things", headers={"Host": host})
        assert (r.status_code, r.get_json()) == (400, {"error": HOST_MESSAGE}), host
    assert app.test_client().get("/api/things", headers={"Host": "a.example.com"}).status_code != 400


def test_host_is_checked_before_origin(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    r = app.test_client().post("/api/things", headers={"Host": "attacker.example", "Origin": EVIL})
    assert r.status_code == 400 and r.get_json() == {"error": HOST_MESSAGE}


def test_guard_uses_the_configured_hosts_origins_and_port(tmp_path: Path) -> None:
    api = {"allowed_hosts": ["agents.internal"], "cors_origins": ["https://app.example.com"]}
    app, ran = make_app(tmp_path, api, listen="127.0.0.1:4321", api_key="k" * 32)
    client = app.test_client()
    assert client.get("/api/things", headers={"Host": "agents.internal:8443"}).status_code == 200
    assert client.get("/api/things", headers={"Host": "agents.internal.evil"}).status_code == 400
    assert client.post("/api/things", headers={"Origin": "https://app.example.com"}).status_code == 200
    assert client.post("/api/things", headers={"Origin": "http://localhost:4321"}).status_code == 200
    assert client.post("/api/things", headers={"Origin": "http://localhost:4200"}).status_code == 403, \
        "BUG: the guard trusts a loopback origin on another port"
    # The origins CORS allows, no more: the dev ports, and `cors_origins` only under a key.
    keyless = make_app(tmp_path, api, listen="127.0.0.1:4321")[0].test_client()
    for origin in ("http://localhost:3000", "http://127.0.0.1:8080"):
        for client_ in (client, keyless):
            r = client_.post("/api/things", headers={"Origin": origin, "Sec-Fetch-Site": "same-site"})
            assert r.status_code == 200, origin
    assert keyless.post("/api/things", headers={"Origin": "https://app.example.com"}).status_code == 403
    assert keyless.post("/api/things", headers={"Origin": "http://localhost:3001"}).status_code == 403


def test_same_origin_under_its_own_name_and_scheme(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, {"allowed_hosts": ["agents.internal"]})
    client = app.test_client()
    headers = {"Host": "agents.internal:8443", "Origin": "http://agents.internal:8443"}
    assert client.post("/api/things", headers=headers).status_code == 200, "BUG: same-origin post refused"
    r = client.post("/api/things", headers={**headers, "Origin": "https://agents.internal:8443"})
    assert r.status_code == 403, "BUG: an https origin counted as the same origin as an http request"
    r = client.post("/api/things", base_url="https://agents.internal:8443",
                    headers={"Origin": "https://agents.internal:8443"})
    assert r.status_code == 200, "BUG: same-origin post over https refused"


def test_cross_site_websocket_upgrade_is_refused(tmp_path: Path) -> None:
    app, ran = make_app(tmp_path)
    client = app.test_client()
    r = client.get("/api/things", headers={"Origin": EVIL, "Upgrade": "websocket", "Connection": "Upgrade"})
    assert r.status_code == 403 and ran == [], "BUG: a cross-site WebSocket handshake passed the guard"
    r = client.get("/api/things", headers={"Origin": EVIL})
    assert r.status_code == 200, "BUG: a cross-site plain GET was refused"


def test_origins_are_lowercased_after_the_slash_is_dropped() -> None:
    # Case folding comes last: an upper-case X at the end of an origin is part of its name.
    policy = OriginPolicy(4200, ["https://App.Example.BOX/"])
    assert "https://app.example.box" in policy.configured
    for origin in ("https://app.example.box", "https://APP.EXAMPLE.BOX", "https://App.Example.BOX/"):
        assert not policy.refuses("POST", origin, None, OWN), f"BUG: configured origin {origin} refused"
    assert not policy.refuses("POST", "HTTP://AGENTS.BOX", None, "http://agents.box")
    assert policy.refuses("POST", "https://app.example.bo", None, OWN)
