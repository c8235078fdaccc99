"""`/keys`: scoped API keys (create: the secret shown once; list; disable, enable, rotate,
delete), over the same kernel calls as /api/keys."""

from __future__ import annotations

from flask import render_template, request

from agentd.api.body import format_validation
from agentd.api.pages import bp, kernel
from agentd.api.pages.notes import see_other_with
from agentd.api.principal import principal
from agentd.api.schemas_keys import KeyCreateSchema
from agentd.errors import AgentdError, BadRequest

ACTIONS = ("disable", "enable", "rotate", "delete")


def _keys_page(status: int = 200, error: str = "", secret: dict | None = None):
    return render_template("keys.html", keys=kernel().keys.list(), error=error, secret=secret,
                           scopes=("read", "message", "manage", "admin"),
                           admin_key=bool(kernel().config.api_key)), status


@bp.get("/keys")
def keys():
    return _keys_page()


def _number(field: str, kind: type) -> float | int | None:
    text = (request.form.get(field) or "").strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise BadRequest(f"{field} must be a number") from None


@bp.post("/keys")
def keys_create():
    form = request.form
    data: dict = {"name": form.get("name", "").strip(), "scopes": form.getlist("scopes"),
                  "agents": [a.strip() for a in form.get("agents", "").split(",") if a.strip()]}
    try:
        for field, kind in (("budget_usd_per_day", float), ("budget_usd_per_month", float),
                            ("rate_limit_per_minute", int)):
            value = _number(field, kind)
            if value is not None:
                data[field] = value
        if form.get("expires_at", "").strip():
            data["expires_at"] = form["expires_at"].strip()
        errors = KeyCreateSchema().validate(data)
        if errors:
            raise BadRequest(f"invalid key: {format_validation(errors)}")
        created = kernel().keys.create(KeyCreateSchema().load(data), principal())
    except AgentdError as exc:
        return _keys_page(exc.status, exc.message)
    return _keys_page(201, secret=created)


@bp.post("/keys/<key_id>/<action>")
def key_action(key_id: str, action: str):
    keys_ = kernel().keys
    try:
        if action == "rotate":
            return _keys_page(secret=keys_.rotate(key_id, principal()))
        if action not in ACTIONS:
            raise BadRequest(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
        name = keys_.get(key_id)["name"]
        if action == "delete":
            keys_.delete(key_id, principal())
        else:
            keys_.update(key_id, {"enabled": action == "enable"}, principal())
    except AgentdError as exc:
        return _keys_page(exc.status, exc.message)
    return see_other_with("pages.keys", [f"key {name} {action}d"])
