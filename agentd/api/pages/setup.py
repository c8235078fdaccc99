"""`/setup`: the first run (connect a provider, test it, make it the default model).

Shown instead of the overview until the default model's provider can be called; the nav
keeps a link to it afterwards. A key goes through the same call as PUT
/api/providers/{name}/key (environment + mode-0600 secrets.env) and is never shown back.
"""

from __future__ import annotations

from flask import render_template, request

from agentd.api.pages import bp, form_post, kernel
from agentd.api.pages.notes import see_other_with
from agentd.errors import AgentdError


@bp.get("/setup")
def setup():
    k = kernel()
    chosen = request.args.get("provider") or ""
    if k.catalog.get_provider(chosen) is None:
        chosen = ""
    providers = k.providers.listing()
    models = [m.id for m in k.catalog.models(provider=chosen)] if chosen else []
    return render_template("setup.html", needed=k.first_run.needed(), local=k.first_run.detect_local(),
                           providers=providers, chosen=chosen, models=models,
                           default=k.config.default_model)


@form_post("/setup/provider", "pages.setup", keeps=("base_url",))
def setup_provider():
    """Set the provider's URL and key when given, then test it (POST /api/providers/{name}/test)."""
    providers = kernel().providers
    name = request.form.get("provider", "").strip()
    if not name:
        return see_other_with("pages.setup", ["choose a provider"], ok=False)
    base_url = (request.form.get("base_url") or "").strip()
    key = (request.form.get("api_key") or "").strip()
    done: list[str] = []
    try:
        info = providers.get(name)
        if base_url:
            providers.set_url(name, base_url)
            done.append(f"{name}: base URL set to {providers.base_url(info)}")
        if key:
            providers.set_key(name, key)
            done.append(f"{name}: key saved")
        outcome = providers.test(name)
    except AgentdError as exc:
        message = exc.message if exc.message.startswith(f"{name}:") else f"{name}: {exc.message}"
        return see_other_with("pages.setup", done + [message], ok=False, provider=name or None,
                              typed={"base_url": base_url})
    done.append(f"{name}: reached in {outcome.get('response_time_ms')} ms; now make one of its models the default")
    return see_other_with("pages.setup", done, provider=name, _anchor="default-model")


@form_post("/setup/default", "pages.setup", keeps=("model",))
def setup_default():
    """Write `[default_model]` to config.toml and use it from now on."""
    provider = request.form.get("provider", "")
    model = request.form.get("model", "")
    try:
        outcome = kernel().settings.set_default_model(provider, model)
    except AgentdError as exc:
        return see_other_with("pages.setup", [f"default model: {exc.message}"], ok=False,
                              provider=provider or None, typed={"model": model}, _anchor="default-model")
    return see_other_with("pages.agents_list",
                          [f"default model set to {outcome['provider']}/{outcome['model']}; spawn an agent below"],
                          _anchor="spawn")
