"""WhatsApp Business Cloud API: the same Meta webhook as Messenger (GET `hub.verify_token`
handshake, POST events signed with `X-Hub-Signature-256` over the raw body with the app
secret, checked before parsing), replies via Graph `/{phone_number_id}/messages`, which also
takes the typing indicator (a `status: read` call naming the user's message, shown for up to
25 s or until the reply) and reactions (`type: reaction`; an empty emoji takes it back).

Files: an `image`, `document` or `audio` message names a media id; `GET /{media-id}` (with
the access token) says where the file is, on lookaside.fbsbx.com, fetched with the same
token. Files go out with `POST /{phone_number_id}/media` (multipart `file`, `type`,
`messaging_product`) and a message of type image, audio or document naming the new id.

The personal-account QR path is separate (agentd/channels/qr.py, the gateway routes).
Docs: https://developers.facebook.com/docs/whatsapp/cloud-api/webhooks/payload-examples
and https://developers.facebook.com/docs/whatsapp/cloud-api/reference/messages
"""

from __future__ import annotations

import os
from typing import Any

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.adapters.messenger import MessengerAdapter
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.webhook import Request

API_URL = "https://graph.facebook.com/v18.0"
MEDIA_HOST = "lookaside.fbsbx.com"  # where GET /{media-id} points
MEDIA = ("image", "document", "audio")
# What the Cloud API shows as an image or plays as audio; any other file goes as a document.
IMAGES = ("image/jpeg", "image/png")
AUDIO = ("audio/aac", "audio/amr", "audio/mpeg", "audio/mp4", "audio/ogg")


class WhatsAppAdapter(MessengerAdapter):
    max_message_len = 4096  # text.body limit
    text_format = "whatsapp"

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8443)

    def prepare(self) -> None:
        if not self.settings.get("phone_number_id"):
            raise ChannelError("phone_number_id is not set: the Cloud API mode needs it (the QR "
                               "login path is /api/channels/whatsapp/qr/start)")
        for key in ("access_token_env", "verify_token_env", "app_secret_env"):
            self.env(key)

    def _inbound(self, request: Request) -> tuple[int, Any]:
        data = request.json()
        if not isinstance(data, dict) or data.get("object") != "whatsapp_business_account":
            raise ValueError("object must be whatsapp_business_account")
        for entry in data.get("entry") or []:
            for change in (entry.get("changes") or []) if isinstance(entry, dict) else []:
                value = change.get("value") if isinstance(change, dict) else None
                if not isinstance(value, dict):
                    continue
                names = {c.get("wa_id"): (c.get("profile") or {}).get("name", "")
                         for c in value.get("contacts") or [] if isinstance(c, dict)}
                for message in value.get("messages") or []:  # statuses (sent/read) carry none
                    if not isinstance(message, dict) or message.get("type") not in ("text", *MEDIA):
                        continue
                    user, text = str(message.get("from") or ""), (message.get("text") or {}).get("body")
                    files = self._files(message)
                    if files:
                        text = (message.get(message["type"]) or {}).get("caption") or ""
                    if not user or not isinstance(text, str) or not (text or files):
                        continue
                    conversation = Conversation(self.name, user, user, direct=True,
                                                meta={"message_id": str(message.get("id") or "")})
                    self.ctx.deliver(Inbound(conversation, sender_id=user, text=text,
                                             message_id=str(message.get("id") or ""),
                                             sender_name=names.get(user) or "", attachments=files))
        return 200, {"status": "EVENT_RECEIVED"}

    def _base(self) -> str:
        return (self.settings.get("api_url") or API_URL).rstrip("/")

    def _auth(self) -> dict[str, str]:
        return {"Authorization": "Bearer " + self.env("access_token_env")}

    def _files(self, message: dict[str, Any]) -> list[Attachment]:
        kind = message.get("type")
        media = message.get(kind) if kind in MEDIA else None
        if not isinstance(media, dict) or not str(media.get("id") or "").isdigit():  # it goes into a Graph path
            return []
        media_id, mime = str(media["id"]), str(media.get("mime_type") or "")
        name = str(media.get("filename") or "") or f"{kind}-{media_id[-6:]}{_extension(mime)}"
        return [Attachment(name, mime, url="", headers=self._auth(), locate=lambda: self._locate(media_id))]

    def _locate(self, media_id: str) -> str:
        """The download URL of a media id (valid for a few minutes)."""
        found = self.http.json("GET", f"{self._base()}/{media_id}", headers=self._auth(), retries=1,
                               params={"phone_number_id": self.settings.get("phone_number_id")})
        return str(found.get("url") or "") if isinstance(found, dict) else ""

    def file_hosts(self) -> set[str]:
        hosts = {MEDIA_HOST}
        if self.settings.get("api_url"):
            hosts.add(host_of(str(self.settings["api_url"])))
        return hosts

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        mime = content_type.split(";")[0].strip()  # the media API names bare types
        uploaded = self.http.json("POST", f"{self._base()}/{self.settings.get('phone_number_id')}/media",
                                  headers=self._auth(), files={"file": (filename, data, mime)},
                                  data={"type": mime, "messaging_product": "whatsapp"})
        media: dict[str, Any] = {"id": str(uploaded.get("id") or "") if isinstance(uploaded, dict) else ""}
        if mime in IMAGES:
            kind = "image"
        elif mime in AUDIO:
            kind = "audio"
        else:
            kind, media["filename"] = "document", filename
        answer = self._graph({"recipient_type": "individual", "to": conversation.chat_id, "type": kind,
                              kind: media})
        ids = answer.get("messages") if isinstance(answer, dict) else None
        return str(ids[0].get("id") or "") if isinstance(ids, list) and ids else ""

    def _graph(self, body: dict[str, Any], retries: int | None = None) -> Any:
        return self.http.json("POST", f"{self._base()}/{self.settings.get('phone_number_id')}/messages",
                              retries=retries, headers=self._auth(), json={"messaging_product": "whatsapp", **body})

    def send_typing(self, conversation: Conversation) -> None:
        if conversation.meta.get("message_id"):  # the indicator names the message being answered
            self._graph({"status": "read", "message_id": conversation.meta["message_id"],
                         "typing_indicator": {"type": "text"}}, retries=0)

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        # One reaction per message: a new one replaces the previous.
        self._graph({"recipient_type": "individual", "to": conversation.chat_id, "type": "reaction",
                     "reaction": {"message_id": message_id, "emoji": emoji}}, retries=0)

    def send(self, conversation: Conversation, text: str) -> str:
        base = (self.settings.get("api_url") or API_URL).rstrip("/")
        url = f"{base}/{self.settings.get('phone_number_id')}/messages"
        headers = {"Authorization": "Bearer " + self.env("access_token_env")}
        message_id = ""
        for part in self.reply_texts(text):
            answer = self.http.json("POST", url, headers=headers, json={
                "messaging_product": "whatsapp", "recipient_type": "individual",
                "to": conversation.chat_id, "type": "text", "text": {"body": part}})
            ids = answer.get("messages") if isinstance(answer, dict) else None
            message_id = str(ids[0].get("id") or "") if isinstance(ids, list) and ids else ""
        return message_id

    def test_target(self, override: str = "") -> Conversation:
        if not override:
            raise ChannelError("pass chat_id (the recipient's WhatsApp number) to send a test message")
        return Conversation(self.name, override, override, direct=True)



def _extension(mime: str) -> str:
    import mimetypes

    return mimetypes.guess_extension(mime.split(";")[0].strip()) or ""


def ADAPTER(ctx, settings):  # type: ignore[no-untyped-def]  # noqa: N802 - the registry's name
    """The Cloud API adapter when `phone_number_id` is set, else the QR gateway's when its URL
    variable (`gateway_url_env`) is set (agentd/channels/adapters/whatsapp_gateway.py)."""
    if not settings.get("phone_number_id") and os.environ.get(settings.get("gateway_url_env") or ""):
        from agentd.channels.adapters.whatsapp_gateway import WhatsAppGatewayAdapter
        return WhatsAppGatewayAdapter(ctx, settings)
    return WhatsAppAdapter(ctx, settings)
