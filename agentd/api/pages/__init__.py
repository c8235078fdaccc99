"""The server-rendered dashboard: one blueprint, one module per group of pages.

Views call the same kernel operations as the JSON routes and render Jinja
templates (autoescaped). Every page works without JavaScript; static/app.js only
streams chat replies and decides approvals in place.

Access: without an api_key the dashboard serves loopback clients only (like the
API). With a key, every page but /login redirects (303) to /login until the
browser holds a session cookie (see agentd/api/dashauth.py). Every POST carries
the session's CSRF token or is refused with 403 before anything changes.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from typing import Any, Callable

from flask import Blueprint, Response, current_app, g, redirect, render_template, request, url_for

from agentd.api import dashauth, principal
from agentd.api.errors import error_response, is_api_path, retry_after_header
from agentd.api.middleware import is_authorized, is_loopback
from agentd.api.pages.notes import current_note
from agentd.api.scopes import scope_of
from agentd.errors import AgentdError
from agentd.kernel import Kernel

bp = Blueprint("pages", __name__)

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; object-src 'none'; frame-ancestors 'none'")
# Endpoints reachable without a session (the login form itself, the icon).
OPEN_ENDPOINTS = frozenset({"pages.login", "pages.login_submit", "pages.favicon"})


def kernel() -> Kernel:
    """The kernel this app serves."""
    return current_app.extensions["agentd.kernel"]


def see_other(endpoint: str, **values: str) -> Response:
    """303 to another dashboard page (a POST's answer: the browser then GETs it)."""
    return redirect(url_for(endpoint, **values), code=303)


def refused(page: tuple[str, int], exc: AgentdError) -> tuple[str, int, dict[str, str]]:
    """`page`, showing the refusal `exc`: a 429 says when to come back, as the API's does."""
    body, status = page
    return body, status, {"Retry-After": retry_after_header(exc.retry_after)} if status == 429 else {}


# A form_post endpoint -> the fields a refusal of it by the key's scope shows again.
KEPT: dict[str, tuple[str, ...]] = {}


def form_post(rule: str, page: str,
              keeps: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Route a form's POST at `rule`. A refused POST shows its page at that URL; opening the
    URL again (GET) answers 303 to `page` instead of 405, with the URL's values it takes.

    `keeps`: the typed fields (never a secret) that the refusal page of a key without the
    form's scope shows, since the form's page no longer offers the form to fill again."""
    def register(view: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(view)
        def answer(**values: Any) -> Any:
            if request.method == "GET":
                taken = next(current_app.url_map.iter_rules(page)).arguments
                return see_other(page, **{k: v for k, v in values.items() if k in taken})
            return view(**values)
        KEPT[f"{bp.name}.{view.__name__}"] = keeps
        return bp.route(rule, methods=["GET", "POST"])(answer)
    return register


def _refusal(status: int, message: str, **more: Any) -> Response:
    """The gate's refusal: an error page, which for a form's POST refused by the key's scope
    also shows what was typed, as the form's other refusals keep it."""
    fields = KEPT.get(request.endpoint or "", ()) if status == 403 and request.method == "POST" else ()
    kept = [(k, request.form[k]) for k in fields if request.form.get(k)]
    if not kept:
        return error_response(status, message, **more)
    return Response(render_template("error.html", status=status, message=message, typed=kept, no_session=True),
                    status=status, mimetype="text/html")


def _agent_by_name() -> str:
    """People type an agent's name where its id goes in a dashboard URL (`/agents/helper`).

    Called once the visitor may see pages, before a scoped key's reach is checked against
    the id the name stands for. Returns the text that names no agent the visitor may see
    ("" when it does)."""
    values = request.view_args or {}
    ref = values.get("agent_id")
    if not ref:
        return ""
    try:
        uuid.UUID(ref)
        return ""
    except ValueError:
        pass
    handle = kernel().agents.by_name(ref)
    if handle is None or handle.killed or not principal.principal().sees(handle):
        return ref  # (one outside a scoped key's list: as if there were none)
    values["agent_id"] = handle.id
    return ""


@bp.before_request
def _gate() -> Response | None:
    config = kernel().config
    if request.endpoint == "pages.favicon":
        return None
    if not config.api_key:
        if not is_loopback(request.remote_addr):
            return error_response(401, "this daemon has no api_key, so its dashboard serves only "
                                       "loopback clients; set api_key in config.toml to sign in from elsewhere")
    elif request.endpoint not in OPEN_ENDPOINTS and not is_authorized(config):
        target = request.full_path if request.query_string else request.path
        return redirect(url_for("pages.login", next=target), code=303)
    if request.method == "POST" and request.endpoint != "pages.login_submit" and not dashauth.csrf_ok():
        return error_response(403, "missing or invalid CSRF token: reload the page and try again")
    unknown = _agent_by_name()
    if config.api_key and request.endpoint not in OPEN_ENDPOINTS:
        # A scoped key's login sees what its scopes and agent list allow (agentd/api/principal.py).
        refused = principal.authorize(principal.principal(), current_app.extensions["agentd.key_limits"], _refusal)
        if refused is not None:
            return refused
    if unknown:
        return error_response(404, f"no agent named {unknown!r}")
    return None


@bp.after_app_request
def _page_headers(response: Response) -> Response:
    if not is_api_path(request.path):
        response.headers.setdefault("Content-Security-Policy", CSP)
        if response.mimetype == "text/html":
            response.headers.setdefault("Cache-Control", "no-store")
            started = g.get("started")
            if started is not None:
                # Server time of the page (scripts/bench_dashboard.py reads it; so do browsers' dev tools).
                response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
    return dashauth.set_cookie_if_needed(response)


@bp.app_context_processor
def _template_globals() -> dict:
    config = kernel().config
    return {"csrf_token": dashauth.csrf_token, "auth_enabled": bool(config.api_key),
            "logged_in": dashauth.cookie_authenticates, "who": principal.principal, "may": _may,
            "note": current_note}


def _may(endpoint: str) -> bool:
    """Whether the viewer holds the scope `endpoint` needs: a form it would be refused is not offered."""
    scope = scope_of(endpoint)
    return scope is None or principal.principal().has(scope)


@bp.app_template_filter("usd")
def _usd(value: float | None) -> str:
    if value is None:
        return "–"
    # Below a dollar, the CLI's six decimals: one cheap call costs a few millionths.
    return f"${value:,.6f}" if value < 1 else f"${value:,.2f}"


@bp.app_template_filter("when")
def _when(value: str | None) -> str:
    """An ISO 8601 UTC time as `YYYY-MM-DD HH:MM:SS` (the page says UTC once)."""
    return (value or "")[:19].replace("T", " ")


@bp.app_template_filter("json_text")
def _json_text(value: object, indent: int | None = None) -> str:
    """A stored JSON value as readable text (`<` stays `<`; the page's autoescape makes it safe).

    Jinja's `tojson` is made for `<script>` blocks and writes `<`, `>`, `&` and `'` as
    `\\u003c`-style escapes, which a person reading the page should not have to decode."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


@bp.app_template_filter("tokens")
def _tokens(value: int | None) -> str:
    return "–" if value is None else f"{value:,}"


from agentd.api.pages import (agents, apidoc, autonomy, auth, catalog, channels, files, keys, mcp,  # noqa: E402,F401
                              overview,
                              workflows)
from agentd.api.pages import skills  # noqa: E402,F401
from agentd.api.pages import schedules  # noqa: E402,F401
from agentd.api.pages import audit, channel_config, logs, memory, settings, setup  # noqa: E402,F401
