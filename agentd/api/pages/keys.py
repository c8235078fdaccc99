"""`/keys`: scoped API keys (create: the secret shown once; list; disable, enable, rotate,
delete), over the same kernel calls as /api/keys."""

from __future__ import annotations

from typing import Any

from flask import make_response, render_template, request, url_for
from itsdangerous import BadSignature
from marshmallow import ValidationError
from werkzeug.datastructures import MultiDict

from agentd.api import dashauth
from agentd.api.body import format_validation
from agentd.api.pages import bp, form_post, kernel, see_other
from agentd.api.pages.confirm import ask_first
from agentd.api.pages.notes import see_other_with
from agentd.api.principal import principal
from agentd.api.schemas_keys import KeyCreateSchema, KeyUpdateSchema
from agentd.errors import AgentdError, BadRequest

ACTIONS = ("disable", "enable", "rotate", "delete")
# The actions that cannot be undone, and what their confirmation says: question, consequence, button.
ASKED = {"rotate": ("Rotate key {name}?", "A new secret is shown once and the current one stops working at once: "
                                          "every client using it needs the new one.", "Rotate {name}"),
         "delete": ("Delete key {name}?", "Requests made with it are refused from now on. This cannot be undone.",
                    "Delete {name}")}
# The new secret travels to the page the POST redirects to in this cookie: signed, bound to
# the session, scoped to /keys and short-lived, and cleared as soon as the page showed it. It
# needs no server-side state, so any daemon behind a load balancer can show it.
SHOWN_COOKIE = "agentd_key_once"
SHOWN_MAX_AGE = 120


def _keys_page(status: int = 200, error: str = "", secret: dict | None = None, form: Any = None,
               editing: dict | None = None):
    """`form`: a refused form's fields, to fill it with again; `editing`: the key the form edits."""
    return render_template("keys.html", keys=kernel().keys.list(), error=error, secret=secret, form=form,
                           editing=editing,
                           scopes=("read", "message", "manage", "admin"),
                           admin_key=bool(kernel().config.api_key)), status


def _key_form(key: dict) -> MultiDict:
    """The key as the form's fields, to edit it."""
    number = {f: "" if key[f] is None else f"{key[f]:g}"
              for f in ("budget_usd_per_day", "budget_usd_per_month", "rate_limit_per_minute")}
    return MultiDict([("name", key["name"]), *(("scopes", s) for s in key["scopes"]),
                      ("agents", ", ".join(key["agents"] or [])), *number.items(),
                      ("expires_at", key["expires_at"] or "")])


@bp.get("/keys")
def keys():
    edit = request.args.get("edit")
    if edit:
        key = kernel().keys.get(edit)  # unknown: the ordinary 404 page
        return _keys_page(form=_key_form(key), editing=key)
    value = request.cookies.get(SHOWN_COOKIE)
    if not value:
        return _keys_page()
    secret = None
    try:
        data = dashauth.sessions().notes.loads(value, max_age=SHOWN_MAX_AGE)
        session = dashauth.current_session()
        if isinstance(data, dict) and session and data.get("sid") == session["sid"]:
            secret = {"name": data["name"], "key": data["key"]}
    except (BadSignature, KeyError):
        pass
    body, status = _keys_page(secret=secret)
    response = make_response(body, status)
    response.delete_cookie(SHOWN_COOKIE, path=url_for("pages.keys"), httponly=True, samesite="Strict",
                           secure=request.is_secure)
    return response


def _show_once(created: dict, verb: str):
    """303 to /keys, which shows the new secret once (a refresh neither re-submits nor shows it)."""
    value = dashauth.sessions().notes.dumps({"sid": dashauth.ensure_session()["sid"], "name": created["name"],
                                            "key": created["key"]})
    response = see_other_with("pages.keys", [f"key {created['name']} {verb}"])
    response.set_cookie(SHOWN_COOKIE, value, max_age=SHOWN_MAX_AGE, path=url_for("pages.keys"), httponly=True,
                        samesite="Strict", secure=request.is_secure)
    return response


def _number(field: str, kind: type) -> float | int | None:
    text = (request.form.get(field) or "").strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise BadRequest(f"{field} must be a number") from None


def _typed_key(form: Any, cleared: Any) -> dict:
    """The key the form describes; an empty number or expiry is left out, or `cleared` (None: no
    budget, no limit, never) when editing."""
    data: dict = {"name": form.get("name", "").strip(), "scopes": form.getlist("scopes"),
                  "agents": [a.strip() for a in form.get("agents", "").split(",") if a.strip()]}
    for field, kind in (("budget_usd_per_day", float), ("budget_usd_per_month", float),
                        ("rate_limit_per_minute", int)):
        value = _number(field, kind)
        if value is not None or cleared is not ...:
            data[field] = value
    expiry = form.get("expires_at", "").strip()
    if expiry or cleared is not ...:
        data["expires_at"] = expiry or None
    return data


def _loaded(schema: Any, data: dict) -> dict:
    try:
        return schema.load(data)
    except ValidationError as exc:  # the expiry is read after the fields' own checks
        raise BadRequest(f"invalid key: {format_validation(exc.messages)}") from None


@bp.post("/keys")
def keys_create():
    form = request.form
    try:
        created = kernel().keys.create(_loaded(KeyCreateSchema(), _typed_key(form, ...)), principal())
    except AgentdError as exc:
        return _keys_page(exc.status, exc.message, form=form)
    return _show_once(created, "created")


@form_post("/keys/<key_id>/edit", "pages.keys")
def key_edit(key_id: str):
    """Change the key's name, scopes, agents, budgets, rate limit and expiry as PATCH
    /api/keys/{id} does; an emptied number or expiry is removed, no agents means all."""
    keys_ = kernel().keys
    key = keys_.get(key_id)  # unknown: the ordinary 404 page
    form = request.form
    try:
        data = _typed_key(form, None)
        updated = keys_.update(key_id, _loaded(KeyUpdateSchema(), data), principal())
    except AgentdError as exc:
        return _keys_page(exc.status, exc.message, form=form, editing=key)
    return see_other_with("pages.keys", [f"key {updated['name']} saved"], _anchor=f"key-{key_id}")


@bp.route("/keys/<key_id>/<action>", methods=["GET", "POST"])
def key_action(key_id: str, action: str):
    keys_ = kernel().keys
    try:
        if action not in ACTIONS:
            raise BadRequest(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
        name = keys_.get(key_id)["name"]
        if action in ASKED:
            question, consequence, button = (text.format(name=name) for text in ASKED[action])
            asked = ask_first(question, consequence, button, url_for("pages.keys", _anchor=f"key-{key_id}"))
            if asked is not None:
                return asked
        elif request.method != "POST":
            return see_other("pages.keys")
        if action == "rotate":
            return _show_once(keys_.rotate(key_id, principal()), "rotated")
        if action == "delete":
            keys_.delete(key_id, principal())
        else:
            keys_.update(key_id, {"enabled": action == "enable"}, principal())
    except AgentdError as exc:
        return _keys_page(exc.status, exc.message)
    return see_other_with("pages.keys", [f"key {name} {action}d"])
