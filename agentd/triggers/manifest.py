"""The manifest's `schedule = {proactive = {conditions = [...]}}`: each condition is one
trigger of the agent, kept in step with the manifest (created at spawn, removed at kill).

A condition is a pattern object (agentd/triggers/patterns.py) with an optional `prompt`
(the trigger's prompt template; default `DEFAULT_PROMPT`) and optional caps
(`max_runs_per_day`, `max_cost_usd_per_day`, `rate_limit_per_minute`)::

    [schedule.proactive]
    conditions = [
      { memory_key_pattern = "inbox.*", prompt = "A key changed: {{event}}" },
      { content_match = "deploy", max_runs_per_day = 10 },
    ]
"""

from __future__ import annotations

import tomllib
from typing import Any

from agentd import tomlsafe
from agentd.schema_fields import finite_float, is_blank
from agentd.errors import BadRequest
from agentd.triggers import patterns

DEFAULT_PROMPT = "An event you watch for happened: {{event}}"
CAPS = ("max_runs_per_day", "max_cost_usd_per_day", "rate_limit_per_minute")


def schedule_table(manifest_toml: str) -> Any:
    """The raw `schedule` value of a manifest (None when absent or unreadable)."""
    try:
        return tomlsafe.loads(manifest_toml).get("schedule")
    except (tomllib.TOMLDecodeError, TypeError):
        return None


def check_cap(name: str, value: Any, where: str) -> int | float | None:
    """A cap as stored: None (no cap) or a positive number (an integer for counts)."""
    if value is None:
        return None
    if name == "max_cost_usd_per_day":
        cost = None if isinstance(value, bool) or not isinstance(value, (int, float)) else finite_float(value)
        if cost is None or cost <= 0:
            raise BadRequest(f"{where}.{name}: must be a number greater than 0")
        return cost
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise BadRequest(f"{where}.{name}: must be an integer between 1 and 1000000")
    return value


def proactive_conditions(manifest_toml: str) -> list[dict[str, Any]]:
    """The triggers a manifest asks for: [{kind, pattern, prompt_template, caps...}];
    a 400 naming the condition when one is malformed."""
    schedule = schedule_table(manifest_toml)
    if not isinstance(schedule, dict) or "proactive" not in schedule:
        return []
    proactive = schedule["proactive"]
    where = "schedule.proactive.conditions"
    conditions = proactive.get("conditions", []) if isinstance(proactive, dict) else None
    if not isinstance(conditions, list):
        raise BadRequest(f"invalid manifest format: {where}: must be an array of tables")
    found = []
    for i, condition in enumerate(conditions):
        here = f"{where}[{i}]"
        if not isinstance(condition, dict):
            raise BadRequest(f"invalid manifest format: {here}: must be a table")
        condition = dict(condition)
        prompt = condition.pop("prompt", DEFAULT_PROMPT)
        caps = {name: condition.pop(name, None) for name in CAPS}
        try:
            kind, pattern = patterns.validate(condition, here)
            if not isinstance(prompt, str) or is_blank(prompt):
                raise BadRequest(f"{here}.prompt: must be a non-empty string")
            caps = {name: check_cap(name, value, here) for name, value in caps.items()}
        except BadRequest as exc:
            raise BadRequest(f"invalid manifest format: {exc.message}") from None
        found.append({"kind": kind, "pattern": pattern, "prompt_template": prompt, **caps})
    return found
