"""Workflows: create, list, read, update, delete, run, and run records."""

from __future__ import annotations

from flask import Blueprint, jsonify

from agentd.agents.manager import MESSAGE_LIMIT
from agentd.api import body
from agentd.api.routes_system import kernel
from agentd.errors import BadRequest, PayloadTooLarge

bp = Blueprint("workflows", __name__)


@bp.post("/api/workflows")
def create():
    workflow_id = kernel().workflows.create(body.json_body())
    return jsonify({"workflow_id": workflow_id}), 201


@bp.get("/api/workflows")
def list_workflows():
    return jsonify(kernel().workflows.list())


@bp.get("/api/workflows/<workflow_id>")
def detail(workflow_id: str):
    return jsonify(kernel().workflows.get(workflow_id))


@bp.put("/api/workflows/<workflow_id>")
def update(workflow_id: str):
    kernel().workflows.update(workflow_id, body.json_body())
    return jsonify({"status": "updated", "workflow_id": workflow_id})


@bp.delete("/api/workflows/<workflow_id>")
def delete(workflow_id: str):
    kernel().workflows.delete(workflow_id)
    return jsonify({"status": "removed", "workflow_id": workflow_id})


@bp.post("/api/workflows/<workflow_id>/run")
def run(workflow_id: str):
    data = body.json_body(allow_empty=True)
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(data).__name__}")
    text = data.get("input", "")
    if not isinstance(text, str):
        raise BadRequest("input: must be a string")
    if len(text.encode("utf-8")) > MESSAGE_LIMIT:
        raise PayloadTooLarge("input too large (max 64 KB)")
    # Blocks until the run ends; a failed run is still a 200 with status "failed" and error.
    return jsonify(kernel().workflows.run(workflow_id, text))


@bp.get("/api/workflows/<workflow_id>/runs")
def runs(workflow_id: str):
    return jsonify(kernel().workflows.runs(workflow_id))


@bp.get("/api/workflows/runs/<run_id>")
def run_detail(run_id: str):
    return jsonify(kernel().workflows.run_detail(run_id))
