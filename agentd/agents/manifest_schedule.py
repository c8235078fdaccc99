"""A manifest's `schedule`: when the agent acts on its own.

* `"reactive"` (the default): only when messaged;
* `{periodic = {cron = "0 9 * * *", tz = "Europe/Berlin", message = "..."}}`: a cron job
  `<agent>:periodic` kept in step with the manifest (agentd/schedules/manifest.py);
* `{continuous = {check_interval_secs = 60, message = "..."}}`: a job `<agent>:continuous`
  every `check_interval_secs`;
* `{proactive = {conditions = [...]}}`: event triggers; the conditions are kept as written
  for the trigger engine to read (`Manifest.schedule["proactive"]["conditions"]`).

Parsed into one normalised dict: `{"kind": "reactive"}`, `{"kind": "periodic", "cron",
"tz", "message"}`, `{"kind": "continuous", "check_interval_secs", "message"}` or
`{"kind": "proactive", "conditions"}`.
"""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields

KINDS = ("periodic", "continuous", "proactive")
REACTIVE = {"kind": "reactive"}


def _message(table: dict[str, Any]) -> str:
    message = table.get("message", "")
    if not isinstance(message, str):
        raise ValidationError("message: must be a string")
    if len(message.encode("utf-8")) > 64 * 1024:
        raise ValidationError("message: too long (max 64 KB)")
    return message


def parse_schedule_value(value: Any) -> dict[str, Any]:
    if value is None or (isinstance(value, str) and value.lower() == "reactive"):
        return dict(REACTIVE)
    if isinstance(value, dict) and value.get("kind") == "reactive" and len(value) == 1:
        return dict(REACTIVE)
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in KINDS:
        raise ValidationError('must be "reactive", {periodic = {cron = "..."}}, '
                              "{continuous = {check_interval_secs = N}} or {proactive = {conditions = [...]}}")
    kind, table = next(iter(value.items()))
    if not isinstance(table, dict):
        raise ValidationError(f"{kind}: must be a table")
    if kind == "periodic":
        unknown = sorted(set(table) - {"cron", "tz", "message"})
        if unknown:
            raise ValidationError(f"periodic.{unknown[0]}: unknown key")
        from agentd.errors import BadRequest
        from agentd.schedules.spec import parse_schedule

        try:
            spec = parse_schedule({"kind": "cron", "expr": table.get("cron"), "tz": table.get("tz", "UTC")},
                                  "periodic")
        except BadRequest as exc:
            raise ValidationError(exc.message.replace("periodic.expr", "periodic.cron")) from None
        return {"kind": "periodic", "cron": spec.expr, "tz": spec.tz, "message": _message(table)}
    if kind == "continuous":
        unknown = sorted(set(table) - {"check_interval_secs", "message"})
        if unknown:
            raise ValidationError(f"continuous.{unknown[0]}: unknown key")
        secs = table.get("check_interval_secs", 60)
        if isinstance(secs, bool) or not isinstance(secs, int) or not 1 <= secs <= 366 * 86400:
            raise ValidationError("continuous.check_interval_secs: must be an integer of at least 1")
        return {"kind": "continuous", "check_interval_secs": secs, "message": _message(table)}
    conditions = table.get("conditions", [])
    if not isinstance(conditions, list):
        raise ValidationError("proactive.conditions: must be an array")
    return {"kind": "proactive", "conditions": conditions}


class ScheduleField(fields.Field):
    """The `schedule` key of a manifest (see the module doc)."""

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> dict[str, Any]:
        return parse_schedule_value(value)
