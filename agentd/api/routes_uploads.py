"""An agent's files: what was uploaded to it and what its tools made (screenshots, images, audio)."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api.routes_agents import agent
from agentd.api.routes_system import kernel
from agentd.api.schemas_out.base import Str

bp = Blueprint("uploads", __name__)

# Shown in place by a browser; anything else (HTML, SVG, PDF, text) is a download, so a file
# an agent made can never run script in the dashboard's origin.
INLINE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp", "audio/")


class UploadListedSchema(out.UploadSchema):
    created_at = Str(metadata={"format": "date-time"})


def file_response(item: dict) -> Response:
    """The file's bytes, inline only for types a browser cannot execute."""
    inline = item["content_type"].startswith(INLINE_TYPES)
    response = Response(item["data"], mimetype=item["content_type"] if inline else "application/octet-stream")
    name = item["filename"].replace('"', "")
    response.headers["Content-Disposition"] = f'{"inline" if inline else "attachment"}; filename="{name}"'
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@bp.get("/api/agents/<agent_id>/uploads")
@doc("The agent's files (uploads and what its tools made), newest first", tags="agents",
     response={"type": "array", "items": UploadListedSchema})
def uploads(agent_id: str):
    return jsonify(kernel().agents.uploads_of(agent(agent_id)))


@bp.get("/api/agents/<agent_id>/uploads/<file_id>")
@doc("One of the agent's files: its bytes (images and audio inline, other types as a download)", tags="agents",
     response={"type": "string", "format": "binary"}, response_media="*/*")
def upload_content(agent_id: str, file_id: str):
    return file_response(kernel().agents.upload_content(agent(agent_id), file_id))
