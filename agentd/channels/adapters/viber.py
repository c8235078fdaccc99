"""Viber REST Bot API: `set_webhook` on start (Viber calls the URL back at once, so the
listener opens first), inbound callbacks signed with `X-Viber-Content-Signature` (hex
HMAC-SHA256 of the raw body keyed with the auth token, checked before parsing), replies
via `send_message` (`X-Viber-Auth-Token` header).

Files: a `picture` or `file` message names its `media` URL on Viber's own hosts (under
viber.com, valid for an hour), fetched from there only (the URL carries its own signature,
no token is sent); the picture's `text` is its caption. Files do not go out: Viber's
picture and file messages take only the URL of a file hosted publicly (`media`), and the
bot API has no upload.

Docs: https://developers.viber.com/docs/api/rest-bot-api/
"""

from __future__ import annotations

from typing import Any

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.webhook import Request, WebhookAdapter

API_URL = "https://chatapi.viber.com"
MEDIA_DOMAIN = ".viber.com"  # dl-media.viber.com and the CDN hosts under it
EVENTS = ["delivered", "seen", "failed", "subscribed", "unsubscribed", "conversation_started"]


class ViberAdapter(WebhookAdapter):
    max_message_len = 7000
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8451)

    def call(self, method: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST /pa/<method>; Viber answers 200 with `status` 0 on success."""
        url = (self.settings.get("api_url") or API_URL).rstrip("/") + "/pa/" + method
        answer = self.http.json("POST", url, json=payload,
                                headers={"X-Viber-Auth-Token": self.env("auth_token_env")})
        if not isinstance(answer, dict) or answer.get("status") != 0:
            message = answer.get("status_message") if isinstance(answer, dict) else "not JSON"
            raise ChannelError(f"viber {method}: {message}")
        return answer

    def prepare(self) -> None:
        self.env("auth_token_env")
        if not self.settings.get("webhook_url"):
            raise ChannelError("webhook_url is not set: Viber needs the public URL of this listener")

    def start(self) -> None:
        super().start()
        try:
            self.call("set_webhook", {"url": self.settings["webhook_url"], "event_types": EVENTS,
                                      "send_name": True})
        except ChannelError:
            self.stop()
            raise

    def verify(self, request: Request) -> bool:
        token = self.env("auth_token_env", required=False)
        return hmacs.check(token, request.body, request.headers.get("x-viber-content-signature"))

    def _inbound(self, request: Request) -> tuple[int, Any]:
        data = request.json()
        if not isinstance(data, dict):
            raise ValueError("body must be a JSON object")
        message, sender = data.get("message") or {}, data.get("sender") or {}
        token = str(data.get("message_token") or "")
        files = self._files(message, token) if data.get("event") == "message" else []
        text = message.get("text") if message.get("type") == "text" or files else None
        if data.get("event") == "message" and isinstance(text or "", str) and (text or files):
            user = str(sender.get("id") or "")
            conversation = Conversation(self.name, user, user, direct=True)
            self.ctx.deliver(Inbound(conversation, sender_id=user, text=str(text or ""), message_id=token,
                                     sender_name=str(sender.get("name") or ""), attachments=files))
        return 200, {"status": 0}

    @staticmethod
    def _files(message: dict[str, Any], token: str) -> list[Attachment]:
        kind = message.get("type")
        if kind not in ("picture", "file") or not isinstance(message.get("media"), str):
            return []
        name = str(message.get("file_name") or "") or f"picture-{token[-6:]}.jpg"
        size = message.get("file_size") or message.get("size") or 0
        return [Attachment(name, size=int(size) if str(size).isdigit() else 0, url=message["media"])]

    def file_hosts(self) -> set[str]:
        hosts = {MEDIA_DOMAIN}
        if self.settings.get("api_url"):
            hosts.add(host_of(str(self.settings["api_url"])))
        return hosts

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        raise ChannelError("viber: Viber sends only files hosted at a public URL (no upload API for bots)")

    def send(self, conversation: Conversation, text: str) -> str:
        name = (self.settings.get("default_agent") or "agentd")[:28]  # sender.name: at most 28 chars
        token = ""
        for part in self.reply_texts(text):
            answer = self.call("send_message", {"receiver": conversation.chat_id, "type": "text",
                                                "sender": {"name": name}, "text": part})
            token = str(answer.get("message_token") or "")
        return token

    def test_target(self, override: str = "") -> Conversation:
        if not override:
            raise ChannelError("pass chat_id (a subscribed Viber user id) to send a test message")
        return Conversation(self.name, override, override, direct=True)

    def close(self) -> None:
        super().close()
        self.http.close()


ADAPTER = ViberAdapter
