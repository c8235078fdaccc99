"""Usage and budget, the model catalog, providers (with a connection test)."""

from __future__ import annotations

from datetime import timedelta

from flask import render_template, request, url_for

from agentd.api.pages import bp, form_post, kernel, see_other
from agentd.api.pages.confirm import ask_first
from agentd.api.pages.notes import see_other_with
from agentd.api.principal import principal
from agentd.api.routes_catalog import TIERS
from agentd.errors import AgentdError
from agentd.metering import MAX_ALERT_LEVELS
from agentd.timestamps import utcnow


def _every_day(rows: list[dict], start, end) -> list[dict]:
    """One entry per day from the period start to today (days without calls at zero)."""
    by_day = {r["day"]: r for r in rows}
    last = min(end - timedelta(days=1), utcnow()).date()
    day, out = start.date(), []
    while day <= last:
        out.append(by_day.get(day.isoformat(), {"day": day.isoformat(), "cost_usd": 0.0}))
        day += timedelta(days=1)
    return out


@bp.get("/usage")
def usage():
    metering = kernel().metering
    start, end = metering.period(None, None)
    days = _every_day(metering.by_day(start, end), start, end)
    who = principal()
    agents, by_key = metering.by_agent(start, end), metering.by_key(start, end)
    if not who.is_admin:  # a key's login sees its own spend and the agents it may reach
        reachable = {h.id for h in who.visible(kernel().agents.handles())}
        agents = [a for a in agents if a["agent_id"] in reachable]
        by_key = [k for k in by_key if k["key_id"] == who.key_id]
    return render_template("usage.html", totals=metering.totals(start, end),
                           models=metering.by_model(start, end), agents=agents, keys=by_key,
                           budget=metering.budget(), days=days)


@bp.get("/models")
def models():
    catalog = kernel().catalog
    provider = request.args.get("provider") or None
    tier = request.args.get("tier") or None
    return render_template("models.html", models=catalog.models(provider=provider, tier=tier),
                           aliases=sorted(catalog.aliases().items()), providers=catalog.providers(),
                           tiers=TIERS, provider=provider or "", tier=tier or "")


def _levels(raw: str) -> list[float]:
    """Alert levels typed as fractions of the limit ("0.5, 0.8, 1") or as percentages ("80%")."""
    out = []
    for part in raw.replace(",", " ").split():
        value = float(part[:-1]) / 100 if part.endswith("%") else float(part)
        if value != value:
            raise ValueError(part)
        out.append(value)
    return out


@form_post("/usage/budget", "pages.usage", keeps=("limit_usd", "alert_levels"))
def budget_set():
    """Sets the monthly limit and the alert levels as PUT /api/budget does (0: no limit; alert
    levels left empty: unchanged)."""
    from marshmallow import ValidationError

    from agentd.api.routes_catalog import BudgetSchema

    raw = request.form.get("limit_usd", "").strip()
    raw_levels = request.form.get("alert_levels", "").strip()
    typed = {"limit_usd": raw, "alert_levels": raw_levels}
    try:
        limit = float(raw)
        if limit != limit or limit in (float("inf"), float("-inf")):
            raise ValueError(raw)
        BudgetSchema().load({"limit_usd": limit})
    except (ValueError, ValidationError):
        return see_other_with("pages.usage", [f"budget: {raw!r} is not an amount in USD of 0 or more"], ok=False,
                              typed=typed)
    levels = None
    if raw_levels:
        try:
            levels = _levels(raw_levels)
            BudgetSchema().load({"limit_usd": limit, "alert_levels": levels})
        except (ValueError, ValidationError):
            return see_other_with("pages.usage", [
                f"budget: alert levels {raw_levels!r} must be 1 to {MAX_ALERT_LEVELS} fractions of the limit, "
                "each above 0 and at most 1 (e.g. 0.5, 0.8, 1)"], ok=False, typed=typed)
    metering = kernel().metering
    metering.set_limit(limit, levels)
    note = "budget: no limit" if limit == 0 else f"budget: limit set to ${limit:g} a month"
    notes = [note]
    if levels is not None:
        notes.append("budget: alerts at " + ", ".join(f"{x * 100:g}%" for x in metering.alert_levels)
                     + " of the limit")
    return see_other_with("pages.usage", notes)


@bp.get("/providers")
def providers():
    return render_template("providers.html", providers=kernel().providers.listing())


@form_post("/providers/<name>/test", "pages.providers")
def provider_test(name: str):
    """Runs the same test as POST /api/providers/{name}/test, then shows its outcome on the
    providers page (a redirect, so a refresh does not run it again)."""
    providers = kernel().providers
    providers.get(name)  # an unknown provider is the ordinary 404 page
    try:
        outcome = providers.test(name)
    except AgentdError as exc:
        message = exc.message if exc.message.startswith(f"{name}:") else f"{name}: {exc.message}"
        return see_other_with("pages.providers", [message], ok=False)
    return see_other_with("pages.providers", [f"{name}: reached in {outcome.get('response_time_ms')} ms"])


@bp.route("/providers/<name>/key", methods=["GET", "POST"])
def provider_key(name: str):
    """Saves the provider's key (or, with `remove` and once confirmed, removes it) as PUT and
    DELETE /api/providers/{name}/key do: into the daemon's environment and `secrets.env`. The
    page never shows a key back."""
    providers = kernel().providers
    info = providers.get(name)
    if request.values.get("remove"):
        asked = ask_first(f"Remove the {name} API key?", f"{info.api_key_env} leaves secrets.env and the daemon's "
                          f"environment: agents on {name} models fail until a key is set again.", "Remove the key",
                          url_for("pages.providers"))
        if asked is not None:
            return asked
    elif request.method != "POST":
        return see_other("pages.providers")
    try:
        if request.form.get("remove"):
            providers.delete_key(name)
            return see_other_with("pages.providers", [f"{name}: key removed"])
        providers.set_key(name, request.form.get("api_key", ""))
    except AgentdError as exc:
        return see_other_with("pages.providers", [f"{name}: {exc.message}"], ok=False)
    return see_other_with("pages.providers", [f"{name}: key saved; test it with its Test button"])


@form_post("/providers/url", "pages.providers", keeps=("provider", "base_url"))
def provider_url():
    """Sets a provider's base URL as PUT /api/providers/{name}/url does (a local
    OpenAI-compatible server, a proxy)."""
    providers = kernel().providers
    name = request.form.get("provider", "").strip()
    typed = {"provider": name, "base_url": request.form.get("base_url", "")}
    if not name:
        return see_other_with("pages.providers", ["choose a provider"], ok=False, typed=typed)
    try:
        providers.get(name)
        outcome = providers.set_url(name, typed["base_url"])
    except AgentdError as exc:
        return see_other_with("pages.providers", [f"{name}: {exc.message}"], ok=False, typed=typed)
    return see_other_with("pages.providers", [f"{name}: base URL set to {outcome['base_url']}"])
