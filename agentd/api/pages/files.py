"""An agent's files in the dashboard: uploads, screenshots and what its media tools made."""

from __future__ import annotations

from flask import render_template

from agentd.api.pages import bp, kernel
from agentd.api.routes_uploads import INLINE_TYPES, file_response


@bp.get("/agents/<agent_id>/files")
def agent_files(agent_id: str):
    agents = kernel().agents
    handle = agents.get(agent_id)
    return render_template("files.html", agent={"id": handle.id, "name": handle.name},
                           files=agents.uploads_of(handle), inline=INLINE_TYPES)


@bp.get("/agents/<agent_id>/files/<file_id>")
def agent_file(agent_id: str, file_id: str):
    agents = kernel().agents
    return file_response(agents.upload_content(agents.get(agent_id), file_id))
