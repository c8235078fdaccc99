"""channel_send: an agent's own message through a configured channel adapter."""

from __future__ import annotations

import json
import mimetypes
import os
from typing import Any

from agentd.agents.handle import MESSAGE_LIMIT
from agentd.agents.tools.base import ToolContext, ToolError, tool
from agentd.api.scopes import scope_of
from agentd.errors import AgentdError


@tool("channel_send", "Send a message or media to a user on a configured channel (email, telegram, slack, etc). "
      "For email: recipient is the email address; optionally set subject. For media: set image_url, file_url, or "
      "file_path to send an image or file instead of (or alongside) text. Use thread_id to reply in a specific "
      "thread/topic.",
      {"channel": {"type": "string", "description": "Channel adapter name (e.g., 'email', 'telegram', 'slack', "
                                                    "'discord')"},
       "recipient": {"type": "string", "description": "Platform-specific recipient identifier (email address, "
                                                      "user ID, etc.)"},
       "subject": {"type": "string", "description": "Optional subject line (used for email; ignored for other "
                                                    "channels)"},
       "message": {"type": "string", "description": "The message body to send (required for text, optional "
                                                    "caption for media)"},
       "image_url": {"type": "string", "description": "URL of an image to send (supported on Telegram, Discord, "
                                                      "Slack)"},
       "file_url": {"type": "string", "description": "URL of a file to send as attachment"},
       "file_path": {"type": "string", "description": "Local file path to send as attachment (reads from disk; use "
                                                      "instead of file_url for local files)"},
       "filename": {"type": "string", "description": "Filename for file attachments (defaults to the basename of "
                                                     "file_path, or 'file')"},
       "thread_id": {"type": "string", "description": "Thread/topic ID to reply in (e.g., Telegram "
                                                      "message_thread_id, Slack thread_ts)"}},
      ("channel", "recipient"), family="channels")
def channel_send(ctx: ToolContext, args: dict[str, Any]) -> str:
    # A key's run sends only what the key could send itself: a channel's test message.
    ctx.acting(scope_of("channels.test"))
    attached = _workspace_file(ctx, args) if args.get("file_path") else None
    # A media URL goes in the message, where every platform shows it.
    parts = [args.get("message") or ""]
    for key in ("image_url", "file_url"):
        if args.get(key):
            parts.append(args[key] if not args.get("filename") or key == "image_url"
                         else f"{args['filename']}: {args[key]}")
    text = "\n".join(p for p in parts if p).strip()
    if not text and attached is None:
        raise ToolError("nothing to send: give a message, image_url, file_url or file_path")
    if len(text.encode()) > MESSAGE_LIMIT:
        raise ToolError(f"message too large: at most {MESSAGE_LIMIT // 1024} KB, as for messages agents receive")
    meta: dict[str, Any] = {}
    if args.get("subject"):
        meta["subject"] = args["subject"]
    if args.get("thread_id"):
        meta.update(thread_id=args["thread_id"], thread_ts=args["thread_id"], message_thread_id=args["thread_id"])
    services = ctx.require_services()
    try:
        sent = services.channel_send(args["channel"], args["recipient"], text,
                                     agent=ctx.agent_name, meta=meta, file=attached)
    except AgentdError as exc:
        raise ToolError(exc.message) from None
    return json.dumps({"status": "sent", **sent})


def _workspace_file(ctx: ToolContext, args: dict[str, Any]) -> tuple[str, str, bytes]:
    """(filename, type sniffed from the bytes, bytes) of a file in the agent's workspace."""
    from agentd.agents.handle import UPLOAD_LIMIT
    from agentd.agents.tools.files import confine
    from agentd.filetypes import sniff

    path = confine(ctx, str(args["file_path"]))
    if not path.is_file():
        raise ToolError(f"no such file in the workspace: {args['file_path']}")
    if path.stat().st_size > UPLOAD_LIMIT:
        raise ToolError(f"{args['file_path']} is larger than {UPLOAD_LIMIT} bytes")
    data = path.read_bytes()
    if not data:
        raise ToolError(f"{args['file_path']} is empty")
    name = os.path.basename(str(args.get("filename") or "")) or path.name
    return name, sniff(data, mimetypes.guess_type(name)[0] or ""), data
