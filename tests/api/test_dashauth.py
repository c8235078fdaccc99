"""agentd/api/dashauth.py exactly: how the session cookie is signed (and by what), expiry at
the limit and one past it, revoked and forged cookies, CSRF tokens and their near misses,
where a token may come from, and the cookie's exact attributes. In process (mutation
testing runs these per mutant); the login flow through the daemon is in tests/api/pages/test_dashboard.py.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from flask import Flask, g, jsonify, request
from itsdangerous import TimestampSigner, URLSafeTimedSerializer

from agentd.api import dashauth
from agentd.api.dashauth import COOKIE, CSRF_FIELD, CSRF_HEADER, SESSION_MAX_AGE, Sessions
from agentd.config import parse_config

KEY = "dash-k3y"


def secret_for(key: str) -> bytes:
    return hmac.new(key.encode(), b"agentd dashboard session v1", hashlib.sha256).digest()


def serializer_at(key: str, when: float) -> URLSafeTimedSerializer:
    """The dashboard's serializer, built independently, signing as if at `when`."""

    class Signer(TimestampSigner):
        def get_timestamp(self) -> int:
            return int(when)

    return URLSafeTimedSerializer(secret_for(key), salt="agentd-dashboard", signer=Signer)


# -- constants and signing -------------------------------------------------------------------------

def test_names_and_limits() -> None:
    assert (COOKIE, CSRF_FIELD, CSRF_HEADER) == ("agentd_session", "csrf_token", "X-CSRF-Token")
    assert SESSION_MAX_AGE == 604800 and dashauth._REVOKED_MAX == 10_000


def test_cookie_is_signed_with_a_secret_derived_from_the_key() -> None:
    value, data = Sessions(KEY).issue(authenticated=True)
    assert data["auth"] is True and set(data) == {"sid", "auth"}
    assert len(data["sid"]) == 24, "session ids carry 18 random bytes"
    assert KEY not in value
    # Anyone holding the derived secret (and only they) can read it: the label and salt are fixed.
    assert URLSafeTimedSerializer(secret_for(KEY), salt="agentd-dashboard").loads(value) == data
    # Another instance with the same key (a restart) reads it; another key does not.
    assert Sessions(KEY).read(value) == data
    assert Sessions(KEY + "x").read(value) is None, "BUG: a session survives an API key change"
    assert Sessions(KEY[:-1]).read(value) is None
    # Without a key the secret is random per process.
    keyless = Sessions("")
    anon, anon_data = keyless.issue(authenticated=False)
    assert anon_data["auth"] is False and keyless.read(anon) == anon_data
    assert Sessions("").read(anon) is None, "BUG: a keyless session cookie is valid in another process"
    assert Sessions(KEY).read(anon) is None


def test_fresh_ids() -> None:
    s = Sessions(KEY)
    sids = {s.issue(False)[1]["sid"] for _ in range(50)}
    assert len(sids) == 50


def test_expiry_at_the_limit_and_one_past() -> None:
    s = Sessions(KEY)
    now = time.time()
    fresh = serializer_at(KEY, now - SESSION_MAX_AGE + 30).dumps({"sid": "abc", "auth": True})
    assert s.read(fresh) == {"sid": "abc", "auth": True}, "BUG: a session expired before its 7 days"
    stale = serializer_at(KEY, now - SESSION_MAX_AGE - 30).dumps({"sid": "abc", "auth": True})
    assert s.read(stale) is None, "BUG: a session older than 7 days still authenticates"


@pytest.mark.parametrize("payload", [["sid", "x"], "sid", {"auth": True}, {"sid": 5, "auth": True},
                                     {"sid": None, "auth": True}, None])
def test_signed_but_malformed_payloads_are_refused(payload) -> None:
    value = serializer_at(KEY, time.time()).dumps(payload)
    assert Sessions(KEY).read(value) is None


@pytest.mark.parametrize("value", [None, "", "x", "e30.abc.def"])
def test_missing_or_forged_cookies_are_refused(value) -> None:
    assert Sessions(KEY).read(value) is None


def test_tampered_cookie_is_refused() -> None:
    s = Sessions(KEY)
    value, data = s.issue(True)
    assert s.read(value) == data
    assert s.read(value[:-1]) is None and s.read(value + "A") is None
    forged = URLSafeTimedSerializer(secret_for(KEY), salt="other").dumps(data)
    assert s.read(forged) is None


def test_revocation_and_its_bound() -> None:
    s = Sessions(KEY)
    first, data = s.issue(True)
    s.revoke(data["sid"])
    assert s.read(first) is None, "BUG: a logged-out session still reads"
    other, other_data = s.issue(True)
    assert s.read(other) == other_data, "BUG: revoking one session revoked another"
    for i in range(dashauth._REVOKED_MAX - 1):
        s.revoke(f"sid-{i}")
    assert len(s._revoked) == 10_000 and s.read(first) is None
    s.revoke("one-more")
    assert s._revoked == {"one-more"}, "BUG: the revocation list is not reset exactly at its bound"
    assert s.read(first) == data


# -- CSRF tokens ----------------------------------------------------------------------------------------

def test_csrf_token_is_the_hmac_of_the_session_id() -> None:
    s = Sessions(KEY)
    csrf_key = hmac.new(secret_for(KEY), b"csrf", hashlib.sha256).digest()
    expected = hmac.new(csrf_key, b"sid-1", hashlib.sha256).hexdigest()
    assert s.csrf_for("sid-1") == expected and len(expected) == 64
    assert Sessions(KEY).csrf_for("sid-1") == expected
    assert Sessions("other").csrf_for("sid-1") != expected


def test_csrf_near_misses() -> None:
    s = Sessions(KEY)
    token = s.csrf_for("sid-1")
    assert s.csrf_valid("sid-1", token) is True
    for near in (None, "", token[:-1], token + "0", token[:32], token.upper(), s.csrf_for("sid-2"),
                 token[:-1] + "é", " " + token):
        assert s.csrf_valid("sid-1", near) is False, f"BUG: CSRF near miss {near!r} accepted"


def test_csrf_token_that_cannot_be_encoded_is_refused_not_an_error() -> None:
    s = Sessions(KEY)
    for token in ("\ud800", s.csrf_for("sid-1")[:-1] + "\udfff"):
        assert s.csrf_valid("sid-1", token) is False


# -- the request helpers on a Flask app -------------------------------------------------------------------

def make_app(tmp_path: Path, api_key: str = KEY) -> Flask:
    config = parse_config({"api_key": api_key} if api_key else {}, tmp_path)
    app = Flask("dashauth-test")
    app.extensions["agentd.kernel"] = SimpleNamespace(config=config)
    app.after_request(dashauth.set_cookie_if_needed)

    @app.get("/session")
    def session():
        first = dashauth.current_session()
        assert dashauth.current_session() is first
        return jsonify({"session": first, "auth": dashauth.cookie_authenticates()})

    @app.get("/ensure")
    def ensure():
        s = dashauth.ensure_session()
        return jsonify({"session": s, "csrf": dashauth.csrf_token(), "same": dashauth.ensure_session() is s})

    @app.post("/login")
    def login():
        return jsonify(dashauth.start_session(request.args.get("auth") == "1"))

    @app.post("/logout")
    def logout():
        dashauth.end_session()
        return jsonify({"session": g.dash_session})

    @app.post("/act")
    def act():
        explicit = request.args.get("token")
        return jsonify({"ok": dashauth.csrf_ok(explicit) if explicit is not None else dashauth.csrf_ok()})

    @app.get("/plain")
    def plain():
        return jsonify({})

    return app


def set_cookie_headers(r) -> list[str]:
    return r.headers.getlist("Set-Cookie")


def login(client, auth: bool = True) -> tuple[str, dict]:
    r = client.post("/login?auth=1" if auth else "/login")
    [header] = set_cookie_headers(r)
    value = header.split(";")[0].split("=", 1)[1]
    return value, r.get_json()


def test_sessions_are_built_once_per_app(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    with app.app_context():
        first = dashauth.sessions()
        assert dashauth.sessions() is first and app.extensions["agentd.sessions"] is first
    value, _ = Sessions(KEY).issue(True)
    with app.app_context():
        assert dashauth.sessions().read(value) is not None, "BUG: the app's sessions ignore the configured key"


def test_no_cookie_no_session_and_no_cookie_set(tmp_path: Path) -> None:
    client = make_app(tmp_path).test_client()
    r = client.get("/session")
    assert r.get_json() == {"session": None, "auth": False}
    assert set_cookie_headers(r) == [], "BUG: a cookie was set on a request that started no session"
    assert set_cookie_headers(client.get("/plain")) == []


def test_login_cookie_attributes_and_authentication(tmp_path: Path) -> None:
    client = make_app(tmp_path).test_client()
    r = client.post("/login?auth=1")
    [header] = set_cookie_headers(r)
    parts = [p.strip() for p in header.split(";")]
    assert parts[0].startswith(f"{COOKIE}=")
    attributes = {p.split("=", 1)[0].lower(): (p.split("=", 1)[1] if "=" in p else True) for p in parts[1:]}
    assert attributes["max-age"] == "604800"
    assert attributes["path"] == "/" and attributes["httponly"] is True and attributes["samesite"] == "Strict"
    assert "secure" not in attributes, "a plain-http cookie cannot be Secure"
    session = client.get("/session").get_json()
    assert session == {"session": r.get_json(), "auth": True}


def test_anonymous_session_cookie_has_no_max_age(tmp_path: Path) -> None:
    client = make_app(tmp_path).test_client()
    r = client.post("/login")
    [header] = set_cookie_headers(r)
    lowered = header.lower()
    assert "max-age" not in lowered and "expires" not in lowered, "BUG: an anonymous session outlives the browser"
    assert "httponly" in lowered and "samesite=strict" in lowered and "path=/" in lowered
    assert client.get("/session").get_json() == {"session": r.get_json(), "auth": False}


def test_cookie_path_and_secure_follow_the_request(tmp_path: Path) -> None:
    client = make_app(tmp_path).test_client()
    r = client.post("/login?auth=1", base_url="https://localhost/agentd")
    [header] = set_cookie_headers(r)
    lowered = header.lower()
    assert "; secure" in lowered and "path=/agentd" in lowered, header
    r = client.post("/logout", base_url="https://localhost/agentd")
    [header] = set_cookie_headers(r)
    lowered = header.lower()
    assert header.startswith(f"{COOKIE}=;") and "max-age=0" in lowered
    assert "; secure" in lowered and "path=/agentd" in lowered and "httponly" in lowered and "samesite=strict" in lowered


def test_logout_clears_the_cookie_and_revokes_the_session(tmp_path: Path) -> None:
    client = make_app(tmp_path).test_client()
    value, data = login(client)
    r = client.post("/logout")
    assert r.get_json() == {"session": None}
    [header] = set_cookie_headers(r)
    lowered = header.lower()
    assert header.startswith(f"{COOKIE}=;") and "max-age=0" in lowered and "path=/" in lowered
    assert "httponly" in lowered and "samesite=strict" in lowered and "secure" not in lowered
    client.set_cookie(COOKIE, value)
    assert client.get("/session").get_json() == {"session": None, "auth": False}, \
        "BUG: a logged-out cookie still authenticates"
    # Logging out without a session clears the cookie too.
    fresh = make_app(tmp_path).test_client()
    [header] = set_cookie_headers(fresh.post("/logout"))
    assert header.startswith(f"{COOKIE}=;")


def test_login_replaces_the_old_session(tmp_path: Path) -> None:
    client = make_app(tmp_path).test_client()
    old_value, old = login(client, auth=False)
    new_value, new = login(client, auth=True)
    assert new["sid"] != old["sid"], "BUG: login keeps the pre-login session id (session fixation)"
    client.set_cookie(COOKIE, old_value)
    assert client.get("/session").get_json()["session"] is None, "BUG: the pre-login session is still valid"
    client.set_cookie(COOKIE, new_value)
    assert client.get("/session").get_json() == {"session": new, "auth": True}


def test_ensure_session_starts_one_only_when_missing(tmp_path: Path) -> None:
    client = make_app(tmp_path).test_client()
    r = client.get("/ensure")
    body = r.get_json()
    assert body["session"]["auth"] is False and body["same"] is True
    [header] = set_cookie_headers(r)
    with make_app(tmp_path).app_context():
        assert body["csrf"] == Sessions(KEY).csrf_for(body["session"]["sid"])
    # The next request keeps the session: same id, no new cookie.
    r = client.get("/ensure")
    assert r.get_json()["session"] == body["session"] and r.get_json()["csrf"] == body["csrf"]
    assert set_cookie_headers(r) == []


def test_csrf_ok_sources(tmp_path: Path) -> None:
    client = make_app(tmp_path).test_client()
    assert client.post("/act", headers={CSRF_HEADER: "x"}).get_json() == {"ok": False}, "no session, no token"
    _, data = login(client)
    with make_app(tmp_path).app_context():
        token = Sessions(KEY).csrf_for(data["sid"])

    def ok(**kwargs) -> bool:
        return client.post("/act", **kwargs).get_json()["ok"]

    assert ok(headers={CSRF_HEADER: token}) is True
    assert ok(headers={"x-csrf-token": token}) is True
    assert ok(headers={CSRF_HEADER: token[:-1]}) is False
    assert ok(data={CSRF_FIELD: token}) is True, "form field refused"
    assert ok(data={CSRF_FIELD: token, "other": "1"}, content_type="multipart/form-data") is True
    assert ok(data={"csrf": token}) is False
    assert ok(data={CSRF_FIELD: token + "0"}) is False
    assert ok() is False
    # The header, when present, is the token: a wrong header is not rescued by a right form field.
    assert ok(data={CSRF_FIELD: token}, headers={CSRF_HEADER: "wrong"}) is False
    # Only form bodies are read for the field.
    assert ok(data=f"{CSRF_FIELD}={token}", content_type="text/plain") is False
    assert ok(json={CSRF_FIELD: token}) is False
    # An explicit token is checked as given.
    assert ok(query_string={"token": token}) is True
    assert ok(query_string={"token": ""}, headers={CSRF_HEADER: token}) is False
    # Another session's token is refused.
    other = make_app(tmp_path).test_client()
    _, other_data = login(other)
    with make_app(tmp_path).app_context():
        other_token = Sessions(KEY).csrf_for(other_data["sid"])
    assert ok(headers={CSRF_HEADER: other_token}) is False, "BUG: a CSRF token of another session accepted"


def test_keyless_app_cookies_authenticate_nothing_elsewhere(tmp_path: Path) -> None:
    client = make_app(tmp_path, api_key="").test_client()
    value, data = login(client)
    assert client.get("/session").get_json() == {"session": data, "auth": True}
    other = make_app(tmp_path, api_key="").test_client()
    other.set_cookie(COOKIE, value)
    assert other.get("/session").get_json() == {"session": None, "auth": False}
