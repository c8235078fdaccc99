"""Pumble app (bot) adapter: Pumble POSTs events to the app's endpoint, signed with the
app's signing secret (`x-pumble-request-signature` = hex HMAC-SHA256 of
`{x-pumble-request-timestamp}:{raw body}`, checked with a replay window before parsing);
`NEW_MESSAGE` events (the notification JSON in the envelope's `body`) from direct channels,
or mentioning the bot elsewhere (every one under `overrides.group_policy` respond / shared),
reach the agent. Replies go through the Pumble API with
the bot's access token (`token` header) and the app key (`x-app-token`):
`POST /v1/channels/{id}/messages` in direct channels, `POST /v1/channels/{id}/messages/
{threadRootId}` (a thread reply) in the others.

Files: an event whose `f` lists files is looked up with `GET /v1/channels/{id}/messages/{id}`
(the Message's `files`: `name`, `mimeType`, `size`, `path`), each fetched from Pumble's file
host with the same two headers. A file goes out as the SDK uploads one: an upload token
(`POST /v1/files/upload/token` {filename, length}), the bytes to the file server
(`POST {files_url}/upload/files`, multipart `file`, `authtoken` header), `POST
/v1/files/upload/complete` with the server's answer, then a message with `files: [id]`.
Docs: https://cake-com.github.io/pumble-node-sdk/ (events, API client, request signing).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.webhook import Request, WebhookAdapter, within_window

API_URL = "https://api-ga.pumble.com"
FILES_URL = "https://files.pumble.com"


class PumbleAdapter(WebhookAdapter):
    max_message_len = 10000  # the API takes up to 100,000; shorter posts read better

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)
        self.bot_id = str(settings.get("bot_user_id") or "")
        self._direct: dict[str, bool] = {}  # channel id -> is a DIRECT channel
        self._lock = threading.Lock()

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8455)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        url = (self.settings.get("api_url") or API_URL).rstrip("/") + path
        return self.http.json(method, url, headers=self.auth(), **kwargs)

    def auth(self) -> dict[str, str]:
        return {"token": self.env("bot_token_env"), "x-app-token": self.env("app_key_env")}

    def files_url(self) -> str:
        return str(self.settings.get("files_url") or FILES_URL).rstrip("/")

    def prepare(self) -> None:
        self.env("signing_secret_env")
        profile = self.call("GET", "/oauth2/me")  # checks the token; tells the bot's own user id
        if not self.bot_id:
            self.bot_id = str(profile.get("workspaceUserId") or "") if isinstance(profile, dict) else ""
        if not self.bot_id:
            raise ChannelError("pumble /oauth2/me did not name the bot user (set bot_user_id)")

    def verify(self, request: Request) -> bool:
        secret = self.env("signing_secret_env", required=False)
        stamp = request.headers.get("x-pumble-request-timestamp") or ""
        given = request.headers.get("x-pumble-request-signature") or ""
        if not (secret and stamp and given) or not within_window(_seconds(stamp)):
            return False
        return hmacs.check(secret, stamp.encode() + b":" + request.body, given)

    def is_direct(self, channel_id: str) -> bool:
        with self._lock:
            known = self._direct.get(channel_id)
        if known is None:
            try:
                info = self.call("GET", f"/v1/channels/{channel_id}")
            except ChannelError as exc:  # unknown for now: answer mentions only, ask again next time
                self.ctx.log.warning("pumble: channel %s details: %s", channel_id, exc)
                return False
            known = ((info.get("channel") or {}) if isinstance(info, dict) else {}).get("channelType") == "DIRECT"
            with self._lock:
                self._direct[channel_id] = known
        return known

    def _inbound(self, request: Request) -> tuple[int, Any]:
        envelope = request.json()
        if not isinstance(envelope, dict):
            raise ValueError("body must be a JSON object")
        if envelope.get("messageType") not in ("PUMBLE_EVENT", "APP_EVENT") or envelope.get("eventType") != "NEW_MESSAGE":
            return 200, b"ok"
        event = envelope.get("body")
        event = json.loads(event) if isinstance(event, str) else event
        if not isinstance(event, dict):
            raise ValueError("body must carry the event")
        author, channel, text = str(event.get("aId") or ""), str(event.get("cId") or ""), event.get("tx")
        text = text if isinstance(text, str) else ""
        shared = bool(event.get("f")) and isinstance(event.get("f"), list)
        if author == self.bot_id or event.get("eph") or not channel or not (text.strip() or shared):
            return 200, b"ok"  # our own posts, ephemeral and empty messages
        mention = f"<<@{self.bot_id}>>"
        direct = self.is_direct(channel)
        mentioned = self.bot_id in (event.get("mu") or []) or mention in text
        # Answered in the message's thread (its own when it starts one): a conversation of its own.
        thread = "" if direct else str(event.get("trId") or event.get("mId") or "")
        conversation = Conversation(self.name, channel, author, direct=direct, meta={"thread": thread},
                                    thread_id=thread)
        files = self._files(channel, str(event.get("mId") or "")) if shared else []
        self.ctx.deliver(Inbound(conversation, sender_id=author, text=text.replace(mention, "").strip(),
                                 message_id=str(event.get("mId") or ""), mentioned=mentioned,
                                 addressed=direct or mentioned, attachments=files))
        return 200, b"ok"

    def _files(self, channel: str, message_id: str) -> list[Attachment]:
        """The files of a message, as the messages API describes them (the event only counts them)."""
        try:
            message = self.call("GET", f"/v1/channels/{channel}/messages/{message_id}")
        except ChannelError as exc:
            self.ctx.log.warning("pumble: files of message %s: %s", message_id, exc)
            return []
        found = []
        for item in (message.get("files") or []) if isinstance(message, dict) else []:
            if isinstance(item, dict) and item.get("path"):
                path = str(item["path"])
                url = path if "://" in path else f"{self.files_url()}/{path.lstrip('/')}"
                name = str(item.get("name") or path.rsplit("/", 1)[-1])
                found.append(Attachment(name, str(item.get("mimeType") or ""), int(item.get("size") or 0), url,
                                        headers=self.auth()))
        return found

    def file_hosts(self) -> set[str]:
        return {host_of(self.files_url()), host_of(str(self.settings.get("api_url") or API_URL))}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        grant = self.call("POST", "/v1/files/upload/token", json={"filename": filename, "length": len(data)})
        headers = {"authtoken": str(grant.get("token") or "")}
        if grant.get("remoteProductToken"):
            headers["Remote-Product-Token"] = str(grant["remoteProductToken"])
        uploaded = self.http.json("POST", f"{self.files_url()}/upload/files", headers=headers,
                                  files={"file": (filename, data, content_type)})
        done = self.call("POST", "/v1/files/upload/complete", json=uploaded)
        if not isinstance(done, dict) or not done.get("id"):
            raise ChannelError("pumble: the file upload was not completed (no file id)")
        thread = conversation.meta.get("thread") or ""
        path = f"/v1/channels/{conversation.chat_id}/messages" + (f"/{thread}" if thread else "")
        answer = self.call("POST", path, json={"text": "", "files": [str(done["id"])]})
        return str(answer.get("id") or "") if isinstance(answer, dict) else ""

    def send(self, conversation: Conversation, text: str) -> str:
        thread = conversation.meta.get("thread") or ""
        path = f"/v1/channels/{conversation.chat_id}/messages" + (f"/{thread}" if thread else "")
        message_id = ""
        for part in self.reply_texts(text):
            answer = self.call("POST", path, json={"text": part})
            message_id = str(answer.get("id") or "") if isinstance(answer, dict) else ""
        return message_id

    def test_target(self, override: str = "") -> Conversation:
        if not override:
            raise ChannelError("pass chat_id (a Pumble channel id the bot is in) to send a test message")
        return Conversation(self.name, override, override)

    def close(self) -> None:
        super().close()
        self.http.close()


def _seconds(stamp: str) -> str:
    """Pumble's timestamps are epoch milliseconds; accept seconds too."""
    try:
        value = float(stamp)
    except ValueError:
        return ""
    return str(value / 1000 if value > 1e11 else value)


ADAPTER = PumbleAdapter
