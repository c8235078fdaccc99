"""Workflows: create, list, read, update, delete, run, and run records."""

from __future__ import annotations

import time
from typing import Iterator

from flask import Blueprint, jsonify

from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api.principal import principal, reachable_workflows
from agentd.api.schemas import WorkflowRunSchema, WorkflowSchema
from agentd.agents.run_request import check_message
from agentd.api import body
from agentd.api.routes_system import kernel
from agentd.api.runs import acquire_stream_slot, stream_slots
from agentd.api.sse import comment, format_event, sse_response

bp = Blueprint("workflows", __name__)


@bp.post("/api/workflows")
@doc("Create a workflow", tags="workflows", body=WorkflowSchema, ok=201, response=out.WorkflowCreatedSchema,
     description="Steps are checked at create time (agent references, enums, templates); a 400 names the "
                 "step and field; a step on an agent outside the scoped key's list is refused as one on an "
                 "agent that does not exist.",
     links={"GetWorkflow": ("workflows.detail", {"workflow_id": "$response.body#/workflow_id"}),
            "RunWorkflow": ("workflows.run", {"workflow_id": "$response.body#/workflow_id"}),
            "StartRun": ("workflows.start_run", {"workflow_id": "$response.body#/workflow_id"}),
            "ListRuns": ("workflows.runs", {"workflow_id": "$response.body#/workflow_id"}),
            "UpdateWorkflow": ("workflows.update", {"workflow_id": "$response.body#/workflow_id"}),
            "DeleteWorkflow": ("workflows.delete", {"workflow_id": "$response.body#/workflow_id"})})
def create():
    workflow_id = kernel().workflows.create(body.json_body(), principal().sees)
    return jsonify({"workflow_id": workflow_id}), 201


@bp.get("/api/workflows")
@doc("List workflows", tags="workflows", response={"type": "array", "items": out.WorkflowItemSchema})
def list_workflows():
    return jsonify(reachable_workflows(kernel().workflows.list()))


@bp.get("/api/workflows/<workflow_id>")
@doc("A workflow's definition (normalised steps)", tags="workflows", response=out.WorkflowDetailSchema)
def detail(workflow_id: str):
    return jsonify(kernel().workflows.get(workflow_id))


@bp.put("/api/workflows/<workflow_id>")
@doc("Replace a workflow's definition", tags="workflows", body=WorkflowSchema, response=out.WorkflowChangedSchema,
     errors={404: "No such workflow"})
def update(workflow_id: str):
    kernel().workflows.update(workflow_id, body.json_body(), principal().sees)
    return jsonify({"status": "updated", "workflow_id": workflow_id})


@bp.delete("/api/workflows/<workflow_id>")
@doc("Delete a workflow and its runs", tags="workflows", response=out.WorkflowChangedSchema,
     errors={409: "A run is in progress"})
def delete(workflow_id: str):
    kernel().workflows.delete(workflow_id)
    return jsonify({"status": "removed", "workflow_id": workflow_id})


def payer(workflow_id: str) -> str:
    """The scoped key a run of the workflow is started by (it pays for the steps). A workflow
    with a step on an agent outside the key's list was refused before the route (`authorize`)."""
    kernel().workflows.get(workflow_id)  # (unknown: 404 workflow not found)
    return principal().key_id


@bp.post("/api/workflows/<workflow_id>/run")
@doc("Run a workflow and wait for it to end", tags="workflows", body=WorkflowRunSchema, body_required=False,
     response=out.WorkflowRunResultSchema, body_example={"input": "solar sails"},
     description="A failed run is still a 200 with `status: failed` and `error`.",
     errors={413: "Input over 64 KB"},
     links={"GetRun": ("workflows.run_detail", {"run_id": "$response.body#/run_id"})})
def run(workflow_id: str):
    text = body.load(WorkflowRunSchema(), allow_empty=True)["input"]
    check_message(text, "input")
    # Blocks until the run ends; a failed run is still a 200 with status "failed" and error.
    return jsonify(kernel().workflows.run(workflow_id, text, payer(workflow_id)))


@bp.get("/api/workflows/<workflow_id>/runs")
@doc("The workflow's runs, newest first", tags="workflows",
     response={"type": "array", "items": out.WorkflowRunItemSchema})
def runs(workflow_id: str):
    return jsonify(kernel().workflows.runs(workflow_id))


@bp.get("/api/workflows/runs/<run_id>")
@doc("One run with its step results", tags="workflows", response=out.WorkflowRunDetailSchema)
def run_detail(run_id: str):
    return jsonify(kernel().workflows.run_detail(run_id))


@bp.post("/api/workflows/<workflow_id>/runs")
@doc("Start a run and answer at once", tags="workflows", body=WorkflowRunSchema, body_required=False, ok=202,
     response=out.WorkflowRunStartedSchema, body_example={"input": "solar sails"},
     description="The run goes on in the daemon: follow it with `GET /api/workflows/runs/{run_id}/events`, "
                 "read it with `GET /api/workflows/runs/{run_id}`, stop it with `POST .../cancel`.",
     errors={413: "Input over 64 KB", 503: "The daemon is shutting down"},
     links={"GetRun": ("workflows.run_detail", {"run_id": "$response.body#/run_id"}),
            "RunEvents": ("workflows.run_events", {"run_id": "$response.body#/run_id"}),
            "CancelRun": ("workflows.cancel_run", {"run_id": "$response.body#/run_id"})})
def start_run(workflow_id: str):
    text = body.load(WorkflowRunSchema(), allow_empty=True)["input"]
    check_message(text, "input")
    return jsonify(kernel().workflows.start(workflow_id, text, payer(workflow_id))), 202


@bp.post("/api/workflows/runs/<run_id>/cancel")
@doc("Cancel a run in progress", tags="workflows", response=out.WorkflowRunDetailSchema,
     description="The run ends `failed` with the error `step N (...) failed: run cancelled`; the answer is "
                 "its record once it has stopped (a step's agent run stops at its next cancellation point).",
     errors={409: "The run is not in progress, or another daemon drives it"})
def cancel_run(run_id: str):
    return jsonify(kernel().workflows.cancel(run_id))


KEEP_ALIVE_SECS = 15.0
WAKE_SECS = 0.5  # the longest a watcher sleeps (runs driven by another daemon only show in the database)


def step_events(run_id: str) -> Iterator[str]:
    """A run's step events until it ends: `step_started`, `step_result`, then `done`."""
    engine = kernel().workflows
    record, running = engine.progress(run_id)
    results_sent, started_sent = 0, set()
    quiet_since = time.monotonic()
    while True:
        events = []
        results = record["step_results"]
        for result in results[results_sent:]:
            events.append(format_event("step_result", result))
        results_sent = len(results)
        steps = engine.get(record["workflow_id"])["steps"] if running else []
        for index in running:
            if index not in started_sent and index < len(steps):
                started_sent.add(index)
                events.append(format_event("step_started", {"step_index": index, "step_name": steps[index]["name"]}))
        status = record["state"]["status"]
        if status in ("completed", "failed"):
            events.append(format_event("done", {"run_id": record["id"], "status": status,
                                                "output": record["output"] or "", "error": record["error"],
                                                "steps_completed": record["steps_completed"]}))
            yield from events
            return
        if events:
            quiet_since = time.monotonic()
            yield from events
        elif time.monotonic() - quiet_since >= KEEP_ALIVE_SECS:
            # A write to a client that left fails here, which ends the stream.
            quiet_since = time.monotonic()
            yield comment("keep-alive")
        engine.wait_change(WAKE_SECS)
        record, running = engine.progress(run_id)


@bp.get("/api/workflows/runs/<run_id>/events")
@doc("A run's step events (Server-Sent Events) until it ends", tags="workflows", response=out.SSE,
     response_media="text/event-stream",
     description="`step_result` for every step result recorded so far and then as each is recorded (the "
                 "fields of `step_results` items), `step_started` `{step_index, step_name}` when a step "
                 "begins (from the daemon that drives the run), and last `done` `{run_id, status, output, "
                 "error, steps_completed}`. A finished run answers its results and `done` at once.",
     errors={503: "Too many concurrent streams (`Retry-After`)"})
def run_events(run_id: str):
    engine = kernel().workflows
    engine.run_detail(run_id)  # an unknown run is a 404 before the stream begins
    acquire_stream_slot()
    slots = stream_slots()
    return sse_response(step_events(run_id), on_close=slots.release)
