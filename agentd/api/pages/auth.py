"""`/login` and `/logout` (only meaningful when the daemon has an api_key)."""

from __future__ import annotations


from flask import redirect, render_template, request

from agentd import hmacs
from agentd.api import dashauth
from agentd.api.pages import bp, form_post, kernel, see_other
from agentd.apikeys import TOKEN_PREFIX
from agentd.errors import Forbidden, Unauthorized


def _safe_next(target: str | None) -> str:
    """Only paths on this site (no scheme, no `//host`): no open redirect.

    Browsers drop tabs and newlines from a URL and read `\\` as `/`, so `/<TAB>/evil.example`
    or `/\\evil.example` would leave the site: any control character, space or backslash
    makes the target unsafe, wherever it is."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return ""
    if "\\" in target or any(ord(c) < 0x21 or ord(c) == 0x7F for c in target):
        return ""
    return target


def _login_page(error: str = "", status: int = 200, new_session: bool = True):
    # A failed login sets no cookie at all: it re-renders with the session it came with.
    has_session = dashauth.current_session() is not None
    if new_session:
        dashauth.ensure_session()
        has_session = True
    return render_template("login.html", error=error, no_session=not has_session,
                           next=_safe_next(request.values.get("next"))), status


@bp.get("/login")
def login():
    if not kernel().config.api_key:
        # Nothing to sign in to: say so (200) rather than bounce.
        return render_template("login.html", no_key=True, no_session=True, error="", next="")
    if dashauth.cookie_authenticates():
        return see_other("pages.index")
    return _login_page()


@bp.post("/login")
def login_submit():
    key = kernel().config.api_key
    if not key:
        return see_other("pages.index")
    # The form carries the session's token; a session's post without it, or with a wrong
    # one, is refused. A login without a session cookie at all is still accepted: logging a
    # browser into the one identity this daemon has gains an attacker nothing, and cross-site
    # posts never get here (request guard) nor carry the SameSite=Strict cookie.
    token = request.form.get(dashauth.CSRF_FIELD)
    if dashauth.current_session() is not None and (token is None or not dashauth.csrf_ok(token)):
        raise Forbidden("missing or invalid CSRF token: reload the page and try again")
    presented = request.form.get("api_key", "")
    key_id = ""
    if not hmacs.same(presented, key):
        # A scoped key signs in too; its session sees what the key may see.
        if not presented.startswith(TOKEN_PREFIX):
            return _login_page("invalid API key", 401, new_session=False)
        try:
            key_id = kernel().keys.verify(presented).key_id
        except Unauthorized as exc:
            return _login_page(exc.message, 401, new_session=False)
    dashauth.start_session(authenticated=True, key_id=key_id,
                           login=kernel().keys.login_mark(key_id) if key_id else "")
    target = _safe_next(request.form.get("next"))
    # `next` is a path inside the app; behind a proxy prefix the prefix goes in front.
    return redirect(request.script_root + target, code=303) if target else see_other("pages.index")


@form_post("/logout", "pages.index")
def logout():
    dashauth.end_session()
    return see_other("pages.login") if kernel().config.api_key else see_other("pages.index")
