"""Files uploaded to an agent, kept in the database for later `attachments`."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from pony import orm

from agentd.agents.handle import UPLOAD_LIMIT, UPLOAD_TYPES, AgentHandle, parse_uuid
from agentd.errors import BadRequest, NotFound
from agentd.jsonsafe import NUL_MESSAGE, holds_nul
from agentd.timestamps import iso, utcnow
from agentd.store import Store



class Uploads:
    """Stores uploads and reads them back for a run."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # -- uploads ----------------------------------------------------------------------
    def save_upload(self, handle: AgentHandle, filename: str, content_type: str, data: bytes) -> dict[str, Any]:
        """Store an uploaded file for later `attachments`."""
        return self.save_for(handle.id, filename, content_type, data)

    def save_for(self, agent_id: str, filename: str, content_type: str, data: bytes) -> dict[str, Any]:
        """Store a file for an agent (an upload, or what one of its tools made)."""
        if not data:
            raise BadRequest("uploaded file is empty")
        if len(data) > UPLOAD_LIMIT:
            from agentd.errors import PayloadTooLarge
            raise PayloadTooLarge("file too large (max 10 MB)")
        if not content_type.startswith(UPLOAD_TYPES):
            raise BadRequest(f"unsupported content type {content_type!r}: allowed image/*, text/*, "
                             "audio/*, application/pdf")
        for field, value in (("filename", filename), ("content type", content_type)):
            if holds_nul(value):
                raise BadRequest(f"{field} {NUL_MESSAGE}")
        file_id = str(uuid.uuid4())
        safe_name = os.path.basename(filename or "upload")[:200] or "upload"
        # The bytes live in the database: every daemon sharing it can attach the file. The
        # agent's row is locked first, as its deletion locks it first: an upload racing the
        # deletion finds no agent rather than a missing foreign key.
        with orm.db_session(optimistic=False):
            if self.store.e.AgentRow.get_for_update(id=agent_id) is None:
                raise NotFound("agent not found")
            self.store.e.UploadRow(id=file_id, agent=agent_id, filename=safe_name,
                                   content_type=content_type, size=len(data), content=data,
                                   created_at=utcnow())
        return {"file_id": file_id, "filename": safe_name, "content_type": content_type, "size": len(data)}

    def listing(self, handle: AgentHandle) -> list[dict[str, Any]]:
        """The agent's files (uploaded, or made by its tools), newest first, without content."""
        with orm.db_session:
            rows = self.store.e.UploadRow.select(lambda u: u.agent.id == handle.id)
            return [{"file_id": r.id, "filename": r.filename, "content_type": r.content_type, "size": r.size,
                     "created_at": iso(r.created_at)}
                    for r in sorted(rows, key=lambda r: (r.created_at, r.id), reverse=True)]

    def content(self, handle: AgentHandle, file_id: str) -> dict[str, Any]:
        """One of the agent's files with its bytes; NotFound when it has no such file."""
        parse_uuid(file_id, "file")
        try:
            return self.read(handle, file_id)
        except BadRequest:
            raise NotFound(f"agent {handle.name} has no file {file_id}") from None

    def read(self, handle: AgentHandle, file_id: str) -> dict[str, Any]:
        key = parse_uuid(file_id, "file")
        with orm.db_session:
            row = self.store.e.UploadRow.get(id=key)
            if row is None or row.agent.id != handle.id:
                raise BadRequest(f"unknown attachment file_id {file_id}: upload it to this agent first")
            data = bytes(row.content) if row.content is not None else \
                (Path(row.path).read_bytes() if row.path else b"")
            return {"id": row.id, "filename": row.filename, "content_type": row.content_type,
                    "data": data}
