"""Dashboard sessions and CSRF tokens.

The session cookie holds a token signed with a secret derived from the API key
(HMAC of a fixed label; never the key itself), so changing the key ends every
session and a restart keeps them. Without an API key the secret is random per
process: the cookie then only carries the session id that CSRF tokens are bound
to, it authenticates nothing (loopback clients are served anyway).

The CSRF token is an HMAC of the session id, so it is bound to one session and
needs no server-side storage.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

from flask import current_app, g, request
from itsdangerous import BadSignature, URLSafeTimedSerializer

from agentd import hmacs
from agentd.config import Config

COOKIE = "agentd_session"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
SESSION_MAX_AGE = 7 * 24 * 3600
_LABEL = b"agentd dashboard session v1"
_REVOKED_MAX = 10_000


class Sessions:
    """Issues and checks session tokens and their CSRF tokens."""

    def __init__(self, api_key: str) -> None:
        if api_key:
            secret = hmacs.digest(api_key, _LABEL)
        else:
            secret = secrets.token_bytes(32)
        self._serializer = URLSafeTimedSerializer(secret, salt="agentd-dashboard")
        # Signs the message a POST's redirect carries to the page it lands on.
        self.notes = URLSafeTimedSerializer(secret, salt="agentd-dashboard-note")
        self._csrf_key = hmacs.digest(secret, b"csrf")
        # Logged-out session ids: the cookie is stateless, so logout remembers it here.
        self._revoked: set[str] = set()
        self._lock = threading.Lock()

    def issue(self, authenticated: bool, key_id: str = "", login: str = "") -> tuple[str, dict[str, Any]]:
        """A new session (fresh id) and its signed cookie value (`key_id`: logged in with
        that scoped key rather than the admin key; `login`: the key's login mark)."""
        data: dict[str, Any] = {"sid": secrets.token_urlsafe(18), "auth": authenticated}
        if key_id:
            data["key"] = key_id
            data["login"] = login
        return self._serializer.dumps(data), data

    def read(self, value: str | None) -> dict[str, Any] | None:
        """The session a cookie value names, or None when missing, forged, expired or revoked."""
        if not value:
            return None
        try:
            data = self._serializer.loads(value, max_age=SESSION_MAX_AGE)
        except BadSignature:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("sid"), str):
            return None
        with self._lock:
            if data["sid"] in self._revoked:
                return None
        return data

    def revoke(self, sid: str) -> None:
        with self._lock:
            if len(self._revoked) >= _REVOKED_MAX:
                self._revoked.clear()
            self._revoked.add(sid)

    def csrf_for(self, sid: str) -> str:
        return hmacs.hex_digest(self._csrf_key, sid)

    def csrf_valid(self, sid: str, token: str | None) -> bool:
        return hmacs.same(token, self.csrf_for(sid))


def sessions() -> Sessions:
    """The app's session authority (built once per app from the config)."""
    app = current_app
    found = app.extensions.get("agentd.sessions")
    if found is None:
        config: Config = app.extensions["agentd.kernel"].config
        found = app.extensions.setdefault("agentd.sessions", Sessions(config.api_key))
    return found


def current_session() -> dict[str, Any] | None:
    """The valid session of this request's cookie (read once per request)."""
    if "dash_session" not in g:
        g.dash_session = sessions().read(request.cookies.get(COOKIE))
    return g.dash_session


def cookie_authenticates() -> bool:
    """Whether the request's cookie is a logged-in dashboard session."""
    session = current_session()
    return bool(session and session.get("auth"))


def ensure_session() -> dict[str, Any]:
    """This request's session, starting an anonymous one (cookie set on the way out)."""
    session = current_session()
    if session is None:
        value, session = sessions().issue(authenticated=False)
        g.dash_session = session
        g.dash_set_cookie = value
    return session


def start_session(authenticated: bool, key_id: str = "", login: str = "") -> dict[str, Any]:
    """A fresh session replacing any old one (a new id on login stops session fixation)."""
    old = current_session()
    if old is not None:
        sessions().revoke(old["sid"])
    value, session = sessions().issue(authenticated, key_id, login)
    g.dash_session = session
    g.dash_set_cookie = value
    return session


def end_session() -> None:
    old = current_session()
    if old is not None:
        sessions().revoke(old["sid"])
    g.dash_session = None
    g.dash_set_cookie = ""


def csrf_token() -> str:
    """The CSRF token of this request's session (templates call this)."""
    return sessions().csrf_for(ensure_session()["sid"])


def csrf_ok(token: str | None = None) -> bool:
    """Whether the request carries the CSRF token of its session (form field or header)."""
    session = current_session()
    if session is None:
        return False
    if token is None:
        token = request.headers.get(CSRF_HEADER)
        if token is None and request.mimetype in ("application/x-www-form-urlencoded", "multipart/form-data"):
            token = request.form.get(CSRF_FIELD)
    return sessions().csrf_valid(session["sid"], token)


def set_cookie_if_needed(response: Any) -> Any:
    """Write (or clear) the session cookie decided during this request."""
    value = g._get_current_object().get("dash_set_cookie")
    if value is None:  # (every answer asks)
        return response
    path = request.script_root or "/"
    if value == "":
        response.delete_cookie(COOKIE, path=path, httponly=True, samesite="Strict",
                               secure=request.is_secure)
        return response
    session = g.get("dash_session") or {}
    response.set_cookie(COOKIE, value, max_age=SESSION_MAX_AGE if session.get("auth") else None,
                        path=path, httponly=True, samesite="Strict", secure=request.is_secure)
    return response
