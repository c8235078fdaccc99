"""Google Chat app over HTTP: interaction events POSTed to the adapter's own listener with
`Authorization: Bearer <JWT>`, verified before use: RS256 signed by a certificate of
chat@system.gserviceaccount.com (`certs_url`, cached, refetched on an unknown key id),
issuer chat@system.gserviceaccount.com, audience the Cloud project number
(`project_number`), not expired. MESSAGE events reach the agent; replies are posted in the
message's thread with the service account: a JWT-bearer grant (an assertion signed with the
key file's private key) for a chat.bot token, cached, then
POST {api_url}/v1/{space}/messages?messageReplyOption=REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD.

Files: a message's `attachment` list (uploaded content: `attachmentDataRef.resourceName`)
is fetched with media.download, GET {api_url}/v1/media/{resourceName}?alt=media, with the
app's chat.bot token, from chat.googleapis.com (or the host of `api_url`) only; files in
Google Drive (`driveDataRef`) are not read (the app has no Drive access). Nothing is sent
back as a file: media.upload requires user authentication, which a Chat app acting as
itself does not have.

Docs: https://developers.google.com/workspace/chat/authenticate-authorize-chat-app (verifying
requests), .../api/reference/rest/v1/spaces.messages/create, and
https://developers.google.com/identity/protocols/oauth2/service-account (JWT-bearer grant).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any
from urllib.parse import quote

import jwt

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of, with_bearer
from agentd.channels.bases.jwt_webhook import JwtWebhookAdapter
from agentd.channels.bases.webhook import Request

ISSUER = "chat@system.gserviceaccount.com"
SCOPE = "https://www.googleapis.com/auth/chat.bot"
TOKEN_URL = "https://oauth2.googleapis.com/token"
API_URL = "https://chat.googleapis.com"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"


class GoogleChatAdapter(JwtWebhookAdapter):
    max_message_len = 4096
    text_format = "slack"  # Google Chat reads the same *bold*, _italic_ and <url|text> links
    keys_setting, keys_kind = "certs_url", "x509"
    issuer, audience_setting, leeway = ISSUER, "project_number", 60

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8444)

    def prepare(self) -> None:
        if not self.settings.get("project_number"):
            raise ChannelError("project_number is not set: Google Chat signs its requests for the Cloud "
                               "project number, which is how they are verified")
        self.service_account()

    def service_account(self) -> dict[str, Any]:
        """The JSON key: the env var holds its path (or the JSON itself)."""
        value = self.env("service_account_env").strip()
        try:
            if value.startswith("{"):
                info = json.loads(value)
            else:
                with open(os.path.expanduser(value), encoding="utf-8") as handle:
                    info = json.load(handle)
        except (OSError, ValueError) as exc:
            raise ChannelError(f"service account key unreadable: {type(exc).__name__}") from None
        if not isinstance(info, dict) or not info.get("client_email") or not info.get("private_key"):
            raise ChannelError("service account key lacks client_email or private_key")
        return info

    def verify(self, request: Request) -> bool:
        try:
            return self.request_claims(request) is not None
        except ChannelError as exc:
            self.ctx.log.info("google chat event refused: %s", exc)
            return False

    def _inbound(self, request: Request) -> tuple[int, Any]:
        event = request.json()
        if not isinstance(event, dict):
            raise ValueError("body must be a JSON object")
        message = event.get("message")
        if event.get("type") != "MESSAGE" or not isinstance(message, dict):
            return 200, {}  # ADDED_TO_SPACE, REMOVED_FROM_SPACE, CARD_CLICKED
        text = message.get("argumentText") if isinstance(message.get("argumentText"), str) else message.get("text")
        sender = message.get("sender") or event.get("user") or {}
        files = self._attachments(message)
        if not (isinstance(text, str) or files) or sender.get("type") == "BOT":
            return 200, {}
        space = message.get("space") or event.get("space") or {}
        direct = space.get("type") == "DM" or space.get("spaceType") == "DIRECT_MESSAGE"
        user = str(sender.get("name") or "")
        conversation = Conversation(self.name, str(space.get("name") or ""), user, direct=direct,
                                    meta={"thread": (message.get("thread") or {}).get("name") or ""})
        self.ctx.deliver(Inbound(conversation, sender_id=user, text=str(text or "").strip(),
                                 message_id=str(message.get("name") or ""),
                                 sender_name=str(sender.get("displayName") or ""),
                                 sender_aliases=(str(sender["email"]),) if sender.get("email") else (),
                                 attachments=files))
        return 200, {}  # the answer is posted through the API once the agent has it

    def api(self) -> str:
        return str(self.settings.get("api_url") or API_URL).rstrip("/")

    def _attachments(self, message: dict[str, Any]) -> list[Attachment]:
        found = []
        for n, item in enumerate(message.get("attachment") or []):
            ref = item.get("attachmentDataRef") if isinstance(item, dict) else None
            if not isinstance(ref, dict) or not isinstance(ref.get("resourceName"), str):
                continue  # a Drive file: not readable by the app itself
            found.append(with_bearer(Attachment(
                str(item.get("contentName") or f"file-{n + 1}"), str(item.get("contentType") or ""), 0,
                f"{self.api()}/v1/media/{quote(ref['resourceName'], safe='/')}?alt=media"), self.token.get))
        return found

    def file_hosts(self) -> set[str]:
        return {host_of(API_URL), host_of(self.api())}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        raise ChannelError("google_chat: a Chat app cannot post files: media.upload requires user authentication")

    def _fetch_token(self) -> tuple[str, float]:
        info = self.service_account()
        url = self.settings.get("token_url") or info.get("token_uri") or TOKEN_URL
        now = int(time.time())
        assertion = jwt.encode({"iss": info["client_email"], "scope": SCOPE, "aud": url, "iat": now, "exp": now + 3600},
                               info["private_key"], algorithm="RS256",
                               headers={"kid": info["private_key_id"]} if info.get("private_key_id") else None)
        answer = self.http.json("POST", url, data={"grant_type": JWT_BEARER, "assertion": assertion})
        return self.access_token(answer, "google")

    def send(self, conversation: Conversation, text: str) -> str:
        url = f"{self.api()}/v1/{conversation.chat_id}/messages"
        name = ""
        for part in self.reply_texts(text):
            body: dict[str, Any] = {"text": part}
            params = {}
            if conversation.meta.get("thread"):
                body["thread"] = {"name": conversation.meta["thread"]}
                params["messageReplyOption"] = "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"
            answer = self.http.json("POST", url, json=body, params=params,
                                    headers={"Authorization": "Bearer " + self.token.get()})
            name = str(answer.get("name") or "") if isinstance(answer, dict) else ""
        return name

    def test_target(self, override: str = "") -> Conversation:
        target = override or next(iter(self.settings.get("space_ids") or []), "")
        if not target.startswith("spaces/"):
            raise ChannelError("pass chat_id (a space name, spaces/...) or set space_ids to send a test message")
        return Conversation(self.name, target, "", direct=False)


ADAPTER = GoogleChatAdapter
