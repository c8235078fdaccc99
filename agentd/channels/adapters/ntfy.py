"""ntfy: subscribe to a topic over Server-Sent Events (`GET /<topic>/sse`, resuming with
`since=<last id>`), publish replies with `POST /<topic>`. Optional Bearer token.

ntfy messages carry no sender identity, so `allowed_users` cannot apply; the topic
itself (and ntfy's access control) decides who may write. Our own replies come back
on the same topic and are recognised by the ids the server gave them.

Files: a message's `attachment` (`name`, `type`, `size`, `url`) is fetched when its URL is on
the ntfy server itself (`/file/...`; a file attached by URL from elsewhere is not); a file
goes out as `PUT /<topic>` with the bytes as the body and its name in `Filename`.
Docs: https://docs.ntfy.sh/publish/#attachments, https://docs.ntfy.sh/subscribe/api/."""

from __future__ import annotations

import collections
from typing import Iterator

import requests

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd import jsonsafe
from agentd.channels.bases.streaming import StreamingAdapter
from agentd.sse_lines import sse_events

OWN_TAG = "agentd"


class NtfyAdapter(StreamingAdapter):
    max_message_len = 4000
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        token = self.env("token_env", required=False) if settings.get("token_env") else ""
        if token:
            self.http.session.headers["Authorization"] = f"Bearer {token}"
        self.base = (settings.get("server_url") or "https://ntfy.sh").rstrip("/")
        self.topic = str(settings.get("topic") or "")
        if not self.topic:
            raise ChannelError("topic is not set")
        self.own_ids: collections.deque[str] = collections.deque(maxlen=200)

    def open_stream(self) -> requests.Response:
        since = self.state.get("since") or "none"  # "none": only messages from now on
        return self.stream(f"{self.base}/{self.topic}/sse", params={"since": since})

    def handle_lines(self, lines: Iterator[str]) -> None:
        for event in sse_events(lines):
            if (event.event or "message") != "message":
                continue
            try:
                data = jsonsafe.loads(event.data)
            except ValueError:
                continue
            if data.get("event", "message") != "message":
                continue
            message_id = str(data.get("id", ""))
            self.save_cursor(since=message_id)
            if message_id in self.own_ids or OWN_TAG in (data.get("tags") or []):
                continue
            text = str(data.get("message") or "").strip()
            files = self._attachments(data.get("attachment"))
            if files and text == f"You received a file: {files[0].filename}":
                text = ""  # what the server writes for a file sent without a message
            if not text and not files:
                continue
            conversation = Conversation(self.name, self.topic)
            self.ctx.deliver(Inbound(conversation, sender_id=str(data.get("title") or "ntfy"), text=text,
                                     message_id=message_id, attachments=files))

    def _attachments(self, attachment: object) -> list[Attachment]:
        if not isinstance(attachment, dict) or not attachment.get("url"):
            return []
        auth = self.http.session.headers.get("Authorization")
        return [Attachment(str(attachment.get("name") or "file"), str(attachment.get("type") or ""),
                           int(attachment.get("size") or 0), str(attachment["url"]),
                           headers={"Authorization": auth} if auth else {})]

    def file_hosts(self) -> set[str]:
        return {host_of(self.base)}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        headers = {"Tags": OWN_TAG, "Title": conversation.meta.get("agent") or "agentd"}
        # A header carries Latin-1 only; the `filename` parameter takes any name.
        named = {"headers": {**headers, "Filename": filename}} if filename.isascii() else \
            {"headers": headers, "params": {"filename": filename}}
        answer = self.http.json("PUT", f"{self.base}/{conversation.chat_id}", data=data, **named)
        message_id = str(answer.get("id", ""))
        self.own_ids.append(message_id)
        return message_id

    def send(self, conversation: Conversation, text: str) -> str:
        ids = []
        for part in self.reply_texts(text):
            answer = self.http.json("POST", f"{self.base}/{conversation.chat_id}", data=part.encode("utf-8"),
                                    headers={"Tags": OWN_TAG, "Title": conversation.meta.get("agent") or "agentd"})
            message_id = str(answer.get("id", ""))
            self.own_ids.append(message_id)
            ids.append(message_id)
        return ",".join(ids)

    def test_target(self, override: str = "") -> Conversation:
        return Conversation(self.name, override or self.topic)


ADAPTER = NtfyAdapter
