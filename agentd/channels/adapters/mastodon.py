"""Mastodon: mentions arrive on the user stream (`GET /api/v1/streaming/user`, Server-Sent
Events, `notification` events of type `mention`); replies are statuses
(`POST /api/v1/statuses`) in reply to the mention, with its visibility, starting with the
author's handle; answers over 500 characters become a thread. After a reconnect the
mentions missed meanwhile are fetched (`GET /api/v1/notifications?since_id=`).

Files: a status's `media_attachments` are fetched from their `url` only when it is on the
instance or its media host (the host serving the instance's thumbnail and the bot's own
avatar and header: Mastodon names no media host otherwise); files go out with
`POST /api/v2/media` (multipart `file`, `description`), waiting on `GET /api/v1/media/{id}`
while it answers 206 (still processing), then a status with `media_ids`.

Docs: https://docs.joinmastodon.org/methods/streaming/, /methods/statuses/,
/methods/notifications/, /methods/instance/ (the streaming server's own URL), /methods/media/.
"""

from __future__ import annotations

import collections
import mimetypes
import re
import time
import uuid
from html.parser import HTMLParser
from typing import Any, Iterator

import requests

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd import jsonsafe
from agentd.channels.bases.streaming import StreamingAdapter
from agentd.sse_lines import sse_events

STATUS_LIMIT = 500  # Mastodon's default maximum status length
MEDIA_WAIT_SECS = 30.0  # how long an upload may stay "processing" before the file is given up


class _Text(HTMLParser):
    """Status HTML (`<p>`, `<br>`, mention links) to plain text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "br":
            self.parts.append("\n")
        elif tag == "p" and self.parts:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    parser.close()
    return "".join(parser.parts).strip()


class MastodonAdapter(StreamingAdapter):
    max_message_len = STATUS_LIMIT
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.base = str(settings.get("instance_url") or "").rstrip("/")
        self.seen: collections.deque[str] = collections.deque(maxlen=500)
        self.me: dict[str, Any] = {}
        self.streaming = self.base
        self.media_hosts: set[str] = set()

    def _auth(self) -> None:
        if not self.base:
            raise ChannelError("instance_url is not set")
        self.http.session.headers["Authorization"] = f"Bearer {self.env('access_token_env')}"

    def start(self) -> None:
        self._auth()
        self.me = self.http.json("GET", f"{self.base}/api/v1/accounts/verify_credentials", retries=1)
        self.media_hosts = {host_of(str(self.me.get(k) or "")) for k in ("avatar", "header")}
        # The streaming server may live on its own host (instance v2: configuration.urls.streaming).
        try:
            instance = self.http.json("GET", f"{self.base}/api/v2/instance", retries=0)
            self.media_hosts.add(host_of(str((instance.get("thumbnail") or {}).get("url") or "")))
            url = str(((instance.get("configuration") or {}).get("urls") or {}).get("streaming") or "")
            if url:
                self.streaming = re.sub(r"^ws", "http", url).rstrip("/")
        except ChannelError:
            pass  # older servers: the stream is served under instance_url
        super().start()

    def open_stream(self) -> requests.Response:
        return self.stream(f"{self.streaming}/api/v1/streaming/user")

    def handle_lines(self, lines: Iterator[str]) -> None:
        last = self.state.get("last_id")
        if last:  # the stream is open: catch up on what arrived while it was not
            missed = self.http.json("GET", f"{self.base}/api/v1/notifications",
                                    params={"since_id": last, "types[]": "mention", "limit": 40})
            for notification in reversed(missed):
                self._handle(notification)
        for event in sse_events(lines):
            if event.event != "notification":
                continue
            try:
                self._handle(jsonsafe.loads(event.data))
            except ValueError:
                continue

    def _handle(self, notification: dict[str, Any]) -> None:
        note_id = str(notification.get("id") or "")
        if not note_id or note_id in self.seen:
            return
        self.seen.append(note_id)
        if note_id.isdigit() and int(note_id) > int(self.state.get("last_id") or 0):
            self.save_cursor(last_id=note_id)
        status, account = notification.get("status") or {}, notification.get("account") or {}
        if notification.get("type") != "mention" or not status or account.get("id") == self.me.get("id"):
            return
        text = html_to_text(str(status.get("content") or ""))
        # Drop the leading mentions of the bot (`@helper` or `@helper@instance`).
        own = re.escape(str(self.me.get("username") or ""))
        text = re.sub(rf"^(?:@{own}(?:@[\w.-]+)?\s*)+", "", text, flags=re.IGNORECASE).strip() if own else text
        files = [self._attachment(m) for m in status.get("media_attachments") or [] if isinstance(m, dict)]
        if not (text or files):
            return
        acct = str(account.get("acct") or "")
        conversation = Conversation(self.name, acct, acct, direct=True,
                                    meta={"in_reply_to_id": str(status.get("id") or ""),
                                          "visibility": status.get("visibility") or "public"})
        self.ctx.deliver(Inbound(conversation, sender_id=acct, text=text, message_id=str(status.get("id") or ""),
                                 sender_name=str(account.get("display_name") or acct),
                                 sender_aliases=(str(account.get("id") or ""),), attachments=files))

    @staticmethod
    def _attachment(media: dict[str, Any]) -> Attachment:
        url = str(media.get("url") or media.get("remote_url") or "")
        name = url.rsplit("/", 1)[-1].split("?")[0] or f"{media.get('type') or 'media'}-{media.get('id')}"
        declared = mimetypes.guess_type(name)[0] or ""
        if media.get("type") == "image" and not declared.startswith("image/"):
            declared = "image/*"
        return Attachment(name, declared, 0, url)

    def file_hosts(self) -> set[str]:
        return ({host_of(self.base), host_of(self.streaming)} | self.media_hosts) - {""}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if content_type.split("/")[0] not in ("image", "video", "audio"):
            raise ChannelError(f"mastodon takes images, video and audio only, not {content_type}")
        if not self.http.session.headers.get("Authorization"):
            self._auth()
        response = self.http.request("POST", f"{self.base}/api/v2/media", data={"description": filename},
                                     files={"file": (filename, data, content_type)})
        media = response.json()
        deadline = time.monotonic() + MEDIA_WAIT_SECS
        while response.status_code == 202 or (response.status_code == 206 and not media.get("url")):
            if time.monotonic() > deadline or self.stopping.wait(0.5):
                raise ChannelError(f"mastodon: {filename} was still processing after {MEDIA_WAIT_SECS:.0f} s")
            response = self.http.request("GET", f"{self.base}/api/v1/media/{media['id']}")
            media = response.json()
        answer = self.http.json("POST", f"{self.base}/api/v1/statuses", headers={"Idempotency-Key": uuid.uuid4().hex},
                                json={"status": f"@{conversation.chat_id}", "media_ids": [str(media["id"])],
                                      "in_reply_to_id": conversation.meta.get("in_reply_to_id") or None,
                                      "visibility": conversation.meta.get("visibility") or "direct"})
        return str(answer.get("id") or "")

    def send(self, conversation: Conversation, text: str) -> str:
        if not self.http.session.headers.get("Authorization"):
            self._auth()
        prefix = f"@{conversation.chat_id} "
        reply_to = conversation.meta.get("in_reply_to_id") or None
        ids = []
        for part in self.reply_texts(text, STATUS_LIMIT - len(prefix)):
            # Each part answers the previous one: a long answer reads as a thread.
            answer = self.http.json("POST", f"{self.base}/api/v1/statuses",
                                    headers={"Idempotency-Key": uuid.uuid4().hex},
                                    json={"status": prefix + part, "in_reply_to_id": reply_to,
                                          "visibility": conversation.meta.get("visibility") or "direct"})
            reply_to = str(answer.get("id") or "")
            ids.append(reply_to)
        return ",".join(ids)

    def test_target(self, override: str = "") -> Conversation:
        if not override:
            raise ChannelError("pass chat_id (an account such as user@instance) to send a test message")
        return Conversation(self.name, override.lstrip("@"), override.lstrip("@"), direct=True)


ADAPTER = MastodonAdapter
