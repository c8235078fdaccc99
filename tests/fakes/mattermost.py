"""A fake Mattermost server (API v4, https://api.mattermost.com): `GET /api/v4/users/me`,
`POST /api/v4/posts`, and the WebSocket `/api/v4/websocket` with the
authentication_challenge handshake, `hello`, and `posted` events (post as a JSON
string, channel_type D for direct messages; `mentions`, a JSON string of the mentioned
user ids, when the message @-mentions someone). Posts of the bot come back as events; a
post with `root_id` is a reply in that root post's thread.
Files: `POST /api/v4/files` (multipart: channel_id, files) answers `file_infos`, a post
names them in `file_ids` (and `metadata.files`); `GET /api/v4/files/{id}` serves the bytes.
Interactive message buttons: a post's `props.attachments[].actions[]` (ids of letters and
digits only, as Mattermost's action route takes; `integration.url` required), stripped of
their `integration` in what clients (the WebSocket) see; `press()` POSTs a press to the
action's integration URL as the server does (user_id, user_name, channel_id, team_id,
post_id, trigger_id, type, context) and applies the answer: `update` replaces the post's
message (and its props when given), `ephemeral_text` goes to the presser alone.
`PUT /api/v4/posts/{id}/patch` edits a post (message, props replaced when given).
Reactions: `POST /api/v4/reactions` ({user_id, post_id, emoji_name}; 400 for a user that
is not the caller or an empty name) and `DELETE /api/v4/users/{u}/posts/{p}/reactions/{name}`,
kept in `reactions` (post id -> names)."""

from __future__ import annotations

import copy
import itertools
import json
import re
import time
from typing import Any

import requests
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
        self.files: dict[str, dict[str, Any]] = {}  # id -> FileInfo + data
        self.downloads: list[str] = []
        self.ephemeral: list[dict[str, str]] = []  # {user_id, channel_id, message} shown to one user
        self.patches: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []  # what the WebSocket carried to clients
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
            unknown = [f for f in body.get("file_ids") or [] if f not in self.files]
            if unknown or not (body.get("message") or body.get("file_ids")):
                return jsonify({"id": "api.post.create_post.invalid", "status_code": 400,
                                "message": "Invalid post"}), 400
            props = body.get("props") or {}
            if not valid_actions(props):
                return jsonify({"id": "model.post.is_valid.props.app_error", "status_code": 400,
                                "message": "Invalid props"}), 400
            post = self.add_post(BOT["id"], body["channel_id"], body["message"], body.get("root_id", ""),
                                 "O", "@" + BOT["username"], file_ids=body.get("file_ids") or [], props=props)
            return jsonify(stripped(post)), 201

        @app.put("/api/v4/posts/<post_id>/patch")
        def patch_post(post_id: str):
            post = next((p for p in self.posts if p["id"] == post_id), None)
            if post is None:
                return jsonify({"id": "app.post.get.app_error", "status_code": 404,
                                "message": "Unable to get the post."}), 404
            if post["user_id"] != BOT["id"]:
                return jsonify({"id": "api.context.permissions.app_error", "status_code": 403,
                                "message": "You do not have the appropriate permissions."}), 403
            body = request.get_json()
            if "props" in body and not valid_actions(body["props"] or {}):
                return jsonify({"id": "model.post.is_valid.props.app_error", "status_code": 400,
                                "message": "Invalid props"}), 400
            self.patches.append({"id": post_id, **body})
            if body.get("message") is not None:
                post["message"] = body["message"]
            if body.get("props") is not None:
                post["props"] = body["props"]
            return jsonify(stripped(post))

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

        @app.post("/api/v4/files")
        def upload_files():
            channel = request.form.get("channel_id") or request.args.get("channel_id")
            parts = request.files.getlist("files")
            if not channel or not parts:
                return jsonify({"id": "api.file.upload_file.incorrect_number_of_files.app_error",
                                "status_code": 400, "message": "Unable to upload files."}), 400
            infos = [self.host_file(part.read(), part.filename or "file", part.mimetype, channel) for part in parts]
            return jsonify({"file_infos": [{k: v for k, v in i.items() if k != "data"} for i in infos],
                            "client_ids": []}), 201

        @app.get("/api/v4/files/<file_id>")
        def get_file(file_id: str):
            self.downloads.append(file_id)
            if file_id not in self.files:
                return jsonify({"id": "app.file_info.get.app_error", "status_code": 404,
                                "message": "Unable to get the file info."}), 404
            return self.files[file_id]["data"], 200, {"Content-Type": self.files[file_id]["mime_type"]}

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

    def host_file(self, data: bytes, name: str, mime_type: str, channel_id: str) -> dict[str, Any]:
        file_id = f"file{next(self.ids):022d}"
        self.files[file_id] = {"id": file_id, "name": name, "extension": name.rpartition(".")[2], "size": len(data),
                               "mime_type": mime_type, "channel_id": channel_id, "data": data}
        return self.files[file_id]

    def add_post(self, user_id: str, channel_id: str, message: str, root_id: str = "",
                 channel_type: str = "O", sender_name: str = "", file_ids: list[str] = (),
                 props: dict[str, Any] | None = None) -> dict[str, Any]:
        post = {"id": f"post{next(self.ids):022d}", "create_at": int(time.time() * 1000), "user_id": user_id,
                "channel_id": channel_id, "root_id": root_id, "message": message, "type": "",
                "props": props or {}}
        if file_ids:
            post["file_ids"] = list(file_ids)
            post["metadata"] = {"files": [{k: v for k, v in self.files[f].items() if k != "data"} for f in file_ids]}
        self.posts.append(post)
        data = {"channel_type": channel_type, "post": json.dumps(stripped(post)), "sender_name": sender_name}
        if f"@{BOT['username']}" in message.split():
            data["mentions"] = json.dumps([BOT["id"]])
        event = {"event": "posted", "data": data, "broadcast": {"channel_id": channel_id}, "seq": next(self.seq)}
        self.events.append(event)
        self.hub.broadcast(event)
        return post

    def press(self, post_id: str, action_id: str, user_id: str, username: str,
              context: dict[str, Any] | None = None) -> requests.Response:
        """`user_id` presses button `action_id` of post `post_id`: the server POSTs to the
        action's integration (`context` replaces the stored one: a forged press) and applies
        the answer."""
        post = next(p for p in self.posts if p["id"] == post_id)
        action = next(a for att in post["props"].get("attachments") or [] for a in att.get("actions") or []
                      if a.get("id") == action_id)
        integration = action["integration"]
        body = {"user_id": user_id, "user_name": username, "channel_id": post["channel_id"],
                "channel_name": "town-square", "team_id": "team00000000000000000000000", "team_domain": "agents",
                "post_id": post_id, "trigger_id": f"trigger{next(self.ids)}", "type": "button", "data_source": "",
                "context": copy.deepcopy(integration.get("context") if context is None else context)}
        answer = requests.post(integration["url"], json=body, timeout=30)
        if answer.status_code == 200:
            reply = answer.json()
            update = reply.get("update")
            if update:
                if update.get("message") is not None:
                    post["message"] = update["message"]
                if update.get("props") is not None:
                    post["props"] = update["props"]
            if reply.get("ephemeral_text"):
                self.ephemeral.append({"user_id": user_id, "channel_id": post["channel_id"],
                                       "message": reply["ephemeral_text"]})
        return answer

    def user_says(self, user_id: str, username: str, channel_id: str, message: str, direct: bool = False,
                  root_id: str = "") -> str:
        return self.add_post(user_id, channel_id, message, root_id, "D" if direct else "O", "@" + username)["id"]

    def user_sends_file(self, user_id: str, username: str, channel_id: str, data: bytes, name: str,
                        mime_type: str, message: str = "", direct: bool = True) -> str:
        info = self.host_file(data, name, mime_type, channel_id)
        return self.add_post(user_id, channel_id, message, "", "D" if direct else "O", "@" + username,
                             file_ids=[info["id"]])["id"]

    def bot_posts(self, channel_id: str) -> list[dict[str, Any]]:
        return [p for p in self.posts if p["channel_id"] == channel_id and p["user_id"] == BOT["id"]]


def valid_actions(props: dict[str, Any]) -> bool:
    """Buttons as Mattermost takes them: an id of letters and digits, a name, an integration URL."""
    for attachment in props.get("attachments") or []:
        for action in attachment.get("actions") or []:
            if not re.fullmatch(r"[A-Za-z0-9]+", str(action.get("id") or "")) or not action.get("name") \
                    or not (action.get("integration") or {}).get("url"):
                return False
    return True


def stripped(post: dict[str, Any]) -> dict[str, Any]:
    """A post as clients see it: buttons without their integration (URL and context)."""
    shown = copy.deepcopy(post)
    for attachment in shown.get("props", {}).get("attachments") or []:
        for action in attachment.get("actions") or []:
            action.pop("integration", None)
    return shown
