"""Cron jobs: create, list, read, change (pause/resume), delete, run now, and run history."""

from __future__ import annotations

from flask import Blueprint, jsonify, request
from marshmallow import fields

from agentd.api import body
from agentd.api import schemas_cron as sc
from agentd.api.apidoc import doc
from agentd.api.principal import principal, reachable_jobs
from agentd.api.routes_system import kernel
from agentd.api.schemas import _Query

bp = Blueprint("cron", __name__)

JOB_ID = {"job_id": {"format": "uuid"}}


class CronJobsQuery(_Query):
    agent_id = fields.String(metadata={"description": sc.LIST_QUERY_DOC
                                       + " (an unknown agent has none; empty: every job)"})


def _job(job_id: str) -> dict:
    return kernel().cron.get_raw(job_id)


@bp.post("/api/cron/jobs")
@doc("Create a cron job", tags="cron", body=sc.JOB_CREATE, ok=201, response=sc.JOB,
     description="`agent_id` takes the agent's id or name. A 400 names the field at fault. A job created "
                 "with a scoped API key runs as that key (`key_id`): its spend counts toward the key's budget, "
                 "and a run is refused (failed, with the reason) once the key is deleted, disabled, expired, "
                 "over its budget or no longer reaches the agent.",
     errors={409: "The agent has as many jobs as `[schedules] max_jobs_per_agent` allows"},
     links={"GetJob": ("cron.detail", {"job_id": "$response.body#/id"}),
            "UpdateJob": ("cron.update", {"job_id": "$response.body#/id"}),
            "RunJob": ("cron.run", {"job_id": "$response.body#/id"}),
            "ListRuns": ("cron.runs", {"job_id": "$response.body#/id"}),
            "DeleteJob": ("cron.delete", {"job_id": "$response.body#/id"})},
     body_example={"name": "morning-report", "agent_id": "assistant",
                   "schedule": {"kind": "cron", "expr": "0 9 * * 1-5", "tz": "Europe/Berlin"},
                   "action": {"kind": "agent_turn", "message": "Write the morning report."},
                   "max_runs_per_day": 3})
def create():
    return jsonify(kernel().cron.create(body.json_body(), by=principal())), 201


@bp.get("/api/cron/jobs")
@doc("List cron jobs", tags="cron", query=CronJobsQuery, response={"type": "array", "items": sc.JOB})
def list_jobs():
    ref = request.args.get("agent_id", "")
    if not ref:
        return jsonify(reachable_jobs(kernel().cron.list()))
    handle = kernel().agents.find(ref)
    return jsonify(reachable_jobs(kernel().cron.list(handle.id)) if handle is not None else [])


@bp.get("/api/cron/jobs/<job_id>")
@doc("A cron job", tags="cron", response=sc.JOB, path_params=JOB_ID)
def detail(job_id: str):
    return jsonify(kernel().cron.get(job_id))


@bp.patch("/api/cron/jobs/<job_id>")
@doc("Change a cron job; `{\"enabled\": false}` pauses it, `true` resumes it", tags="cron",
     body=sc.JOB_PATCH, response=sc.JOB, path_params=JOB_ID,
     description="Only the fields given change. Resuming clears `paused_reason` and the failure backoff "
                 "and computes the next due time from now.")
def update(job_id: str):
    return jsonify(kernel().cron.update(job_id, body.json_body(), by=principal()))


@bp.delete("/api/cron/jobs/<job_id>")
@doc("Delete a cron job and its run history", tags="cron", response=sc.REMOVED, path_params=JOB_ID)
def delete(job_id: str):
    kernel().cron.delete(job_id, by=principal())
    return jsonify({"status": "removed", "job_id": job_id})


@bp.post("/api/cron/jobs/<job_id>/run")
@doc("Run a cron job now", tags="cron", ok=202, response=sc.RUN, path_params=JOB_ID,
     description="Starts the job's action at once (whether enabled or not) and answers its run record "
                 "(`status: running`); follow it in the job's runs. The per-day caps apply.",
     errors={409: "The job's previous run is still running, or the job is over a cap (it is paused)"})
def run(job_id: str):
    return jsonify(kernel().scheduler.run_now(_job(job_id))), 202


@bp.get("/api/cron/jobs/<job_id>/runs")
@doc("The job's runs, newest first", tags="cron", response={"type": "array", "items": sc.RUN}, path_params=JOB_ID,
     description="Each run: started, finished, status (`ok`, `failed`, `skipped` with its `reason`, "
                 "`running`), cost, output or error, and the delivery of its result.")
def runs(job_id: str):
    return jsonify(kernel().cron.runs(job_id))


