"""schedule_create, schedule_list, schedule_delete, cron_create, cron_list, cron_cancel.

An agent schedules its own follow-ups ("remind me at 9:00 tomorrow") as cron jobs
(agentd/schedules/). The jobs an agent lists and removes are its own: those that run it.
In a run paid by a scoped API key, a job is made and removed as that key (`manage`, its
agent list), and each of the job's runs is the key's (agentd/key_runs.py).
None of these tools is offered in Observe mode (like the original, not even the lists).
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentd.agents.tools.base import ToolContext, ToolError, tool
from agentd.errors import AgentdError

DESCRIPTION_LIMIT = 4096


def _cron(ctx: ToolContext) -> Any:
    if ctx.cron is None:
        raise ToolError("cron jobs are not available here")
    return ctx.cron


def _summary(job: dict[str, Any]) -> dict[str, Any]:
    return {key: job[key] for key in ("id", "name", "schedule", "action", "enabled", "one_shot", "next_run_at",
                                      "paused_reason", "last_run")}


def _own(ctx: ToolContext, job_id: Any) -> dict[str, Any]:
    cron = _cron(ctx)
    if not isinstance(job_id, str) or not job_id.strip():
        raise ToolError("a job id is required")
    try:
        job = cron.get(job_id.strip())
    except AgentdError:
        raise ToolError(f"no scheduled job {job_id!r}") from None
    if job["agent_id"] != ctx.agent_id:
        raise ToolError(f"job {job_id!r} does not belong to this agent")
    return job


def _create(ctx: ToolContext, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return _cron(ctx).create(body, origin="tool", by=ctx.acting())
    except AgentdError as exc:
        raise ToolError(exc.message) from None


def _delete(ctx: ToolContext, job: dict[str, Any]) -> None:
    try:
        _cron(ctx).delete(job["id"], by=ctx.acting())
    except AgentdError as exc:
        raise ToolError(exc.message) from None


def _job_name(description: str) -> str:
    name = re.sub(r"[^A-Za-z0-9 _.:@-]+", " ", description).strip()
    name = " ".join(name.split())[:120] or "scheduled task"
    return name if name[0].isalnum() else f"task {name}"[:128]


@tool("schedule_create",
      "Schedule a recurring or one-time task for an agent (default: yourself): at each due time the agent "
      "gets the description as its message. `schedule` is a cron expression ('0 */5 * * *') or a phrase: "
      "'every 5 minutes', 'hourly', 'daily at 9am', 'weekdays at 6pm', 'mondays at 8:15', 'in 20 minutes', "
      "'tomorrow at 9:00', or an ISO 8601 time for once. Times are UTC.",
      {"description": {"type": "string", "description": "What this schedule does (the agent's message)"},
       "schedule": {"type": "string", "description": "Natural language or cron expression"},
       "agent": {"type": "string", "description": "Agent name or ID to run this task (default: yourself)"}},
      required=("description", "schedule"))
def schedule_create(ctx: ToolContext, args: dict[str, Any]) -> str:
    from agentd.schedules.phrases import parse_phrase

    description = args["description"].strip()
    if not description:
        raise ToolError("description must not be empty")
    if len(description) > DESCRIPTION_LIMIT:
        raise ToolError(f"description too long (max {DESCRIPTION_LIMIT} characters)")
    try:
        schedule = parse_phrase(args["schedule"])
    except AgentdError as exc:
        raise ToolError(exc.message) from None
    job = _create(ctx, {"name": _job_name(description), "agent_id": args.get("agent") or ctx.agent_id,
                        "schedule": schedule, "action": {"kind": "agent_turn", "message": description},
                        "one_shot": schedule["kind"] == "at"})
    return json.dumps({"id": job["id"], "description": description, "schedule": job["schedule"],
                       "next_run_at": job["next_run_at"]})


@tool("schedule_list", "List your scheduled tasks with their IDs, descriptions, schedules and next run times.", {})
def schedule_list(ctx: ToolContext, args: dict[str, Any]) -> str:
    jobs = _cron(ctx).list(ctx.agent_id)
    return json.dumps([{"id": j["id"], "description": j["action"].get("message", j["name"]),
                        "schedule": j["schedule"], "enabled": j["enabled"], "next_run_at": j["next_run_at"]}
                       for j in jobs])


@tool("schedule_delete", "Remove one of your scheduled tasks by its ID.",
      {"id": {"type": "string", "description": "The schedule ID to remove"}}, required=("id",))
def schedule_delete(ctx: ToolContext, args: dict[str, Any]) -> str:
    job = _own(ctx, args["id"])
    _delete(ctx, job)
    return f"removed scheduled task {job['id']} ({job['name']})"


@tool("cron_create",
      "Create a cron job that runs you: schedule {kind: at, at: ISO time} | {kind: every, every_secs: N} | "
      "{kind: cron, expr: '0 */6 * * *', tz?}; action {kind: agent_turn, message} (or {kind: system_event, "
      "text}) | {kind: workflow_run, workflow_id, input}; delivery {kind: none} | {kind: channel, channel, "
      "chat_id?} | {kind: webhook, url, secret_env}. one_shot: run once, then the job is disabled.",
      {"name": {"type": "string", "description": "Job name (max 128 chars, letters, digits, spaces, - _ . : @)"},
       "schedule": {"type": "object", "description": "When to run"},
       "action": {"type": "object", "description": "What to do"},
       "delivery": {"type": "object", "description": "Where the result goes (default: nowhere)"},
       "one_shot": {"type": "boolean", "description": "Run once, then disable the job (default false)"}},
      required=("name", "schedule", "action"))
def cron_create(ctx: ToolContext, args: dict[str, Any]) -> str:
    action = dict(args["action"])
    if action.get("kind") == "system_event":
        action = {"kind": "agent_turn", "message": action.get("text")}
    body: dict[str, Any] = {"name": args["name"], "agent_id": ctx.agent_id, "schedule": args["schedule"],
                            "action": action}
    if "delivery" in args:
        body["delivery"] = args["delivery"]
    if "one_shot" in args:
        body["one_shot"] = args["one_shot"]
    return json.dumps(_summary(_create(ctx, body)))


@tool("cron_list", "List your cron jobs.", {})
def cron_list(ctx: ToolContext, args: dict[str, Any]) -> str:
    return json.dumps([_summary(j) for j in _cron(ctx).list(ctx.agent_id)])


@tool("cron_cancel", "Cancel (remove) one of your cron jobs by its ID.",
      {"job_id": {"type": "string", "description": "The UUID of the cron job to cancel"}}, required=("job_id",))
def cron_cancel(ctx: ToolContext, args: dict[str, Any]) -> str:
    job = _own(ctx, args["job_id"])
    _delete(ctx, job)
    return f"cancelled cron job {job['id']} ({job['name']})"
