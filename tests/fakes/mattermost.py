"""A fake Mattermost server (API v4, https://api.mattermost.com): `GET /api/v4/users/me`,
`POST /api/v4/posts`, and the WebSocket `/api/v4/websocket` with the
authentication_challenge handshake, `hello`, and `posted` events (post as a JSON
string, channel_type D for direct messages). Posts of the bot come back as events.
Reactions: `POST /api/v4/reactions` ({user_id, post_id, emoji_name}; 400 for a user that
is not the caller or an empty name) and `DELETE /api/v4/users/{u}/posts/{p}/reactions/{name}`,
kept in `reactions` (post id -> names)."""

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
        self.reactions: dict[str, list[str]] = {}
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

        @app.post("/api/v4/reactions")
        def save_reaction():
            body = request.get_json()
            if body.get("user_id") != BOT["id"] or not body.get("emoji_name") or not body.get("post_id"):
                return jsonify({"id": "api.reaction.save_reaction.invalid.app_error", "status_code": 400,
                                "message": "Invalid reaction."}), 400
            mine = self.reactions.setdefault(body["post_id"], [])
            if body["emoji_name"] not in mine:
                mine.append(body["emoji_name"])
            return jsonify({**body, "create_at": int(time.time() * 1000)})

        @app.delete("/api/v4/users/<user>/posts/<post>/reactions/<name>")
        def delete_reaction(user: str, post: str, name: str):
            if name in self.reactions.get(post, []):
                self.reactions[post].remove(name)
            return jsonify({"status": "OK"})

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
        self.hub.broadcast({"event": "posted", "data": {"channel_type": channel_type, "post": json.dumps(post),
                                                       "sender_name": sender_name},
                            "broadcast": {"channel_id": channel_id}, "seq": next(self.seq)})
        return post

    def user_says(self, user_id: str, username: str, channel_id: str, message: str, direct: bool = False) -> str:
        return self.add_post(user_id, channel_id, message, "", "D" if direct else "O", "@" + username)["id"]

    def bot_posts(self, channel_id: str) -> list[dict[str, Any]]:
        return [p for p in self.posts if p["channel_id"] == channel_id and p["user_id"] == BOT["id"]]
