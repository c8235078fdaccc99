"""`agentd cron list|add|run|pause|resume|rm`: cron jobs through the API."""

from __future__ import annotations

import json
from typing import Any

import argh

from agentd.cli import _client, _config, _fail, _get, _table, usd
from agentd.cli.client import ApiClient
from agentd.cli.workflow import _error_text, _workflow_id


def _job_id(client: ApiClient, ref: str) -> str:
    """A job id, or the id of the one job with that exact name."""
    import uuid

    try:
        return str(uuid.UUID(ref))
    except ValueError:
        pass
    matches = [j["id"] for j in _get(client, "/api/cron/jobs") if j["name"] == ref]
    if not matches:
        _fail(f"no cron job named {ref!r}")
    if len(matches) > 1:
        _fail(f"{len(matches)} cron jobs are named {ref!r}; use an id")
    return matches[0]


def _when(schedule: dict[str, Any]) -> str:
    if schedule["kind"] == "cron":
        return f"cron {schedule['expr']} ({schedule.get('tz') or 'UTC'})"
    if schedule["kind"] == "every":
        return f"every {schedule['every_secs']}s"
    return f"at {schedule['at']}"


@argh.named("list")
@argh.arg("--agent", help="only the jobs of this agent (id or name)")
@argh.arg("--json", dest="as_json", help="print the raw JSON")
def cron_list(agent: str = "", as_json: bool = False) -> None:
    """List cron jobs with their next due time and last result."""
    jobs = _get(_client(_config()), "/api/cron/jobs", {"agent_id": agent} if agent else None)
    if as_json:
        print(json.dumps(jobs, indent=2))
        return
    rows = []
    for j in jobs:
        last = j["last_run"] or {}
        state = "enabled" if j["enabled"] else f"paused: {j['paused_reason']}" if j["paused_reason"] else "disabled"
        rows.append([j["name"], j["id"], _when(j["schedule"]), j["next_run_at"] or "-",
                     last.get("status", "-"), state])
    print(_table(["NAME", "ID", "SCHEDULE", "NEXT RUN (UTC)", "LAST", "STATE"], rows))


@argh.named("add")
@argh.arg("name", help="the job's name")
@argh.arg("--agent", help="the agent to run (id or name)")
@argh.arg("--message", help="what the agent is told at each due time")
@argh.arg("--cron", help="a 5-field cron expression, e.g. '0 9 * * 1-5', or @hourly, @daily, @weekly, @monthly")
@argh.arg("--tz", help="IANA time zone of --cron, and of an --at without an offset (default UTC)")
@argh.arg("--every", type=int, help="an interval in seconds")
@argh.arg("--at", help="one time, ISO 8601 (no offset: in --tz, default UTC)")
@argh.arg("--workflow", help="run this workflow (id or name) instead of an agent turn")
@argh.arg("--input", help="the workflow's input")
@argh.arg("--one-shot", help="run once, then disable the job")
@argh.arg("--catch-up", choices=("skip", "once"), help="after downtime: skip or run once (default: skip)")
@argh.arg("--max-runs-per-day", type=int, help="pause the job after this many runs a day (UTC)")
@argh.arg("--max-cost-usd-per-day", type=usd, help="pause the job after it cost this many USD a day (UTC)")
@argh.arg("--webhook", help="POST each result to this https:// URL")
@argh.arg("--secret-env", help="environment variable with the webhook's HMAC secret")
@argh.arg("--channel", help="send each result to this configured channel")
@argh.arg("--chat-id", help="the channel's chat (default: its configured target)")
def cron_add(name: str, agent: str = "", message: str = "", cron: str = "", tz: str = "",
             every: int | None = None, at: str = "", workflow: str = "", input: str = "",  # noqa: A002
             one_shot: bool = False, catch_up: str = "skip", max_runs_per_day: int | None = None,
             max_cost_usd_per_day: float | None = None, webhook: str = "", secret_env: str = "",
             channel: str = "", chat_id: str = "") -> None:
    """Create a cron job: an agent told --message, or a --workflow, on --cron, --every or --at."""
    if sum((bool(cron), every is not None, bool(at))) != 1:
        _fail("give exactly one of --cron, --every, --at")
    # An option that would not be sent is refused rather than dropped without a word.
    for unused, option, partner in ((tz and every is not None, "--tz", "--cron or --at"),
                                    (input and not workflow, "--input", "--workflow"),
                                    (secret_env and not webhook, "--secret-env", "--webhook"),
                                    (chat_id and not channel, "--chat-id", "--channel")):
        if unused:
            _fail(f"{option} goes with {partner}")
    if workflow and message:
        _fail("give --message (an agent turn) or --workflow, not both")
    if webhook and channel:
        _fail("give at most one of --webhook, --channel")
    if cron:
        schedule: dict[str, Any] = {"kind": "cron", "expr": cron, **({"tz": tz} if tz else {})}
    elif every is not None:
        schedule = {"kind": "every", "every_secs": int(every)}
    else:
        schedule = {"kind": "at", "at": at, **({"tz": tz} if tz else {})}
    client = _client(_config())
    if workflow:
        action: dict[str, Any] = {"kind": "workflow_run", "workflow_id": _workflow_id(client, workflow),
                                  "input": input}
    else:
        if not message:
            _fail("--message is required (or --workflow)")
        action = {"kind": "agent_turn", "message": message}
    body: dict[str, Any] = {"name": name, "schedule": schedule, "action": action, "one_shot": one_shot,
                            "catch_up": catch_up, "max_runs_per_day": max_runs_per_day,
                            "max_cost_usd_per_day": max_cost_usd_per_day}
    if agent:
        body["agent_id"] = agent
    if webhook:
        body["delivery"] = {"kind": "webhook", "url": webhook, "secret_env": secret_env}
    elif channel:
        body["delivery"] = {"kind": "channel", "channel": channel, "chat_id": chat_id}
    response = client.request("POST", "/api/cron/jobs", json=body)
    if response.status_code != 201:
        _fail(f"cannot create cron job: {_error_text(response)}")
    job = response.json()
    print(f"created cron job {job['id']} (next run {job['next_run_at'] or '-'})")


def _change(ref: str, what: str, method: str, suffix: str = "", body: Any = None) -> Any:
    client = _client(_config())
    response = client.request(method, f"/api/cron/jobs/{_job_id(client, ref)}{suffix}", json=body)
    if not response.ok:
        _fail(f"cannot {what} cron job: {_error_text(response)}")
    return response.json()


@argh.named("run")
@argh.arg("job", help="job id or name")
def cron_run(job: str) -> None:
    """Run a job now (its result shows in `agentd cron list` and the job's runs)."""
    run = _change(job, "run", "POST", "/run")
    print(f"started run {run['id']}")


@argh.named("pause")
@argh.arg("job", help="job id or name")
def cron_pause(job: str) -> None:
    """Pause a job (it keeps its history; nothing fires until it is resumed)."""
    _change(job, "pause", "PATCH", body={"enabled": False})
    print("paused")


@argh.named("resume")
@argh.arg("job", help="job id or name")
def cron_resume(job: str) -> None:
    """Resume a paused job (its next due time counts from now)."""
    resumed = _change(job, "resume", "PATCH", body={"enabled": True})
    print(f"resumed (next run {resumed['next_run_at'] or '-'})")


@argh.named("rm")
@argh.arg("job", help="job id or name")
def cron_rm(job: str) -> None:
    """Delete a job and its run history."""
    _change(job, "delete", "DELETE")
    print("removed")


COMMANDS = [cron_list, cron_add, cron_run, cron_pause, cron_resume, cron_rm]
