"""Mattermost API v4: `posted` events from the WebSocket (`/api/v4/websocket`,
authentication_challenge with the personal access token), replies with
`POST /api/v4/posts` (threaded under the post's root), typing over the socket, reactions
with `POST /api/v4/reactions` (emoji by name) and taken back with
`DELETE /api/v4/users/{user}/posts/{post}/reactions/{name}`."""

from __future__ import annotations

import json
from typing import Any

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.sender import split_text
from agentd.channels.bases.websocket import WebSocketAdapter
from agentd.channels.lifecycle import emoji_name


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
        if post.get("user_id") == self.user_id or not post.get("message") or post.get("type"):
            return  # our own posts and system messages
        direct = event.get("channel_type") == "D"
        user_id = str(post["user_id"])
        conversation = Conversation(self.name, str(post["channel_id"]), user_id, direct=direct,
                                    meta={"root_id": post.get("root_id") or ("" if direct else post.get("id"))})
        sender_name = str(event.get("sender_name") or "").lstrip("@")
        self.ctx.deliver(Inbound(conversation, sender_id=user_id, text=str(post["message"]),
                                 message_id=str(post.get("id", "")), sender_name=sender_name,
                                 sender_aliases=(sender_name,) if sender_name else ()))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        ids = []
        for part in split_text(text, self.max_message_len):
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
