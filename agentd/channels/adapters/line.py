"""LINE Messaging API: an inbound webhook verified by `X-Line-Signature` (base64
HMAC-SHA256 of the raw body with the channel secret, checked before parsing), replies
through the reply API (the event's one-use replyToken, while fresh) or the push API.

Files: an `image`, `file` or `audio` message sent through LINE (`contentProvider.type`
"line"; a file message always is) is fetched with `GET /v2/bot/message/{id}/content` from
the data host, api-data.line.me (with the channel token); an image the sender's app hosts
elsewhere (`external`) names its own URL, which is refused as off the platform. Files do not
go out: LINE's image, audio and video messages take only a public HTTPS URL of the file
(`originalContentUrl`), and a bot cannot send a file message at all.

Docs: https://developers.line.biz/en/reference/messaging-api/ (webhooks, reply, push, content).
"""

from __future__ import annotations

import time
from typing import Any

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.webhook import Request, WebhookAdapter

API_URL = "https://api.line.me"
DATA_URL = "https://api-data.line.me"  # message content is served from its own host
FILES = {"image": ".jpg", "audio": ".m4a", "file": ""}  # LINE's own formats, by message type
REPLY_TOKEN_TTL = 50.0  # LINE reply tokens expire after about a minute; push after that
MAX_MESSAGES = 5  # message objects per reply/push call


class LineAdapter(WebhookAdapter):
    max_message_len = 5000
    limit_unit = "utf16"
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)

    def api(self, path: str) -> str:
        return (self.settings.get("api_url") or API_URL).rstrip("/") + path

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8450)

    def prepare(self) -> None:
        self.env("channel_secret_env")
        self.env("access_token_env")

    def verify(self, request: Request) -> bool:
        secret = self.env("channel_secret_env", required=False)
        return hmacs.check(secret, request.body, request.headers.get("x-line-signature"), encoding="base64")

    def _inbound(self, request: Request) -> tuple[int, Any]:
        data = request.json()
        events = data.get("events") if isinstance(data, dict) else None
        if not isinstance(events, list):
            raise ValueError("events must be an array")
        for event in events:  # LINE expects 200 quickly; the reply is sent later
            if not isinstance(event, dict) or event.get("type") != "message":
                continue
            message, source = event.get("message") or {}, event.get("source") or {}
            files = self._files(message)
            if not files and (message.get("type") != "text" or not isinstance(message.get("text"), str)):
                continue
            user = str(source.get("userId") or "")
            kind = source.get("type")
            chat = str(source.get("groupId") or source.get("roomId") or user)
            conversation = Conversation(self.name, chat, user, direct=kind == "user",
                                        meta={"reply_token": event.get("replyToken") or "",
                                              "received": time.monotonic()})
            self.ctx.deliver(Inbound(conversation, sender_id=user, text=str(message.get("text") or ""),
                                     message_id=str(message.get("id") or ""), attachments=files))
        return 200, {}

    def _data(self, path: str) -> str:
        # A configured `api_url` (a proxy, a test server) serves the content too.
        return (self.settings.get("api_url") or DATA_URL).rstrip("/") + path

    def _files(self, message: dict[str, Any]) -> list[Attachment]:
        kind, message_id = message.get("type"), str(message.get("id") or "")
        if kind not in FILES or not message_id.isdigit():  # the id goes into the content URL's path
            return []
        provider = message.get("contentProvider")
        provider = provider if isinstance(provider, dict) else {"type": "line"}
        name = str(message.get("fileName") or "") or f"{kind}-{message_id[-6:]}{FILES[kind]}"
        if provider.get("type") != "line":
            return [Attachment(name, url=str(provider.get("originalContentUrl") or ""))]
        size = message.get("fileSize")
        return [Attachment(name, size=int(size) if str(size).isdigit() else 0,
                           url=self._data(f"/v2/bot/message/{message_id}/content"),
                           headers={"Authorization": "Bearer " + self.env("access_token_env")})]

    def file_hosts(self) -> set[str]:
        return {host_of(self._data(""))}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        raise ChannelError("line: LINE sends only files hosted at a public HTTPS URL (no upload API for bots)")

    def send(self, conversation: Conversation, text: str) -> str:
        headers = {"Authorization": "Bearer " + self.env("access_token_env")}
        parts = [{"type": "text", "text": p} for p in self.reply_texts(text)]
        token = conversation.meta.pop("reply_token", "")  # one use only
        fresh = token and time.monotonic() - conversation.meta.get("received", 0) < REPLY_TOKEN_TTL
        for start in range(0, len(parts), MAX_MESSAGES):
            batch = parts[start:start + MAX_MESSAGES]
            if fresh and start == 0:
                self.http.request("POST", self.api("/v2/bot/message/reply"), headers=headers,
                                  json={"replyToken": token, "messages": batch})
            else:
                self.http.request("POST", self.api("/v2/bot/message/push"), headers=headers,
                                  json={"to": conversation.chat_id, "messages": batch})
        return ""  # LINE's reply/push answers carry no message id

    def send_typing(self, conversation: Conversation) -> None:
        # The loading animation exists in one-to-one chats only; it ends when the reply arrives.
        if conversation.direct:
            self.http.request("POST", self.api("/v2/bot/chat/loading/start"), retries=0,
                              headers={"Authorization": "Bearer " + self.env("access_token_env")},
                              json={"chatId": conversation.chat_id, "loadingSeconds": 5})

    def test_target(self, override: str = "") -> Conversation:
        if not override:
            raise ChannelError("pass chat_id (a LINE user, group or room id) to send a test message")
        return Conversation(self.name, override, override, direct=True)

    def close(self) -> None:
        super().close()
        self.http.close()


ADAPTER = LineAdapter
