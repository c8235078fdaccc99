"""`/settings`: the effective configuration (secrets masked) and its hot reload."""

from __future__ import annotations

from flask import render_template

from agentd.api.pages import bp, form_post, kernel
from agentd.api.pages.notes import see_other_with
from agentd.errors import AgentdError
from agentd.settings import RESTART_ONLY


@bp.get("/settings")
def settings():
    k = kernel()
    return render_template("settings.html", rows=k.settings.effective(), path=k.config.config_path,
                           restart_only=RESTART_ONLY)


@form_post("/settings/reload", "pages.settings")
def settings_reload():
    try:
        outcome = kernel().settings.reload()
    except AgentdError as exc:
        return see_other_with("pages.settings", [exc.message], ok=False)
    lines = [f"configuration reloaded: {', '.join(outcome['applied'])}"]
    if outcome["failed"]:
        lines.append(f"not applied (see the log): {', '.join(outcome['failed'])}")
    return see_other_with("pages.settings", lines, ok=not outcome["failed"])
