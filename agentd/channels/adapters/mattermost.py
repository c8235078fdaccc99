"""Mattermost API v4: `posted` events from the WebSocket (`/api/v4/websocket`,
authentication_challenge with the personal access token), replies with
`POST /api/v4/posts` (threaded under the post's root), typing over the socket, reactions
with `POST /api/v4/reactions` (emoji by name) and taken back with
`DELETE /api/v4/users/{user}/posts/{post}/reactions/{name}`.

A thread (a post's `root_id`) is a conversation of its own; a channel post starts a thread
under it unless `overrides.threading` is false. The bot counts as mentioned when the event's
`mentions` names it or the text has `@<bot username>` (removed from the text).

Files: a post's `metadata.files` are fetched with `GET /api/v4/files/{id}` from the
configured server only (with the token); files go out with `POST /api/v4/files`
(multipart, `channel_id` and `files`) and a post carrying the new `file_ids`."""

from __future__ import annotations

import json
from typing import Any

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.websocket import WebSocketAdapter
from agentd.channels.lifecycle import emoji_name
from agentd.channels.conversation import reply_thread


class MattermostAdapter(WebSocketAdapter):
    max_message_len = 16_383

    def prepare(self) -> None:
        self.base = str(self.settings.get("server_url") or "").rstrip("/")
        if not self.base:
            raise ChannelError("server_url is not set")
        self.token = self.env("token_env")
        self.http.session.headers["Authorization"] = f"Bearer {self.token}"
        me = self.http.json("GET", f"{self.base}/api/v4/users/me", retries=1)
        self.user_id, self.username = me["id"], me.get("username", "")
        self.seq = 0

    def ws_url(self) -> str:
        return self.base.replace("http", "ws", 1) + "/api/v4/websocket"

    def ws_headers(self) -> list[str]:
        return [f"Authorization: Bearer {self.token}"]

    def on_open(self) -> None:
        self.seq += 1
        self.ws_send({"seq": self.seq, "action": "authentication_challenge", "data": {"token": self.token}})

    def on_message(self, data: Any) -> None:
        if not isinstance(data, dict) or data.get("event") != "posted":
            return
        event = data.get("data") or {}
        try:
            post = json.loads(event.get("post") or "{}")
        except ValueError:
            return
        files = [Attachment(str(f.get("name") or f.get("id")), str(f.get("mime_type") or ""), int(f.get("size") or 0),
                            f"{self.base}/api/v4/files/{f['id']}", headers={"Authorization": f"Bearer {self.token}"})
                 for f in (post.get("metadata") or {}).get("files") or [] if isinstance(f, dict) and f.get("id")]
        if post.get("user_id") == self.user_id or not (post.get("message") or files) or post.get("type"):
            return  # our own posts and system messages
        direct = event.get("channel_type") == "D"
        user_id = str(post["user_id"])
        thread = reply_thread(self.settings, str(post.get("root_id") or ""), str(post.get("id") or ""),
                              direct, default=True)
        try:
            mentions = json.loads(event.get("mentions") or "[]")
        except ValueError:
            mentions = []
        text, handle = str(post["message"]), f"@{self.username}"
        mentioned = self.user_id in (mentions if isinstance(mentions, list) else []) or handle in text.split()
        if self.username:
            text = " ".join(w for w in text.split(" ") if w != handle).strip() or text
        conversation = Conversation(self.name, str(post["channel_id"]), user_id, direct=direct,
                                    meta={"root_id": thread}, thread_id=thread)
        sender_name = str(event.get("sender_name") or "").lstrip("@")
        self.ctx.deliver(Inbound(conversation, sender_id=user_id, text=text,
                                 message_id=str(post.get("id", "")), sender_name=sender_name,
                                 sender_aliases=(sender_name,) if sender_name else (), mentioned=mentioned, attachments=files))

    def file_hosts(self) -> set[str]:
        return {host_of(str(self.settings.get("server_url") or ""))}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        uploaded = self.http.json("POST", f"{self.base}/api/v4/files", data={"channel_id": conversation.chat_id},
                                  files={"files": (filename, data, content_type)})
        body = {"channel_id": conversation.chat_id, "message": "",
                "file_ids": [info["id"] for info in uploaded.get("file_infos") or []]}
        if conversation.meta.get("root_id"):
            body["root_id"] = conversation.meta["root_id"]
        return str(self.http.json("POST", f"{self.base}/api/v4/posts", json=body).get("id", ""))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        ids = []
        for part in self.reply_texts(text):
            body = {"channel_id": conversation.chat_id, "message": part}
            if conversation.meta.get("root_id"):
                body["root_id"] = conversation.meta["root_id"]
            ids.append(str(self.http.json("POST", f"{self.base}/api/v4/posts", json=body).get("id", "")))
        return ",".join(ids)

    def send_typing(self, conversation: Conversation) -> None:
        self.seq += 1
        self.ws_send({"seq": self.seq, "action": "user_typing", "data": {"channel_id": conversation.chat_id}})

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.http.request("POST", f"{self.base}/api/v4/reactions", retries=0, json={
            "user_id": self.user_id, "post_id": message_id, "emoji_name": emoji_name(emoji)})

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.http.request("DELETE", f"{self.base}/api/v4/users/{self.user_id}/posts/{message_id}/reactions/"
                          f"{emoji_name(emoji)}", retries=0)

    def test_target(self, override: str = "") -> Conversation:
        target = override or str(self.settings.get("default_channel_id") or "") or next(
            iter(self.settings.get("allowed_channels") or []), "")
        if not target:
            raise ChannelError("no test target: set default_channel_id or pass channel_id")
        return Conversation(self.name, target)


ADAPTER = MattermostAdapter
