"""Agents: spawn, list, detail, message, session, mode, manifest and model edits, stop, kill, upload, profiles,
approvals."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify, request
from marshmallow import Schema

from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.agents.loop import RunCancelled, RunResult
from agentd.agents.manager import UPLOAD_LIMIT, AgentHandle
from agentd.agents.run_request import check_message
from agentd.agents.manifest import MANIFEST_LIMIT, profile_list
from agentd.api import body
from agentd.api.routes_system import kernel
from agentd.api.principal import principal, reachable, run_fields
from agentd.api.runs import run_blocking
from agentd.api.schemas import (MESSAGE_SCHEMA, AgentModelSchema, ManifestSchema, MessageSchema, ModeSchema,
                                SessionQuery, SpawnSchema)
from agentd.errors import BadRequest, Conflict, NotFound, PayloadTooLarge
from agentd.schema_fields import is_blank

# A manifest of the largest size, sent as JSON: a valid TOML text escapes to at most three
# times its UTF-8 size (`\u00e9` for `é`), so the manifest's own limit decides, not the body's.
MANIFEST_BODY_LIMIT = 3 * MANIFEST_LIMIT + 65_536
MANIFEST_TOO_LARGE = "manifest too large (max 1 MB)"

bp = Blueprint("agents", __name__)


def manifest_body(schema: Schema) -> dict[str, Any]:
    """A spawn's or manifest update's body. One over 1 MB is taken only as JSON whose
    `manifest_toml` is within 1 MB once its escapes are undone: any other is refused as too
    large, whatever else is wrong with it (the size is judged first)."""
    try:
        data = body.load(schema, MANIFEST_BODY_LIMIT)
    except (BadRequest, body.UnsupportedMediaType):
        if len(body.raw_body(MANIFEST_BODY_LIMIT)) > MANIFEST_LIMIT:
            raise PayloadTooLarge(MANIFEST_TOO_LARGE) from None
        raise
    manifest = data["manifest_toml"]
    if manifest is not None and len(manifest.encode("utf-8")) > MANIFEST_LIMIT:
        raise PayloadTooLarge(MANIFEST_TOO_LARGE)
    return data


def agent(agent_id: str) -> AgentHandle:
    """The agent by id; 404 as for an unknown one when the request's key may not reach it.

    A name where the UUID belongs stays the 400 it was, naming the agent's id when the
    name is one the request's key may see."""
    who, agents = principal(), kernel().agents
    try:
        handle = agents.get(agent_id)
    except BadRequest as exc:
        named = agents.by_name(agent_id)
        if named is None or named.killed or not who.visible([named]):
            raise
        raise BadRequest(f"{exc.message}: did you mean agent {named.id}?") from None
    return who.reach(handle)


def message_text(data: dict[str, Any]) -> str:
    """The `message` field, checked against the spec's limits."""
    text = data["message"]
    check_message(text)
    if is_blank(text):
        raise BadRequest("message is empty")
    return text


def result_body(result: RunResult) -> dict[str, Any]:
    """The spec's Message result."""
    return {"response": result.response, "input_tokens": result.usage.input_tokens,
            "output_tokens": result.usage.output_tokens, "iterations": result.iterations,
            "cost_usd": result.cost_usd}


@bp.post("/api/agents")
@doc("Spawn an agent from a manifest", tags="agents", body=SpawnSchema, ok=201, response=out.SpawnedSchema,
     body_example={"manifest_toml": 'name = "helper"\nprofile = "minimal"\n'},
     description="Unknown manifest keys and a provider without an API key do not fail a spawn; "
                 "they are listed in `warnings`.",
     errors={400: "Invalid manifest (`invalid manifest format: <key>: <problem>`)",
             403: "Signed manifest failed verification, or a scoped key's agent list does not name the agent",
             409: "An agent with this name exists",
             413: "Manifest over 1 MB"},
     links={"GetAgent": ("agents.detail", {"agent_id": "$response.body#/agent_id"}),
            "MessageAgent": ("agents.message", {"agent_id": "$response.body#/agent_id"}),
            "GetSession": ("agents.session", {"agent_id": "$response.body#/agent_id"}),
            "SetMode": ("agents.set_mode", {"agent_id": "$response.body#/agent_id"}),
            "PutMemory": ("memory.put_key", {"agent_id": "$response.body#/agent_id"}),
            "ListMemory": ("memory.all_keys", {"agent_id": "$response.body#/agent_id"}),
            "Remember": ("memory.remember", {"agent_id": "$response.body#/agent_id"}),
            "StreamMessage": ("stream.message_stream", {"agent_id": "$response.body#/agent_id"}),
            "Upload": ("agents.upload", {"agent_id": "$response.body#/agent_id"}),
            "StopRun": ("agents.stop", {"agent_id": "$response.body#/agent_id"}),
            "ResetSession": ("agents.reset", {"agent_id": "$response.body#/agent_id"}),
            "CreateWorkflow": ("workflows.create", {}, {
                "name": "$response.body#/name", "description": "a workflow over a new agent",
                "steps": [{"agent_name": "$response.body#/name"},
                          {"agent_name": "$response.body#/name", "mode": "fan_out"},
                          {"mode": "collect"}]}),
            "KillAgent": ("agents.kill", {"agent_id": "$response.body#/agent_id"})})
def spawn():
    data = manifest_body(SpawnSchema())
    manifest = data["manifest_toml"]
    if not manifest and not data["signed_manifest"]:
        raise BadRequest("invalid request: manifest_toml is required")
    who = principal()
    handle = kernel().agents.spawn(manifest, data["signed_manifest"], who.key_id, who.check_spawn)
    # Unknown manifest keys or a missing provider key do not fail a spawn; they are reported
    # so a typo or the missing setup step is seen before the first message.
    return jsonify({"agent_id": handle.id, "name": handle.name,
                    "warnings": kernel().agents.spawn_warnings(handle)}), 201


@bp.get("/api/agents")
@doc("List agents", tags="agents", response={"type": "array", "items": out.AgentItemSchema})
def list_agents():
    who = principal()
    if who.agents:  # a key limited to some agents lists only those
        agents = kernel().agents
        return jsonify([agents.list_item(h) for h in who.visible(agents.handles())])
    # The same bytes jsonify() sends, built from per-agent cached texts (agents/listing.py).
    return current_app.response_class(f"{kernel().agents.list_json()}\n", mimetype="application/json")


@bp.get("/api/agents/<agent_id>")
@doc("Agent detail", tags="agents", response=out.AgentDetailSchema,
     links={"ClearSession": ("agents.delete_session", {"session_id": "$response.body#/session_id"})})
def detail(agent_id: str):
    return jsonify(kernel().agents.detail(agent(agent_id)))


@bp.post("/api/agents/<agent_id>/message")
@doc("Send a message and wait for the answer", tags="agents", body=MessageSchema,
     response=out.MessageResultSchema, body_example={"message": "hello"},
     errors={409: "The run was stopped before the agent answered",
             413: "Message over 64 KB",
             429: "Budget or the agent's token quota exhausted, the agent's queue is full "
                  "(`agent_busy`), or the provider still throttled after retries (`Retry-After`)",
             424: "The agent's provider has no API key; the message names the variable to set "
                  "and `POST /api/providers/{name}/key`",
             500: "The run failed: the provider refused the key or the request, "
                  "or the loop guard stopped the run (the message says which)",
             502: "The provider reset the connection or cut the stream off",
             503: "The provider answered 503 after retries, or the daemon is shutting down",
             504: "The provider timed out"})
def message(agent_id: str):
    handle = agent(agent_id)
    data = body.load(MESSAGE_SCHEMA)
    text = message_text(data)
    try:
        result = run_blocking(kernel(), handle, text, data["attachments"],
                              run=run_fields(principal(), handle, data.get("user"), data.get("session"),
                                             own_session=True))
    except RunCancelled:
        if handle.killed:  # (the agent is gone now: as for a message sent a moment later)
            raise NotFound("agent not found") from None
        raise Conflict("run cancelled: the agent was stopped before it answered") from None
    return jsonify(result_body(result))


def talking_in(handle: AgentHandle) -> str | None:
    """The session `?user=` / `?session=` name, for the request's key, as a message with
    them talks in: None for the agent's own (the admin's without either)."""
    query = body.validate(SessionQuery(), request.args.to_dict())
    return run_fields(principal(), handle, query.get("user"), query.get("session"),
                      own_session=True).get("session_id")


@bp.get("/api/agents/<agent_id>/session")
@doc("The agent's session (conversation history)", tags="agents", query=SessionQuery, response=out.SessionSchema,
     description="Without `user` or `session`: the agent's own session, or for a scoped key the session it "
                 "talks in without them (its own). With one: that person's or named session, as a message "
                 "naming it talks in (a scoped key's people are its own).")
def session(agent_id: str):
    handle = agent(agent_id)
    return jsonify(kernel().agents.session(handle, talking_in(handle)))


@bp.put("/api/agents/<agent_id>/mode")
@doc("Set the agent's mode", tags="agents", body=ModeSchema, response=out.ModeSetSchema,
     body_example={"mode": "Observe"})
def set_mode(agent_id: str):
    handle = agent(agent_id)
    data = body.load(ModeSchema())
    kernel().agents.set_mode(handle, data["mode"])
    return jsonify({"status": "updated", "agent_id": handle.id, "mode": handle.mode})


@bp.put("/api/agents/<agent_id>/manifest")
@doc("Replace the agent's manifest (its id, name, mode and session stay)", tags="agents", body=ManifestSchema,
     response=out.AgentUpdatedSchema, body_example={"manifest_toml": 'name = "helper"\nprofile = "coding"\n'},
     errors={400: "Invalid manifest, or a different name", 413: "Manifest over 1 MB"})
def update_manifest(agent_id: str):
    handle = agent(agent_id)
    manifest = manifest_body(ManifestSchema())["manifest_toml"]
    warnings = kernel().agents.update_manifest(handle, manifest, principal().key_id)
    return jsonify(updated_body(handle, warnings))


@bp.put("/api/agents/<agent_id>/model")
@doc("Set the agent's model (the rest of its manifest stays)", tags="agents", body=AgentModelSchema,
     response=out.AgentUpdatedSchema, body_example={"model": "openai/gpt-4o"},
     errors={400: "Not provider/model, or an unknown provider"})
def set_model(agent_id: str):
    handle = agent(agent_id)
    warnings = kernel().agents.set_model(handle, body.load(AgentModelSchema())["model"], principal().key_id)
    return jsonify(updated_body(handle, warnings))


def updated_body(handle: AgentHandle, warnings: list[str]) -> dict[str, Any]:
    return {"status": "updated", "agent_id": handle.id, "model_provider": handle.provider,
            "model_name": handle.model, "warnings": warnings}


@bp.delete("/api/agents/<agent_id>")
@doc("Kill the agent (a run in flight is cancelled)", tags="agents", response=out.KilledSchema)
def kill(agent_id: str):
    handle = agent(agent_id)
    kernel().agents.kill(handle)
    return jsonify({"status": "killed", "agent_id": handle.id})


@bp.post("/api/agents/<agent_id>/stop")
@doc("Cancel the agent's current run", tags="agents", query=SessionQuery, response=out.StoppedSchema,
     description="The run in the session `GET /api/agents/{id}/session` with the same `user` or `session` "
                 "shows (a scoped key's own without them).")
def stop(agent_id: str):
    handle = agent(agent_id)
    was_running = kernel().agents.stop(handle, talking_in(handle))
    return jsonify({"status": "stopped" if was_running else "idle", "agent_id": handle.id,
                    "was_running": was_running,
                    "message": "run cancelled" if was_running else "no run in progress"})


@bp.post("/api/agents/<agent_id>/session/compact")
@doc("Summarise older messages with the agent's own model, keep the last 10", tags="agents", query=SessionQuery,
     response=out.CompactSchema, errors={409: "The agent is busy", 502: "The provider refused the request",
                                         503: "The provider failed", 504: "The provider timed out"},
     description="The session `GET /api/agents/{id}/session` with the same `user` or `session` shows "
                 "(a scoped key's own without them).")
def compact(agent_id: str):
    handle = agent(agent_id)
    return jsonify(kernel().agents.compact(handle, talking_in(handle)))


@bp.post("/api/agents/<agent_id>/session/reset")
@doc("Clear the agent's session", tags="agents", query=SessionQuery, response=out.ResetSchema,
     description="The session `GET /api/agents/{id}/session` with the same `user` or `session` shows "
                 "(a scoped key's own without them).")
def reset(agent_id: str):
    handle = agent(agent_id)
    session_id = talking_in(handle)
    kernel().agents.reset_session(handle, session_id)
    return jsonify({"status": "reset", "agent_id": handle.id, "session_id": session_id or handle.session_id})


@bp.delete("/api/sessions/<session_id>")
@doc("Clear a session's history", tags="agents", response=out.SessionDeletedSchema,
     description="A scoped key clears only the sessions it talks in (its own, its people's, its named "
                 "ones) of agents in its list; any other session is 404, as an unknown one.")
def delete_session(session_id: str):
    who = principal()

    def talks_in(agent_id: str, label: str | None) -> bool:  # any other session is not found
        handle = kernel().agents.find(agent_id)
        return handle is not None and who.talks_in(handle, label)

    kernel().agents.delete_session(session_id, talks_in)
    return jsonify({"status": "deleted", "session_id": session_id})


@bp.post("/api/agents/<agent_id>/upload")
@doc("Upload a file for later attachments", tags="agents", ok=201, response=out.UploadSchema,
     body={"type": "object", "required": ["file"],
           "properties": {"file": {"type": "string", "contentMediaType": "application/octet-stream",
                                   "description": "image/*, text/*, audio/* or application/pdf; max 10 MB"},
                          "filename": {"type": "string"}}},
     body_media="multipart/form-data",
     errors={400: "No `file` part, an empty file or an unsupported type", 413: "File over 10 MB",
             415: "Not multipart/form-data"})
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
@doc("Tool profiles", tags="agents", response={"type": "array", "items": out.ProfileSchema})
def profiles():
    return jsonify(profile_list())


@bp.get("/api/approvals")
@doc("Pending Manual-mode tool calls", tags="approvals", response={"type": "array", "items": out.ApprovalSchema})
def approvals():
    return jsonify(reachable(kernel().approvals.pending()))


@bp.post("/api/approvals/<approval_id>/approve")
@doc("Approve a pending tool call", tags="approvals", response=out.ApprovalDecisionSchema,
     errors={409: "Already decided"})
def approve(approval_id: str):
    approval = kernel().approvals.approve(approval_id)
    return jsonify({"status": "approved", "id": approval.id, "tool": approval.tool})


@bp.post("/api/approvals/<approval_id>/reject")
@doc("Reject a pending tool call", tags="approvals", response=out.ApprovalDecisionSchema,
     errors={409: "Already decided"})
def reject(approval_id: str):
    approval = kernel().approvals.reject(approval_id)
    return jsonify({"status": "rejected", "id": approval.id, "tool": approval.tool})
