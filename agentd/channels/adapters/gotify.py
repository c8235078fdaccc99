"""Gotify: inbound messages from the client WebSocket `/stream` (client token),
replies with `POST /message` (application token). The sender of a Gotify message is
the application that posted it, so `allowed_users` holds application ids."""

from __future__ import annotations

import collections
from typing import Any

from agentd.channels.adapter import Conversation, Inbound
from agentd.channels.bases.websocket import WebSocketAdapter


class GotifyAdapter(WebSocketAdapter):
    max_message_len = 10_000
    text_format = "plain"

    def prepare(self) -> None:
        self.base = str(self.settings.get("server_url") or "").rstrip("/")
        self.client_token = self.env("client_token_env")
        self.app_token = self.env("app_token_env")
        self.own_ids: collections.deque[str] = collections.deque(maxlen=200)
        # Our replies come back on the stream: learn our application's id (GET /application
        # lists the client's applications with their tokens) to recognise them even when
        # the echo arrives before the POST has answered.
        apps = self.http.json("GET", f"{self.base}/application", headers={"X-Gotify-Key": self.client_token},
                              retries=1)
        self.app_id = next((str(a.get("id")) for a in apps if a.get("token") == self.app_token), "")

    def ws_url(self) -> str:
        return self.base.replace("http", "ws", 1) + "/stream"

    def ws_headers(self) -> list[str]:
        return [f"X-Gotify-Key: {self.client_token}"]

    def on_message(self, data: Any) -> None:
        if not isinstance(data, dict) or "message" not in data:
            return
        message_id = str(data.get("id", ""))
        if message_id in self.own_ids or (self.app_id and str(data.get("appid")) == self.app_id):
            return
        app = str(data.get("appid", ""))
        conversation = Conversation(self.name, f"app-{app}", app)
        self.ctx.deliver(Inbound(conversation, sender_id=app, text=str(data["message"]),
                                 message_id=message_id, sender_name=str(data.get("title") or app)))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        ids = []
        for part in self.reply_texts(text):
            answer = self.http.json("POST", f"{self.base}/message", headers={"X-Gotify-Key": self.app_token},
                                    json={"title": conversation.meta.get("agent") or "agentd",
                                          "message": part, "priority": 5})
            message_id = str(answer.get("id", ""))
            self.own_ids.append(message_id)
            ids.append(message_id)
        return ",".join(ids)

    def test_target(self, override: str = "") -> Conversation:
        return Conversation(self.name, override or "gotify")


ADAPTER = GotifyAdapter
