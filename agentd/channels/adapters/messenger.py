"""Facebook Messenger Platform: a webhook on its own listener (GET verification with
`hub.verify_token` → `hub.challenge` echoed; POST events signed with
`X-Hub-Signature-256: sha256=<hex HMAC-SHA256(app secret, raw body)>`, checked before
parsing) and replies through the Send API (`/{version}/me/messages`, page token).

Files: a message's `attachments` of type image, audio or file carry `payload.url` on
Facebook's CDN (hosts under fbcdn.net and fbsbx.com), fetched from there only; files go out
with the Send API itself as multipart form data (`recipient`, `message` with an attachment
of type image / audio / video / file, and the bytes as `filedata`).

Docs: https://developers.facebook.com/docs/messenger-platform/webhooks and
https://developers.facebook.com/docs/messenger-platform/reference/send-api/
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.webhook import Request, WebhookAdapter

API_URL = "https://graph.facebook.com/v18.0"
CDN = {".fbcdn.net", ".fbsbx.com"}  # scontent-*.xx.fbcdn.net (images), cdn.fbsbx.com (files, audio)
FILES = ("image", "audio", "file")


class MessengerAdapter(WebhookAdapter):
    max_message_len = 2000  # the Send API's text limit
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8452)

    def prepare(self) -> None:
        for key in ("page_token_env", "verify_token_env", "app_secret_env"):
            self.env(key)

    def routes(self):  # type: ignore[no-untyped-def]
        return {("GET", "*"): self._challenge, ("POST", "*"): self._inbound}

    def verify(self, request: Request) -> bool:
        if request.method == "GET":  # the subscription handshake carries the verify token
            given = (request.query.get("hub.verify_token") or [""])[0]
            token = self.env("verify_token_env", required=False)
            return bool(token) and hmacs.same(given, token)
        secret = self.env("app_secret_env", required=False)
        return hmacs.check(secret, request.body, request.headers.get("x-hub-signature-256"), prefix="sha256=")

    def _challenge(self, request: Request) -> tuple[int, Any]:
        if (request.query.get("hub.mode") or [""])[0] != "subscribe":
            raise ValueError("hub.mode must be subscribe")
        return 200, (request.query.get("hub.challenge") or [""])[0].encode("utf-8")

    def _inbound(self, request: Request) -> tuple[int, Any]:
        data = request.json()
        if not isinstance(data, dict) or data.get("object") != "page":
            raise ValueError("object must be page")
        for entry in data.get("entry") or []:
            for item in (entry.get("messaging") or []) if isinstance(entry, dict) else []:
                message = item.get("message") if isinstance(item, dict) else None
                files = _files(message) if isinstance(message, dict) else []
                if not isinstance(message, dict) or message.get("is_echo") or \
                        not isinstance(message.get("text", ""), str) or not (message.get("text") or files):
                    continue  # our own echoes, stickers and shares, deliveries, reads
                user = str((item.get("sender") or {}).get("id") or "")
                conversation = Conversation(self.name, user, user, direct=True)
                self.ctx.deliver(Inbound(conversation, sender_id=user, text=str(message.get("text") or ""),
                                         message_id=str(message.get("mid") or ""), attachments=files))
        return 200, {"status": "EVENT_RECEIVED"}

    def file_hosts(self) -> set[str]:
        hosts = set(CDN)
        if self.settings.get("api_url"):
            hosts.add(host_of(str(self.settings["api_url"])))
        return hosts

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        url = (self.settings.get("api_url") or API_URL).rstrip("/") + "/me/messages"
        major = content_type.split("/")[0]
        kind = major if major in ("image", "audio", "video") else "file"
        answer = self.http.json("POST", url, params={"access_token": self.env("page_token_env")}, data={
            "recipient": json.dumps({"id": conversation.chat_id}), "messaging_type": "RESPONSE",
            "message": json.dumps({"attachment": {"type": kind, "payload": {"is_reusable": False}}})},
            files={"filedata": (filename, data, content_type)})
        return str(answer.get("message_id") or "") if isinstance(answer, dict) else ""

    def send(self, conversation: Conversation, text: str) -> str:
        url = (self.settings.get("api_url") or API_URL).rstrip("/") + "/me/messages"
        token = self.env("page_token_env")
        message_id = ""
        for part in self.reply_texts(text):
            answer = self.http.json("POST", url, params={"access_token": token},
                                    json={"recipient": {"id": conversation.chat_id},
                                          "messaging_type": "RESPONSE", "message": {"text": part}})
            message_id = str(answer.get("message_id") or "") if isinstance(answer, dict) else ""
        return message_id

    def send_typing(self, conversation: Conversation) -> None:
        url = (self.settings.get("api_url") or API_URL).rstrip("/") + "/me/messages"
        self.http.json("POST", url, params={"access_token": self.env("page_token_env")}, retries=0,
                       json={"recipient": {"id": conversation.chat_id}, "sender_action": "typing_on"})

    def test_target(self, override: str = "") -> Conversation:
        if not override:
            raise ChannelError("pass chat_id (a page-scoped user id, PSID) to send a test message")
        return Conversation(self.name, override, override, direct=True)

    def close(self) -> None:
        super().close()
        self.http.close()


def _files(message: dict[str, Any]) -> list[Attachment]:
    """The message's files; Messenger names none, so the URL's last path segment is the name."""
    found = []
    for n, item in enumerate(message.get("attachments") or []):
        payload = item.get("payload") if isinstance(item, dict) else None
        # A sticker is an image attachment too, told apart by its sticker_id.
        if not isinstance(payload, dict) or item.get("type") not in FILES or payload.get("sticker_id") \
                or not isinstance(payload.get("url"), str):
            continue
        name = unquote(PurePosixPath(urlsplit(payload["url"]).path).name) or f"{item['type']}-{n + 1}"
        found.append(Attachment(name, url=payload["url"]))
    return found


ADAPTER = MessengerAdapter
