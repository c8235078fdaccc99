"""Agents: spawn, list, detail, message, session, mode, stop, kill, upload, profiles, approvals."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, request

from agentd.agents.loop import RunCancelled, RunResult
from agentd.agents.manager import MESSAGE_LIMIT, UPLOAD_LIMIT, AgentHandle
from agentd.agents.manifest import MANIFEST_LIMIT, profile_list
from agentd.api import body
from agentd.api.routes_system import kernel
from agentd.api.runs import run_blocking
from agentd.api.schemas import MESSAGE_SCHEMA, ModeSchema, SpawnSchema
from agentd.errors import BadRequest, Conflict, PayloadTooLarge

bp = Blueprint("agents", __name__)


def agent(agent_id: str) -> AgentHandle:
    return kernel().agents.get(agent_id)


def message_text(data: dict[str, Any]) -> str:
    """The `message` field, checked against the spec's limits."""
    text = data["message"]
    if len(text.encode("utf-8")) > MESSAGE_LIMIT:
        raise PayloadTooLarge("message too large (max 64 KB)")
    if not text.strip():
        raise BadRequest("message is empty")
    return text


def result_body(result: RunResult) -> dict[str, Any]:
    """The spec's Message result."""
    return {"response": result.response, "input_tokens": result.usage.input_tokens,
            "output_tokens": result.usage.output_tokens, "iterations": result.iterations,
            "cost_usd": result.cost_usd}


@bp.post("/api/agents")
def spawn():
    data = body.load(SpawnSchema())
    manifest = data["manifest_toml"]
    if manifest is not None and len(manifest.encode("utf-8")) > MANIFEST_LIMIT:
        raise PayloadTooLarge("manifest too large (max 1 MB)")
    if not manifest and not data["signed_manifest"]:
        raise BadRequest("invalid request: manifest_toml is required")
    handle = kernel().agents.spawn(manifest, data["signed_manifest"])
    # Unknown manifest keys do not fail a spawn; they are reported so a typo is seen.
    return jsonify({"agent_id": handle.id, "name": handle.name,
                    "warnings": handle.manifest.warnings}), 201


@bp.get("/api/agents")
def list_agents():
    agents = kernel().agents
    return jsonify([agents.list_item(h) for h in agents.handles()])


@bp.get("/api/agents/<agent_id>")
def detail(agent_id: str):
    return jsonify(kernel().agents.detail(agent(agent_id)))


@bp.post("/api/agents/<agent_id>/message")
def message(agent_id: str):
    handle = agent(agent_id)
    data = body.load(MESSAGE_SCHEMA)
    text = message_text(data)
    try:
        result = run_blocking(kernel(), handle, text, data["attachments"])
    except RunCancelled:
        raise Conflict("run cancelled: the agent was stopped before it answered") from None
    return jsonify(result_body(result))


@bp.get("/api/agents/<agent_id>/session")
def session(agent_id: str):
    return jsonify(kernel().agents.session(agent(agent_id)))


@bp.put("/api/agents/<agent_id>/mode")
def set_mode(agent_id: str):
    handle = agent(agent_id)
    data = body.load(ModeSchema())
    kernel().agents.set_mode(handle, data["mode"])
    return jsonify({"status": "updated", "agent_id": handle.id, "mode": handle.mode})


@bp.delete("/api/agents/<agent_id>")
def kill(agent_id: str):
    handle = agent(agent_id)
    kernel().agents.kill(handle)
    return jsonify({"status": "killed", "agent_id": handle.id})


@bp.post("/api/agents/<agent_id>/stop")
def stop(agent_id: str):
    handle = agent(agent_id)
    was_running = kernel().agents.stop(handle)
    return jsonify({"status": "stopped" if was_running else "idle", "agent_id": handle.id,
                    "was_running": was_running,
                    "message": "run cancelled" if was_running else "no run in progress"})


@bp.post("/api/agents/<agent_id>/session/compact")
def compact(agent_id: str):
    return jsonify(kernel().agents.compact(agent(agent_id)))


@bp.post("/api/agents/<agent_id>/session/reset")
def reset(agent_id: str):
    handle = agent(agent_id)
    kernel().agents.reset_session(handle)
    return jsonify({"status": "reset", "agent_id": handle.id, "session_id": handle.session_id})


@bp.delete("/api/sessions/<session_id>")
def delete_session(session_id: str):
    kernel().agents.delete_session(session_id)
    return jsonify({"status": "deleted", "session_id": session_id})


@bp.post("/api/agents/<agent_id>/upload")
def upload(agent_id: str):
    handle = agent(agent_id)
    body.raw_body(UPLOAD_LIMIT + 64 * 1024)
    if request.mimetype != "multipart/form-data":
        raise body.UnsupportedMediaType("upload must be multipart/form-data with a 'file' part")
    file = request.files.get("file")
    if file is None:
        raise BadRequest("no file provided: send a multipart part named 'file'")
    data = file.read(UPLOAD_LIMIT + 1)
    filename = request.form.get("filename") or file.filename or "upload"
    content_type = (file.mimetype or "application/octet-stream").lower()
    return jsonify(kernel().agents.save_upload(handle, filename, content_type, data)), 201


@bp.get("/api/profiles")
def profiles():
    return jsonify(profile_list())


@bp.get("/api/approvals")
def approvals():
    return jsonify(kernel().approvals.pending())


@bp.post("/api/approvals/<approval_id>/approve")
def approve(approval_id: str):
    approval = kernel().approvals.approve(approval_id)
    return jsonify({"status": "approved", "id": approval.id, "tool": approval.tool})


@bp.post("/api/approvals/<approval_id>/reject")
def reject(approval_id: str):
    approval = kernel().approvals.reject(approval_id)
    return jsonify({"status": "rejected", "id": approval.id, "tool": approval.tool})
