"""`/channels/<name>`: one adapter's form, Test button, live state and last errors.

The form is built from the adapter's catalogue entry (its `fields`, then its other keys
under "More settings", then the `overrides` its adapter honours) and saved through the same kernel call as
POST /api/channels/{name}/configure: secrets typed into password fields go in its `secrets`
object, so they land in `secrets.env` (mode 0600) and the daemon's environment and never in
config.toml; the page only says whether each is set. The Test button sends a real message
through the adapter (POST /api/channels/{name}/test's call) and shows what the platform
answered. Every POST redirects back with a message (post/redirect/get).
"""

from __future__ import annotations

import os
from typing import Any

from flask import abort, render_template, request, url_for

from agentd.api.pages import bp, form_post, kernel
from agentd.api.pages.confirm import ask_first
from agentd.api.pages.notes import see_other_with
from agentd.api.principal import principal
from agentd.api.channel_reach import hide_unreached, hide_unreached_item, reach_channel, reaches_channel
from agentd.channels import overrides as channel_overrides
from agentd.channels.catalog import ChannelInfo, field_views, settings_for
from agentd.errors import AgentdError

# Audit events that report something going wrong with a channel.
PROBLEMS = ("channel.error", "channel.start_failed", "channel.send_failed", "channel.test_failed",
            "channel.connection_error", "channel.dropped", "channel.refused")
EVENTS_SCANNED = 500
PROBLEMS_SHOWN = 10
TEST_MESSAGE = "Test message from agentd"


def form_fields(info: ChannelInfo, section: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The form's inputs: the catalogue's fields, then every other key a form can hold
    (tables such as `overrides` stay as they are). Secrets carry `env_var` and `has_value`
    (the variable is set), never a value."""
    section = section or {}
    effective = settings_for(info, section)
    rows = []
    for field in field_views(info, section):
        row = dict(field)
        row["advanced"] = bool(row["advanced"])
        if row["type"] == "secret":
            row["value"] = ""
        elif "value" not in row:
            row["value"] = ""
        rows.append(row)
    shown = {row["key"] for row in rows}
    for key, spec in info.keys.items():
        if key in shown or spec["kind"] == "table":
            continue
        value = effective.get(key)
        if key.endswith("_env"):
            env = value if isinstance(value, str) else ""
            rows.append({"key": key, "label": key, "type": "secret", "env_var": env, "required": False,
                         "has_value": bool(env and os.environ.get(env)), "placeholder": "", "advanced": True,
                         "value": ""})
            continue
        kind = {"list": "list", "number": "number", "bool": "bool"}.get(spec["kind"], "text")
        if kind == "bool":
            text = "1" if value else ""
        elif isinstance(value, list):
            text = ", ".join(str(v) for v in value)
        else:
            text = "" if value is None or key not in section else str(value)
        rows.append({"key": key, "label": key, "type": kind, "env_var": "", "required": False,
                     "has_value": key in section, "placeholder": "" if value is None else str(value),
                     "advanced": True, "value": text})
    return rows


def override_fields(info: ChannelInfo, section: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One input per override the adapter honours (`overrides.<key>`), holding the saved
    value ("" : the channel's default). A table of reaction emoji is left as saved."""
    saved = (section or {}).get("overrides") or {}
    rows = []
    for key, choices in channel_overrides.choices_for(info.name).items():
        value = saved.get(key)
        if isinstance(value, dict):
            continue
        text = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        kind = "textarea" if key == "system_prompt" else choices if isinstance(choices, str) else "choice"
        if kind == "choice" and text and text not in choices:
            choices = (*choices, text)  # saved under another name (plain_text): kept, shown selected
        rows.append({"key": f"overrides.{key}", "label": key, "type": kind, "value": text, "required": False,
                     "placeholder": "", "choices": choices if kind == "choice" else ()})
    return rows


def _overrides(info: ChannelInfo, section: dict[str, Any]) -> dict[str, Any] | None:
    """The `overrides` table with the posted override inputs applied (an emptied input
    removes its key); None when the form posted none of them."""
    form = request.form
    rows = [row for row in override_fields(info, section) if row["key"] in form]
    if not rows:
        return None
    table = dict(section.get("overrides") or {})
    for row in rows:
        key, value = row["key"].split(".", 1)[1], form.get(row["key"], "").strip()
        if not value:
            table.pop(key, None)
        elif row["type"] == "choice" and row["choices"] == ("true", "false"):
            table[key] = value == "true"
        elif row["type"] == "number" and value.isdigit():
            table[key] = int(value)
        else:
            table[key] = value  # anything else is checked, and refused naming the key, on saving
    return table


def _body(info: ChannelInfo, section: dict[str, Any]) -> dict[str, Any]:
    """The configure body from the posted form: the saved section with each posted input
    applied (an emptied input removes its key, an input not posted leaves it alone, an
    empty password keeps the stored secret)."""
    body = dict(section)
    secrets: dict[str, str] = {}
    form = request.form
    for row in form_fields(info, section):
        key = row["key"]
        if row["type"] == "secret":
            value = form.get(key, "")
            if value:
                secrets[key] = value
            if f"env:{key}" in form:
                name = form.get(f"env:{key}", "").strip()
                if name:
                    body[key] = name
                else:
                    body.pop(key, None)
        elif key not in form:
            continue
        elif row["type"] == "bool":
            on = "1" in form.getlist(key)  # a hidden "0" comes first: an unticked box is posted too
            if on == bool(info.keys[key].get("default")):
                body.pop(key, None)
            else:
                body[key] = on
        else:
            value = form.get(key, "").strip()
            if value:
                body[key] = value
            else:
                body.pop(key, None)
    table = _overrides(info, section)
    if table is not None:
        if table:
            body["overrides"] = table
        else:
            body.pop("overrides", None)
    if secrets:
        body["secrets"] = secrets
    return body


def _problems(name: str) -> list[dict[str, Any]]:
    audit = getattr(kernel(), "audit", None)
    if audit is None or (principal().agents and not reaches_channel(name)):
        return []  # another agent's channel: its errors name what a limited key must not see
    rows = [e for e in audit.recent(EVENTS_SCANNED, "channel.") if e["subject"] == name and e["event"] in PROBLEMS]
    return rows[:PROBLEMS_SHOWN]


@bp.get("/channels/<name>")
def channel_page(name: str):
    channels = kernel().channels
    if name not in channels.catalog.names():
        abort(404)
    info = channels.catalog.get(name)
    item = next(i for i in channels.list() if i["name"] == name)
    section = channels.sections.get(name)
    fields = form_fields(info, section)
    hide_unreached(fields)
    hide_unreached_item(item)
    return render_template("channel.html", channel=item, fields=fields, overrides=override_fields(info, section),
                           webhook=channels.webhook(name) is not None, running=name in channels.running,
                           problems=_problems(name), test_message=TEST_MESSAGE)


@form_post("/channels/<name>/configure", "pages.channel_page")
def channel_configure(name: str):
    channels = kernel().channels
    if name not in channels.catalog.names():
        abort(404)
    info = channels.catalog.get(name)
    try:
        data = _body(info, dict(channels.sections.get(name) or {}))
        reach_channel(name, data)
        result = channels.configure(name, data, key_id=principal().key_id)
    except AgentdError as exc:
        return see_other_with("pages.channel_page", [f"{name}: {exc.message}"], ok=False, name=name)
    lines = [f"{name}: configuration saved" + ("; the adapter started" if result["activated"] else "")]
    if result.get("secrets_saved"):
        lines.append("secrets saved to secrets.env: " + ", ".join(result["secrets_saved"]))
    if result.get("note"):
        lines.append(result["note"])
    return see_other_with("pages.channel_page", lines, ok=bool(result["activated"]), name=name)


@bp.route("/channels/<name>/remove", methods=["GET", "POST"])
def channel_remove(name: str):
    channels = kernel().channels
    if name not in channels.catalog.names():
        abort(404)
    try:
        reach_channel(name)
    except AgentdError as exc:
        return see_other_with("pages.channel_page", [f"{name}: {exc.message}"], ok=False, name=name)
    asked = ask_first(f"Remove the {name} configuration?", f"Its [channels.{name}] section leaves config.toml and "
                      "the adapter stops; its secrets stay in secrets.env.", f"Remove {name}",
                      url_for("pages.channel_page", name=name))
    if asked is not None:
        return asked
    channels.remove(name)
    return see_other_with("pages.channel_page", [f"{name}: configuration removed and the adapter stopped"],
                          name=name)


@form_post("/channels/<name>/test", "pages.channel_page", keeps=("message",))
def channel_test(name: str):
    channels = kernel().channels
    if name not in channels.catalog.names():
        abort(404)
    message = request.form.get("message", "").strip() or TEST_MESSAGE
    try:
        reach_channel(name)
        result = channels.test(name, message, request.form.get("chat_id", "").strip(), detail=True)
    except AgentdError as exc:
        return see_other_with("pages.channel_page", [f"{name}: {exc.message}"], ok=False, name=name)
    answer = result["message"]
    if result.get("message_id"):
        answer += f"; the platform's message id: {result['message_id']}"
    return see_other_with("pages.channel_page", [f"{name}: {answer}"], name=name)
