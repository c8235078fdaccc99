"""A run's user turn: the message's text, attached text files inline, images as base64 parts."""

from __future__ import annotations

import base64
from typing import Any

from agentd.agents.handle import AgentHandle
from agentd.agents.uploads import Uploads
from agentd.errors import BadRequest
from agentd.llm.catalog import Catalog
from agentd.llm.types import ImagePart, Message


def build_user_message(uploads: Uploads, catalog: Catalog, handle: AgentHandle, text: str,
                       attachments: list[dict[str, Any]], images: list[ImagePart] | None = None,
                       ) -> tuple[Message, list[dict[str, Any]]]:
    """The user turn and the references of its images (kept with the stored turn); 400 for
    images to a model known not to see them."""
    parts = [text]
    image_parts = list(images or [])
    refs: list[dict[str, Any]] = []
    for att in attachments:
        upload = uploads.read(handle, att.get("file_id", ""))
        ctype = upload["content_type"]
        data = upload["data"]
        if ctype.startswith("image/"):
            image_parts.append(ImagePart(ctype, base64.b64encode(data).decode("ascii")))
            refs.append({"file_id": upload["id"], "filename": upload["filename"], "content_type": ctype})
        elif ctype.startswith("text/"):
            parts.append(f"\n[attached file {upload['filename']}]\n{data.decode('utf-8', 'replace')}")
        else:
            parts.append(f"\n[attached file {upload['filename']} ({ctype}, {len(data)} bytes); "
                         "its content cannot be shown to the model]")
    if image_parts:
        info = catalog.get_model(handle.model)
        if info is not None and not info.supports_vision:
            raise BadRequest(f"model {handle.model} does not support images; "
                             "use a vision-capable model or send text only")
    return Message(role="user", content="".join(parts), images=image_parts), refs
