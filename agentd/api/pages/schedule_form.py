"""The dashboard's forms for a new cron job and a new trigger: their fields turned into the
bodies of POST /api/cron/jobs and POST /api/triggers (the same kernel calls check them and
name the field at fault)."""

from __future__ import annotations

import math
from typing import Any

from flask import request

FIELDS = ("name", "agent_id", "kind", "expr", "tz", "every_secs", "at", "message", "workflow_id", "input",
          "delivery", "channel", "chat_id", "url", "secret_env", "catch_up", "max_runs_per_day",
          "max_cost_usd_per_day")


def typed(fields: tuple[str, ...], verbatim: str) -> dict[str, str]:
    """What the form's sender typed: each field stripped, the `verbatim` text as it came."""
    form = {key: request.form.get(key, "").strip() for key in fields}
    form[verbatim] = request.form.get(verbatim, "")
    return form


def _number(text: str, kind: type) -> Any:
    """A typed number as a number; anything else as typed, for the checker to name."""
    try:
        value = kind(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def job_body(form: dict[str, str], one_shot: bool) -> dict[str, Any]:
    """The job the form describes; empty inputs are left out (the API's defaults apply)."""
    kind = form.get("kind") or "cron"
    if kind == "every":
        schedule: dict[str, Any] = {"kind": "every", "every_secs": _number(form.get("every_secs", ""), int)}
    elif kind == "at":
        schedule = {"kind": "at", "at": form.get("at", "")}
    else:
        schedule = {"kind": kind, "expr": form.get("expr", "")}
        if form.get("tz"):
            schedule["tz"] = form["tz"]
    if form.get("workflow_id"):
        action: dict[str, Any] = {"kind": "workflow_run", "workflow_id": form["workflow_id"],
                                  "input": form.get("input", "")}
    else:
        action = {"kind": "agent_turn", "message": form.get("message", "")}
    body: dict[str, Any] = {"name": form.get("name", ""), "schedule": schedule, "action": action,
                            "one_shot": one_shot, "catch_up": form.get("catch_up") or "skip"}
    if form.get("agent_id"):
        body["agent_id"] = form["agent_id"]
    delivery = form.get("delivery") or "none"
    if delivery == "channel":
        body["delivery"] = {"kind": "channel", "channel": form.get("channel", "")}
        if form.get("chat_id"):
            body["delivery"]["chat_id"] = form["chat_id"]
    elif delivery == "webhook":
        body["delivery"] = {"kind": "webhook", "url": form.get("url", ""), "secret_env": form.get("secret_env", "")}
    elif delivery != "none":
        body["delivery"] = {"kind": delivery}
    for key, kind_of in (("max_runs_per_day", int), ("max_cost_usd_per_day", float)):
        if form.get(key):
            body[key] = _number(form[key], kind_of)
    return body


TRIGGER_FIELDS = ("agent_id", "kind", "pattern", "channel", "max_runs_per_day", "max_cost_usd_per_day",
                  "rate_limit_per_minute")


def trigger_body(form: dict[str, str]) -> dict[str, Any]:
    """The trigger the form describes: one pattern of `kind`, caps when typed."""
    kind = form.get("kind") or "content_match"
    value: Any = form.get("pattern", "")
    if kind == "channel_message":
        value = {"channel": form.get("channel") or "*", "match": value}
    body: dict[str, Any] = {"agent_id": form.get("agent_id", ""), "pattern": {kind: value},
                            "prompt_template": form.get("prompt_template", "")}
    for key, kind_of in (("max_runs_per_day", int), ("max_cost_usd_per_day", float), ("rate_limit_per_minute", int)):
        if form.get(key):
            body[key] = _number(form[key], kind_of)
    return body
