"""Twist API v3 (Bearer token): polls the threads updated since the persisted timestamp
in the workspace's channels (`threads/get?newer_than_ts=`), reads their new comments
(`comments/get`), and answers comments that mention the bot
(`[Name](twist-mention://<id>)`) with `POST comments/add` {thread_id, content}.

Files: a comment's `attachments` (`file_name`, `underlying_type`, `file_size`, `url`) are
fetched from Twist's file host (files.twist.com, or the host of `api_url`) only, with the
token; files go out with `POST attachments/upload` (multipart `file` with `file_name`,
`file_size`, `underlying_type` and a new `attachment_id`), then a comment carrying the
attachment the upload answered.

Reactions (`lifecycle_reactions`): `POST reactions/add` / `reactions/remove` {comment_id, emoji}
on the comment that asked."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.polling import PollingAdapter
from agentd.channels.conversation import without_mention


FILE_HOSTS = {"files.twist.com"}


class TwistAdapter(PollingAdapter):
    max_message_len = 10_000

    def prepare(self) -> None:
        self.base = str(self.settings.get("api_url") or "https://api.twist.com").rstrip("/") + "/api/v3"
        self.workspace = str(self.settings.get("workspace_id") or "")
        if not self.workspace:
            raise ChannelError("workspace_id is not set")
        self.http.session.headers["Authorization"] = f"Bearer {self.env('token_env')}"
        self.poll_interval = float(self.settings.get("poll_interval_secs") or 5)
        self.me = 0

    def poll_once(self) -> None:
        if not self.me:
            self.me = int(self.http.json("GET", f"{self.base}/users/get_session_user", retries=0)["id"])
            self.mention = re.compile(rf"\[[^\]]*\]\(twist-mention://{self.me}\)")
        since = self.state.get("since")
        if since is None:  # first start: only what happens from now on
            self.save_cursor(since=int(time.time()))
            return
        channels = self.http.json("GET", f"{self.base}/channels/get", params={"workspace_id": self.workspace},
                                  retries=0)
        # Timestamps are whole seconds: look one second back and skip comments already seen.
        seen, newest = list(self.state.get("seen") or []), since
        since -= 1
        for channel in channels:
            threads = self.http.json("GET", f"{self.base}/threads/get",
                                     params={"channel_id": channel["id"], "newer_than_ts": since}, retries=0)
            for thread in threads:
                comments = self.http.json("GET", f"{self.base}/comments/get",
                                          params={"thread_id": thread["id"], "newer_than_ts": since}, retries=0)
                for comment in sorted(comments, key=lambda c: c["posted_ts"]):
                    if comment["posted_ts"] > since and comment["id"] not in seen:
                        newest = max(newest, comment["posted_ts"])
                        seen = (seen + [comment["id"]])[-300:]
                        self.save_cursor(since=newest, seen=seen)
                        self._handle(comment, str(channel.get("name") or channel["id"]))

    def _handle(self, comment: dict[str, Any], channel: str) -> None:
        # The chat is the channel's name: `allowed_channels` lists names (the runtime checks them).
        text = str(comment.get("content") or "")
        if comment.get("creator") == self.me:
            return
        user = str(comment["creator"])
        conversation = Conversation(self.name, channel, user,
                                    meta={"thread_id": comment["thread_id"]})
        auth = {"Authorization": str(self.http.session.headers.get("Authorization") or "")}
        files = [Attachment(str(a.get("file_name") or a.get("title") or "file"), str(a.get("underlying_type") or ""),
                            int(a.get("file_size") or 0), str(a["url"]), headers=auth)
                 for a in comment.get("attachments") or [] if isinstance(a, dict) and a.get("url")]
        self.ctx.deliver(Inbound(conversation, sender_id=user, text=without_mention(text, self.mention.pattern),
                                 message_id=str(comment["id"]), sender_name=str(comment.get("creator_name") or ""),
                                 sender_aliases=(str(comment.get("creator_name") or ""),), attachments=files,
                                 addressed=bool(self.mention.search(text))))

    def file_hosts(self) -> set[str]:
        api = str(self.settings.get("api_url") or "")
        return FILE_HOSTS | ({host_of(api)} if api else set())

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        thread = conversation.meta.get("thread_id")
        if not thread:
            raise ChannelError("twist files go to a thread: pass chat_id as the thread id")
        attachment = self.http.json("POST", f"{self.base}/attachments/upload",
                                    data={"attachment_id": str(uuid.uuid4()), "file_name": filename,
                                          "file_size": str(len(data)), "underlying_type": content_type},
                                    files={"file": (filename, data, content_type)})
        made = self.http.json("POST", f"{self.base}/comments/add",
                              json={"thread_id": int(thread), "content": filename, "attachments": [attachment]})
        return str(made.get("id", ""))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        thread = conversation.meta.get("thread_id")
        if not thread:
            raise ChannelError("twist replies go to a thread: pass chat_id as the thread id")
        ids = []
        for part in self.reply_texts(text):
            made = self.http.json("POST", f"{self.base}/comments/add", json={"thread_id": int(thread), "content": part})
            ids.append(str(made.get("id", "")))
        return ",".join(ids)

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self._reaction("add", message_id, emoji)

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self._reaction("remove", message_id, emoji)

    def _reaction(self, verb: str, comment: str, emoji: str) -> None:
        if not hasattr(self, "base"):
            self.prepare()
        if not comment.isdigit():
            raise ChannelError(f"twist: not a comment id: {comment[:40]!r}")
        self.http.request("POST", f"{self.base}/reactions/{verb}", json={"comment_id": int(comment), "emoji": emoji},
                          retries=0)

    def test_target(self, override: str = "") -> Conversation:
        if not override.isdigit():
            raise ChannelError("no test target: pass chat_id (a thread id)")
        return Conversation(self.name, override, meta={"thread_id": override})


ADAPTER = TwistAdapter
