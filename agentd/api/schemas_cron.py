"""JSON Schemas of the cron routes (agentd/api/routes_cron.py). The bodies are checked by
agentd/schedules/jobs.py, which refuses everything these schemas refuse, and more (agents
and workflows that must exist, cron expressions, time zones)."""

from __future__ import annotations

from typing import Any

from agentd.schedules.jobs import MAX_RUNS_PER_DAY

_TEXT = {"type": "string", "minLength": 1, "pattern": r"\S"}
_NULL_STR = {"type": ["string", "null"]}
_TIME = {"type": "string", "format": "date-time"}

SCHEDULE: dict[str, Any] = {"oneOf": [
    {"type": "object", "additionalProperties": False, "required": ["kind", "expr"],
     "properties": {"kind": {"const": "cron"},
                    "expr": {"type": "string", "minLength": 6,
                             "description": "A 5-field cron expression, or @hourly, @daily, @midnight, "
                                            "@weekly, @monthly, @yearly, @annually"},
                    "tz": {"type": ["string", "null"], "description": "IANA time zone (default UTC)"}}},
    {"type": "object", "additionalProperties": False, "required": ["kind", "every_secs"],
     "properties": {"kind": {"const": "every"},
                    "every_secs": {"type": "integer", "minimum": 1, "maximum": 366 * 86400},
                    "tz": {"type": ["string", "null"], "description": "IANA time zone (an interval is the same "
                                                                      "in every zone)"}}},
    {"type": "object", "additionalProperties": False, "required": ["kind", "at"],
     "properties": {"kind": {"const": "at"}, "at": {"type": "string", "minLength": 10,
                                                  "description": "ISO 8601 time; no offset means the zone tz"},
                    "tz": {"type": ["string", "null"], "description": "IANA time zone of an `at` without an "
                                                                      "offset (default UTC)"}}},
]}

ACTION: dict[str, Any] = {"oneOf": [
    {"type": "object", "additionalProperties": False, "required": ["kind", "message"],
     "properties": {"kind": {"const": "agent_turn"}, "message": {**_TEXT, "maxLength": 65536},
                    "timeout_secs": {"type": "integer", "minimum": 1, "maximum": 86400}}},
    {"type": "object", "additionalProperties": False, "required": ["kind", "workflow_id"],
     "properties": {"kind": {"const": "workflow_run"}, "workflow_id": {**_TEXT, "maxLength": 100},
                    "input": {"type": "string", "maxLength": 65536}}},
]}

DELIVERY: dict[str, Any] = {"oneOf": [
    {"type": "null", "description": "The same as {\"kind\": \"none\"}"},
    {"type": "object", "additionalProperties": False, "required": ["kind"],
     "properties": {"kind": {"const": "none"}}},
    {"type": "object", "additionalProperties": False, "required": ["kind", "channel"],
     "properties": {"kind": {"const": "channel"}, "channel": {**_TEXT, "maxLength": 100},
                    "chat_id": {"type": ["string", "null"], "maxLength": 512}}},
    {"type": "object", "additionalProperties": False, "required": ["kind", "url", "secret_env"],
     "properties": {"kind": {"const": "webhook"},
                    "url": {"type": "string", "minLength": 10, "maxLength": 2048,
                            "description": "https:// (http:// only to a loopback address)"},
                    "secret_env": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "maxLength": 200,
                                   "description": "Environment variable holding the HMAC secret (a scoped API "
                                                  "key: one starting with AGENTD_WEBHOOK_)"}}},
]}

_LIMITS = {
    "max_runs_per_day": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_RUNS_PER_DAY},
    "max_cost_usd_per_day": {"type": ["number", "null"], "exclusiveMinimum": 0},
}
_NAME = {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9 _.:@-]{0,127}$"}

_FIELDS: dict[str, Any] = {
    "name": _NAME,
    "agent_id": {**_TEXT, "description": "The agent's id or name (optional for a workflow_run action)"},
    "schedule": SCHEDULE, "action": ACTION, "delivery": DELIVERY,
    "enabled": {"type": "boolean"}, "one_shot": {"type": "boolean"},
    "catch_up": {"type": "string", "enum": ["skip", "once"]},
    **_LIMITS,
}

JOB_CREATE: dict[str, Any] = {"type": "object", "additionalProperties": False,
                              "required": ["name", "schedule", "action"], "properties": _FIELDS}
JOB_PATCH: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": _FIELDS}

LAST_RUN = {"type": ["object", "null"], "properties": {
    "run_id": {"type": "string"}, "status": {"type": "string"}, "started_at": _NULL_STR,
    "finished_at": _NULL_STR, "reason": {"type": "string"}, "error": _NULL_STR,
    "delivery": {"type": ["object", "null"], "description": "The run's delivery state (null without delivery)"}}}

JOB: dict[str, Any] = {"type": "object", "required": [
    "id", "name", "agent_id", "schedule", "action", "delivery", "enabled", "one_shot", "catch_up",
    "max_runs_per_day", "max_cost_usd_per_day", "next_run_at", "last_run", "paused_reason", "created_at"],
    "properties": {
        "id": {"type": "string", "format": "uuid"}, "name": {"type": "string"}, "agent_id": _NULL_STR,
        "schedule": {"type": "object"}, "action": {"type": "object"}, "delivery": {"type": "object"},
        "enabled": {"type": "boolean"}, "one_shot": {"type": "boolean"}, "catch_up": {"type": "string"},
        "max_runs_per_day": {"type": ["integer", "null"]}, "max_cost_usd_per_day": {"type": ["number", "null"]},
        "next_run_at": {"type": ["string", "null"], "description": "The next due time (UTC); null while paused"},
        "last_run": LAST_RUN, "paused_reason": _NULL_STR,
        "origin": {"type": "string", "enum": ["api", "tool", "manifest"]},
        "key_id": {"type": ["string", "null"], "description": "The scoped API key that created the job; its runs "
                   "act as that key (its budget, agent list and state apply). null: the admin's"},
        "created_at": _TIME}}

RUN: dict[str, Any] = {"type": "object", "required": [
    "id", "job_id", "started_at", "finished_at", "status", "reason", "cost_usd", "output", "error", "delivery"],
    "properties": {
        "id": {"type": "string", "format": "uuid"}, "job_id": {"type": "string", "format": "uuid"},
        "daemon_id": {"type": "string"}, "due_at": _NULL_STR, "started_at": {"type": "string"},
        "finished_at": _NULL_STR, "status": {"type": "string", "enum": ["ok", "failed", "skipped", "running"]},
        "reason": {"type": "string"}, "cost_usd": {"type": ["number", "null"]}, "output": _NULL_STR,
        "error": _NULL_STR,
        "delivery": {"type": ["object", "null"], "properties": {
            "status": {"type": "string", "enum": ["pending", "retrying", "delivered", "failed"]},
            "attempts": {"type": "integer"}, "error": _NULL_STR}}}}

REMOVED: dict[str, Any] = {"type": "object", "required": ["status", "job_id"],
                           "properties": {"status": {"const": "removed"}, "job_id": {"type": "string"}}}

LIST_QUERY_DOC = "Only the jobs of this agent (id or name)"
