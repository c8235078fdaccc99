"""A fake Mattermost server (API v4, https://api.mattermost.com): `GET /api/v4/users/me`,
`POST /api/v4/posts`, and the WebSocket `/api/v4/websocket` with the
authentication_challenge handshake, `hello`, and `posted` events (post as a JSON
string, channel_type D for direct messages; `mentions`, a JSON string of the mentioned
user ids, when the message @-mentions someone). Posts of the bot come back as events; a
post with `root_id` is a reply in that root post's thread."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from flask import Flask, jsonify, request
from flask_sock import Sock

from fakes.http import FakeServer
from fakes.websocket_hub import Hub

BOT = {"id": "botuserid0000000000000000a", "username": "agentbot"}


class FakeMattermost(FakeServer):
    def __init__(self, token: str) -> None:
        self.token = token
        self.posts: list[dict[str, Any]] = []
        self.seq = itertools.count(1)
        self.ids = itertools.count(1)
        self.hub = Hub()
        self.typing: list[str] = []
        app = Flask("fake-mattermost")
        sock = Sock(app)

        @app.before_request
        def auth():
            if request.path != "/api/v4/websocket" and \
                    request.headers.get("Authorization") != f"Bearer {self.token}":
                return jsonify({"id": "api.context.session_expired.app_error", "status_code": 401,
                                "message": "Invalid or expired session, please login again."}), 401

        @app.get("/api/v4/users/me")
        def me():
            return jsonify(BOT)

        @app.post("/api/v4/posts")
        def create_post():
            body = request.get_json()
            post = self.add_post(BOT["id"], body["channel_id"], body["message"], body.get("root_id", ""),
                                 "O", "@" + BOT["username"])
            return jsonify(post), 201

        @sock.route("/api/v4/websocket")
        def websocket(ws):
            def on_frame(ws, frame):
                if isinstance(frame, dict) and frame.get("action") == "authentication_challenge":
                    ok = frame.get("data", {}).get("token") == self.token
                    ws.send(json.dumps({"status": "OK" if ok else "FAIL", "seq_reply": frame.get("seq")}))
                    if ok:
                        ws.send(json.dumps({"event": "hello", "data": {"server_version": "9.0.0"},
                                            "broadcast": {"user_id": BOT["id"]}, "seq": next(self.seq)}))
                    else:
                        ws.close()
                elif isinstance(frame, dict) and frame.get("action") == "user_typing":
                    self.typing.append(frame["data"]["channel_id"])
            self.hub.serve(ws, on_frame)

        super().__init__(app)

    def add_post(self, user_id: str, channel_id: str, message: str, root_id: str = "",
                 channel_type: str = "O", sender_name: str = "") -> dict[str, Any]:
        post = {"id": f"post{next(self.ids):022d}", "create_at": int(time.time() * 1000), "user_id": user_id,
                "channel_id": channel_id, "root_id": root_id, "message": message, "type": ""}
        self.posts.append(post)
        data = {"channel_type": channel_type, "post": json.dumps(post), "sender_name": sender_name}
        if f"@{BOT['username']}" in message.split():
            data["mentions"] = json.dumps([BOT["id"]])
        self.hub.broadcast({"event": "posted", "data": data,
                            "broadcast": {"channel_id": channel_id}, "seq": next(self.seq)})
        return post

    def user_says(self, user_id: str, username: str, channel_id: str, message: str, direct: bool = False,
                  root_id: str = "") -> str:
        return self.add_post(user_id, channel_id, message, root_id, "D" if direct else "O", "@" + username)["id"]

    def bot_posts(self, channel_id: str) -> list[dict[str, Any]]:
        return [p for p in self.posts if p["channel_id"] == channel_id and p["user_id"] == BOT["id"]]
