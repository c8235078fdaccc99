"""Generic webhook: inbound JSON POSTs on its own listener, replies POSTed to a callback.

Inbound `{"sender_id", "sender_name", "message", "attachments"}`; when `secret_env`
names a set variable, `X-Webhook-Signature: sha256=<hex HMAC-SHA256(secret, raw body)>`
is checked before the body is parsed (401 otherwise). Answers 202 at once; the reply
goes to `callback_url` as `{"sender_id", "message", "agent"}`, signed the same way.

Files travel in the JSON itself, both ways: `attachments: [{"filename", "content_type",
"data"}]` with `data` in base64 (standard alphabet, padded). An inbound message needs a
`message` or at least one attachment; a file the agent makes goes to `callback_url` as
`{"sender_id", "message": "", "agent", "attachments": [one file]}`.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import uuid
from typing import Any

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.webhook import Request, WebhookAdapter

SIGNATURE_HEADER = "X-Webhook-Signature"


class GenericWebhookAdapter(WebhookAdapter):
    max_message_len = 64_000
    text_format = ""  # the receiver decides how to show it: the agent's text as written

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)

    def secret(self) -> str:
        var = self.settings.get("secret_env") or ""
        return os.environ.get(var, "") if var else ""

    port_key = "listen_port"

    def listen_port(self) -> int:
        return int(self.settings.get("listen_port") or 8460)

    def signed(self) -> bool:
        return bool(self.secret())

    def routes(self):  # type: ignore[no-untyped-def]
        return {("POST", "*"): self._inbound}  # any path: senders differ in where they post

    def verify(self, request: Request) -> bool:
        secret = self.secret()
        return not secret or hmacs.check(secret, request.body, request.headers.get(SIGNATURE_HEADER.lower()),
                                           prefix="sha256=")

    def _inbound(self, request: Request) -> tuple[int, Any]:
        data = request.json()
        if not isinstance(data, dict):
            raise ValueError("body must be a JSON object")
        sender, text = data.get("sender_id"), data.get("message", "")
        files = _attachments(data.get("attachments", []))
        if not isinstance(sender, str) or not sender or not isinstance(text, str) or not (text.strip() or files):
            raise ValueError("sender_id must be a non-empty string, and message a non-empty string "
                             "unless attachments are sent")
        name = data.get("sender_name") if isinstance(data.get("sender_name"), str) else ""
        message_id = str(uuid.uuid4())
        conversation = Conversation(self.name, sender, sender, direct=True)
        self.ctx.deliver(Inbound(conversation, sender_id=sender, text=text, message_id=message_id,
                                 sender_name=name or sender, attachments=files))
        return 202, {"status": "accepted", "message_id": message_id}

    def send(self, conversation: Conversation, text: str) -> str:
        return self._post(conversation, {"message": "\n\n".join(self.reply_texts(text))})

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        return self._post(conversation, {"message": "", "attachments": [
            {"filename": filename, "content_type": content_type, "data": base64.b64encode(data).decode("ascii")}]})

    def _post(self, conversation: Conversation, fields: dict[str, Any]) -> str:
        url = self.settings.get("callback_url") or ""
        if not url:
            raise ChannelError("callback_url is not set: replies have nowhere to go")
        agent = conversation.meta.get("agent", "")
        body = json.dumps({"sender_id": conversation.user_id or conversation.chat_id, "message": fields["message"],
                           "agent": agent or self.settings.get("default_agent") or "",
                           **({"attachments": fields["attachments"]} if "attachments" in fields else {})
                           }).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        secret = self.secret()
        if secret:
            headers[SIGNATURE_HEADER] = "sha256=" + hmacs.hex_digest(secret, body)
        self.http.request("POST", url, data=body, headers=headers)
        return str(uuid.uuid4())

    def test_target(self, override: str = "") -> Conversation:
        target = override or "agentd-test"
        return Conversation(self.name, target, target, direct=True)

    def close(self) -> None:
        super().close()
        self.http.close()


def _attachments(items: Any) -> list[Attachment]:
    """The message's files, or ValueError (a 400 naming what is wrong)."""
    if not isinstance(items, list):
        raise ValueError("attachments must be a list")
    files = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"attachments[{index}] must be an object")
        name, kind, data = item.get("filename"), item.get("content_type", ""), item.get("data")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"attachments[{index}].filename must be a non-empty string")
        if not isinstance(kind, str):
            raise ValueError(f"attachments[{index}].content_type must be a string")
        if not isinstance(data, str):
            raise ValueError(f"attachments[{index}].data must be a base64 string")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"attachments[{index}].data is not valid base64") from None
        files.append(Attachment(name, kind, len(raw), data=raw))
    return files


ADAPTER = GenericWebhookAdapter
