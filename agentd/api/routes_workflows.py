"""Workflows: create, list, read, update, delete, run, and run records."""

from __future__ import annotations

from flask import Blueprint, jsonify

from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api.schemas import WorkflowRunSchema, WorkflowSchema
from agentd.agents.runs import check_message
from agentd.api import body
from agentd.api.routes_system import kernel

bp = Blueprint("workflows", __name__)


@bp.post("/api/workflows")
@doc("Create a workflow", tags="workflows", body=WorkflowSchema, ok=201, response=out.WorkflowCreatedSchema,
     description="Steps are checked at create time (agent references, enums, templates); a 400 names the "
                 "step and field.",
     links={"GetWorkflow": ("workflows.detail", {"workflow_id": "$response.body#/workflow_id"}),
            "RunWorkflow": ("workflows.run", {"workflow_id": "$response.body#/workflow_id"}),
            "ListRuns": ("workflows.runs", {"workflow_id": "$response.body#/workflow_id"}),
            "UpdateWorkflow": ("workflows.update", {"workflow_id": "$response.body#/workflow_id"}),
            "DeleteWorkflow": ("workflows.delete", {"workflow_id": "$response.body#/workflow_id"})})
def create():
    workflow_id = kernel().workflows.create(body.json_body())
    return jsonify({"workflow_id": workflow_id}), 201


@bp.get("/api/workflows")
@doc("List workflows", tags="workflows", response={"type": "array", "items": out.WorkflowItemSchema})
def list_workflows():
    return jsonify(kernel().workflows.list())


@bp.get("/api/workflows/<workflow_id>")
@doc("A workflow's definition (normalised steps)", tags="workflows", response=out.WorkflowDetailSchema)
def detail(workflow_id: str):
    return jsonify(kernel().workflows.get(workflow_id))


@bp.put("/api/workflows/<workflow_id>")
@doc("Replace a workflow's definition", tags="workflows", body=WorkflowSchema, response=out.WorkflowChangedSchema)
def update(workflow_id: str):
    kernel().workflows.update(workflow_id, body.json_body())
    return jsonify({"status": "updated", "workflow_id": workflow_id})


@bp.delete("/api/workflows/<workflow_id>")
@doc("Delete a workflow and its runs", tags="workflows", response=out.WorkflowChangedSchema,
     errors={409: "A run is in progress"})
def delete(workflow_id: str):
    kernel().workflows.delete(workflow_id)
    return jsonify({"status": "removed", "workflow_id": workflow_id})


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
    return jsonify(kernel().workflows.run(workflow_id, text))


@bp.get("/api/workflows/<workflow_id>/runs")
@doc("The workflow's runs, newest first", tags="workflows",
     response={"type": "array", "items": out.WorkflowRunItemSchema})
def runs(workflow_id: str):
    return jsonify(kernel().workflows.runs(workflow_id))


@bp.get("/api/workflows/runs/<run_id>")
@doc("One run with its step results", tags="workflows", response=out.WorkflowRunDetailSchema)
def run_detail(run_id: str):
    return jsonify(kernel().workflows.run_detail(run_id))
