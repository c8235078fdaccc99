"""Zulip REST API (HTTP Basic: bot email + API key): registers an event queue
(`POST /api/v1/register`, message events, raw Markdown), long-polls
`GET /api/v1/events`, replies with `POST /api/v1/messages` (same stream and topic, or
a private message), typing with `POST /api/v1/typing`, reactions with
`POST`/`DELETE /api/v1/messages/{id}/reactions` (emoji by name). A queue the server forgot
(BAD_EVENT_QUEUE_ID) is registered again. Stream messages are answered when they
mention the bot (all of them under `overrides.group_policy` respond / shared); private
messages always.

Files: a message shares a file by linking its upload (`[name](/user_uploads/...)` in the
raw Markdown); each such link is fetched from the realm (`server_url`'s host only) with the
bot's basic auth. Files go out with `POST /api/v1/user_uploads` (one multipart file) and a
message linking the returned `url` (Zulip shows a linked image inline)."""

from __future__ import annotations

import base64
import json
import mimetypes
import re
from typing import Any
from urllib.parse import unquote, urljoin

import requests

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.polling import PollingAdapter
from agentd.channels.conversation import without_mention
from agentd.channels.lifecycle import emoji_name


# A Markdown link to an upload: relative to the realm, or absolute (another host's is refused).
UPLOAD_LINK = re.compile(r"\[([^\]]*)\]\(((?:https?://[^\s/)]+)?/user_uploads/[^\s)]+)\)")


class ZulipAdapter(PollingAdapter):
    max_message_len = 10_000

    def prepare(self) -> None:
        self.base = str(self.settings.get("server_url") or "").rstrip("/")
        self.email = str(self.settings.get("bot_email") or "")
        if not self.base or not self.email:
            raise ChannelError("server_url and bot_email must be set")
        key = self.env("api_key_env")
        self.http.session.auth = (self.email, key)
        # Uploads are fetched outside this session (attachments.fetch): the same credentials.
        self.basic = "Basic " + base64.b64encode(f"{self.email}:{key}".encode()).decode("ascii")
        self.long_poll = float(self.settings.get("long_poll_secs") or 30)
        self.queue_id = ""

    def api(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        data = self.http.json(method, f"{self.base}/api/v1/{path}", **kwargs)
        if data.get("result") != "success":
            raise ChannelError(f"{path}: {data.get('code')}: {data.get('msg')}")
        return data

    def poll_once(self) -> None:
        if not self.queue_id:
            me = self.api("GET", "users/me", retries=0)
            self.user_id, self.full_name = me["user_id"], me.get("full_name", "")
            queue = self.api("POST", "register", retries=0, data={
                "event_types": json.dumps(["message"]), "apply_markdown": "false"})
            self.queue_id, self.last_event = queue["queue_id"], queue["last_event_id"]
        try:  # the server holds the request until events arrive (heartbeats at the latest)
            response = self.http.session.get(f"{self.base}/api/v1/events", timeout=(10, self.long_poll),
                                             params={"queue_id": self.queue_id, "last_event_id": self.last_event})
        except requests.exceptions.ReadTimeout:
            return  # nothing happened; the queue keeps our place
        data = response.json()
        if response.status_code == 400 and data.get("code") == "BAD_EVENT_QUEUE_ID":
            self.queue_id = ""  # expired on the server: register a new one
            return
        if data.get("result") != "success":
            raise ChannelError(f"events: HTTP {response.status_code} {data.get('msg')}")
        for event in data.get("events", []):
            self.last_event = max(self.last_event, int(event["id"]))
            if event.get("type") == "message":
                self._handle(event["message"], event.get("flags") or [])

    def _handle(self, message: dict[str, Any], flags: list[str]) -> None:
        if message.get("sender_id") == self.user_id:
            return
        text = str(message.get("content") or "")
        sender = str(message.get("sender_email"))
        mention = f"@**{self.full_name}**"
        mentioned = "mentioned" in flags or mention in text
        if message.get("type") == "stream":
            text = without_mention(text, re.escape(mention))
            stream, topic = str(message.get("display_recipient")), str(message.get("subject", ""))
            # A topic is a conversation of its own, answered in the same topic.
            conversation = Conversation(self.name, stream, sender, meta={"topic": topic, "to": stream},
                                        thread_id=topic)
        else:
            conversation = Conversation(self.name, sender, sender, direct=True,
                                        meta={"to": [sender], "user_ids": [message.get("sender_id")]})
        self.ctx.deliver(Inbound(conversation, sender_id=sender, text=text.strip(),
                                 message_id=str(message.get("id")),
                                 sender_name=str(message.get("sender_full_name") or sender),
                                 sender_aliases=(str(message.get("sender_id")),), mentioned=mentioned,
                                 addressed=mentioned or message.get("type") != "stream", attachments=self._files(text)))

    def _files(self, text: str) -> list[Attachment]:
        found, seen = [], set()
        for label, link in UPLOAD_LINK.findall(text):
            url = urljoin(self.base + "/", link)
            if url in seen:
                continue
            seen.add(url)
            name = unquote(link.rsplit("/", 1)[-1]) or label or "file"
            found.append(Attachment(name, mimetypes.guess_type(name)[0] or "", 0, url,
                                    headers={"Authorization": self.basic}))
        return found

    def file_hosts(self) -> set[str]:
        return {host_of(str(self.settings.get("server_url") or ""))}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        uploaded = self.api("POST", "user_uploads", files={"filename": (filename, data, content_type)})
        link = str(uploaded.get("url") or uploaded.get("uri") or "")
        if not link:
            raise ChannelError("user_uploads: no url in the answer")
        label = filename.replace("[", "(").replace("]", ")")
        return self._post(conversation, f"[{label}]({link})")

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        return ",".join(self._post(conversation, part) for part in self.reply_texts(text))

    def _post(self, conversation: Conversation, content: str) -> str:
        if conversation.direct:
            body = {"type": "private", "to": json.dumps(conversation.meta.get("to") or [conversation.chat_id])}
        else:
            body = {"type": "stream", "to": conversation.chat_id, "topic": conversation.meta.get("topic") or "agentd"}
        return str(self.api("POST", "messages", data={**body, "content": content}).get("id"))

    def send_typing(self, conversation: Conversation) -> None:
        if conversation.direct and conversation.meta.get("user_ids"):
            self.api("POST", "typing", retries=0, data={"op": "start",
                                                        "to": json.dumps(conversation.meta["user_ids"])})

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.api("POST", f"messages/{message_id}/reactions", retries=0,
                 data={"emoji_name": emoji_name(emoji, ZULIP_NAMES)})

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.api("DELETE", f"messages/{message_id}/reactions", retries=0,
                 data={"emoji_name": emoji_name(emoji, ZULIP_NAMES)})

    def test_target(self, override: str = "") -> Conversation:
        target = override or next(iter(self.settings.get("streams") or []), "")
        if not target:
            raise ChannelError("no test target: set streams or pass chat_id (a stream name)")
        return Conversation(self.name, target, meta={"topic": "agentd test"})


# Zulip's own names where they differ from the common ones.
ZULIP_NAMES = {"✅": "check", "👍": "thumbs_up"}

ADAPTER = ZulipAdapter
