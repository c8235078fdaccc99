"""Bluesky over AT Protocol XRPC: `com.atproto.server.createSession` (identifier + app
password; a new session when the access token expires), polls
`app.bsky.notification.listNotifications` for mentions and replies newer than the
persisted `seen_at` (then `updateSeen`), answers with `com.atproto.repo.createRecord`
(an `app.bsky.feed.post` whose `reply` refs point at the thread root and the post
answered). Posts are limited to 300 characters: longer answers become a thread.

Images: a post's `app.bsky.embed.images` (also the media of `recordWithMedia`) are
fetched from the Bluesky CDN (`cdn_url`, cdn.bsky.app:
`/img/feed_fullsize/plain/{did}/{cid}@{format}`) only; an image goes out with
`com.atproto.repo.uploadBlob` (the bytes, their type in Content-Type; at most 1,000,000
bytes) and a post embedding it (`app.bsky.embed.images`, the file name as alt text). Posts
embed images (and video through a separate video service), never other files."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.polling import PollingAdapter
from agentd.channels.conversation import without_mention


CDN = "https://cdn.bsky.app"
IMAGE_LIMIT = 1_000_000  # app.bsky.embed.images: maxSize of each image blob
CDN_FORMATS = {"image/png": "png", "image/webp": "webp"}  # anything else is served as JPEG


class BlueskyAdapter(PollingAdapter):
    max_message_len = 300
    text_format = "plain"

    def prepare(self) -> None:
        self.base = str(self.settings.get("service_url") or "https://bsky.social").rstrip("/")
        self.identifier = str(self.settings.get("identifier") or "")
        if not self.identifier:
            raise ChannelError("identifier (handle or DID) is not set")
        self.password = self.env("app_password_env")
        self.poll_interval = float(self.settings.get("poll_interval_secs") or 10)
        self.cdn = str(self.settings.get("cdn_url") or CDN).rstrip("/")
        self.did = ""

    def xrpc(self, method: str, nsid: str, **kwargs: Any) -> Any:
        if not self.did:
            self.login()
        try:
            return self.http.json(method, f"{self.base}/xrpc/{nsid}", **kwargs)
        except ChannelError as exc:
            if "ExpiredToken" in str(exc) or "HTTP 401" in str(exc):
                self.did = ""  # log in again on the next call
            raise

    def login(self) -> None:
        session = self.http.json("POST", f"{self.base}/xrpc/com.atproto.server.createSession",
                                 json={"identifier": self.identifier, "password": self.password}, retries=1)
        self.http.session.headers["Authorization"] = f"Bearer {session['accessJwt']}"
        self.did, self.handle = session["did"], session.get("handle", self.identifier)

    def poll_once(self) -> None:
        items = self.xrpc("GET", "app.bsky.notification.listNotifications", params={"limit": 50},
                          retries=0).get("notifications", [])
        newest = max((n["indexedAt"] for n in items), default="")
        seen_at = self.state.get("seen_at")
        if seen_at is not None:
            for note in sorted(items, key=lambda n: n["indexedAt"]):
                if note["indexedAt"] > seen_at and note.get("reason") in ("mention", "reply"):
                    self.save_cursor(seen_at=note["indexedAt"])
                    self._handle(note)
        if newest and newest > (seen_at or ""):
            self.save_cursor(seen_at=newest)
            self.xrpc("POST", "app.bsky.notification.updateSeen", json={"seenAt": newest}, retries=0)
        elif seen_at is None:
            self.save_cursor(seen_at=_now(lag=1.0))  # a second of slack for clocks

    def _handle(self, note: dict[str, Any]) -> None:
        author, record = note.get("author") or {}, note.get("record") or {}
        if author.get("did") == self.did or record.get("$type") != "app.bsky.feed.post":
            return
        text = without_mention(str(record.get("text", "")), rf"(?<!\S)@{re.escape(self.handle)}(?!\S)")
        parent = {"uri": note["uri"], "cid": note["cid"]}
        root = (record.get("reply") or {}).get("root") or parent
        conversation = Conversation(self.name, root["uri"], author["did"], meta={"root": root, "parent": parent})
        self.ctx.deliver(Inbound(conversation, sender_id=author["did"], text=text, message_id=note["uri"],
                                 sender_name=str(author.get("displayName") or author.get("handle") or ""),
                                 sender_aliases=(str(author.get("handle") or ""),),
                                 attachments=self._images(str(author["did"]), record.get("embed") or {})))

    def _images(self, did: str, embed: dict[str, Any]) -> list[Attachment]:
        if embed.get("$type") == "app.bsky.embed.recordWithMedia":
            embed = embed.get("media") or {}
        if embed.get("$type") != "app.bsky.embed.images":
            return []
        found = []
        for index, item in enumerate(embed.get("images") or [], 1):
            blob = (item or {}).get("image") or {}
            cid = str((blob.get("ref") or {}).get("$link") or blob.get("cid") or "")
            if not cid:
                continue
            fmt = CDN_FORMATS.get(str(blob.get("mimeType") or ""), "jpeg")
            found.append(Attachment(f"image-{index}-{cid[-8:]}.{'jpg' if fmt == 'jpeg' else fmt}", f"image/{fmt}",
                                    int(blob.get("size") or 0), f"{self.cdn}/img/feed_fullsize/plain/{did}/{cid}@{fmt}"))
        return found

    def file_hosts(self) -> set[str]:
        if not hasattr(self, "cdn"):
            self.prepare()
        return {host_of(self.cdn), host_of(self.base)}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        if not content_type.startswith("image/"):
            raise ChannelError(f"bluesky posts embed images only, not {content_type}")
        if len(data) > IMAGE_LIMIT:
            raise ChannelError(f"bluesky takes images up to {IMAGE_LIMIT} bytes; {filename} is {len(data)}")
        blob = self.xrpc("POST", "com.atproto.repo.uploadBlob", data=data,
                         headers={"Content-Type": content_type})["blob"]
        record: dict[str, Any] = {"$type": "app.bsky.feed.post", "text": "", "createdAt": _now(),
                                  "embed": {"$type": "app.bsky.embed.images",
                                            "images": [{"alt": filename, "image": blob}]}}
        root, parent = conversation.meta.get("root"), conversation.meta.get("parent")
        if root and parent:
            record["reply"] = {"root": root, "parent": parent}
        made = self.xrpc("POST", "com.atproto.repo.createRecord",
                         json={"repo": self.did, "collection": "app.bsky.feed.post", "record": record})
        return str(made["uri"])

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        root, parent, uris = conversation.meta.get("root"), conversation.meta.get("parent"), []
        for part in self.reply_texts(text):
            record: dict[str, Any] = {"$type": "app.bsky.feed.post", "text": part, "createdAt": _now()}
            if root and parent:
                record["reply"] = {"root": root, "parent": parent}
            made = self.xrpc("POST", "com.atproto.repo.createRecord",
                             json={"repo": self.did, "collection": "app.bsky.feed.post", "record": record})
            parent = {"uri": made["uri"], "cid": made["cid"]}  # the next part continues the thread
            root = root or parent
            uris.append(made["uri"])
        return ",".join(uris)

    def test_target(self, override: str = "") -> Conversation:
        return Conversation(self.name, override or "timeline")  # a top-level post


def _now(lag: float = 0.0) -> str:
    return (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=lag)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


ADAPTER = BlueskyAdapter
