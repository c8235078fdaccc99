"""A fake Rocket.Chat server (https://developer.rocket.chat/apidocs): `X-Auth-Token` +
`X-User-Id`, `GET /api/v1/me`, `channels.list.joined`, `im.list`, `channels.history` /
`im.history` (roomId, oldest, count; newest first), `POST /api/v1/chat.postMessage`
{roomId | channel, text, tmid}; 429 with Retry-After like its rate limiter;
`POST /api/v1/chat.react` {messageId, emoji ":name:", shouldReact}, the bot's reactions
kept in `reactions` (message id -> ":name:").
Files: a message carries `file`, `files` and `attachments` (`title`, `title_link`
`/file-upload/{id}/{name}`, `image_type`/`image_size` for images, `type: file`), served at
`GET /file-upload/{id}/{name}` to the same auth headers (`downloads`). The bot uploads with
`POST /api/v1/rooms.media/{rid}` (multipart, one part named `file`), answered
`{file: {_id, url}}`, then `POST /api/v1/rooms.mediaConfirm/{rid}/{fileId}` ({msg, tmid,
description}) posts the message; `uploads` lists what was confirmed. `GET /api/v1/rooms.info`
(roomName) and `POST /api/v1/im.create` {username} give a room's id."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any
from urllib.parse import quote

from flask import jsonify, request

from fakes.platform import FakePlatform

BOT_ID, BOT = "botuserid", "agentbot"
ROOMS = {"GENERALROOM": ("c", "general"), "DMANNROOM": ("d", "ann"), "DMMALLORYROOM": ("d", "mallory")}


def stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class FakeRocketChat(FakePlatform):
    def __init__(self, token: str) -> None:
        super().__init__("rocketchat")
        self.messages: list[dict[str, Any]] = []
        self.reactions: dict[str, list[str]] = {}
        self.files: dict[str, dict[str, Any]] = {}  # file id -> {_id, name, type, size, rid, data}
        self.pending: dict[str, dict[str, Any]] = {}  # uploaded by rooms.media, not yet confirmed
        self.uploads: list[dict[str, Any]] = []
        self.downloads: list[str] = []
        app = self.app

        @app.before_request
        def auth():
            if request.headers.get("X-Auth-Token") != token or request.headers.get("X-User-Id") != BOT_ID:
                return jsonify({"status": "error", "message": "You must be logged in to do this."}), 401

        @app.get("/api/v1/me")
        def me():
            return jsonify({"_id": BOT_ID, "username": BOT, "name": "Agent Bot", "success": True})

        @app.get("/api/v1/channels.list.joined")
        def joined():
            self.polled()
            return jsonify({"channels": [{"_id": r, "name": n, "t": "c"} for r, (t, n) in ROOMS.items() if t == "c"],
                            "count": 1, "offset": 0, "total": 1, "success": True})

        @app.get("/api/v1/im.list")
        def ims():
            return jsonify({"ims": [{"_id": r, "t": "d", "usernames": [BOT, n]} for r, (t, n) in ROOMS.items()
                                    if t == "d"], "success": True})

        def history():
            room, oldest = request.args["roomId"], request.args.get("oldest", "")
            found = [m for m in self.messages if m["rid"] == room and m["ts"] > oldest]
            return jsonify({"messages": sorted(found, key=lambda m: m["ts"], reverse=True)[:int(request.args.get(
                "count", 20))], "success": True})

        app.add_url_rule("/api/v1/channels.history", "channels_history", history)
        app.add_url_rule("/api/v1/im.history", "im_history", history)

        @app.post("/api/v1/chat.react")
        def react():
            body = request.get_json()
            emoji = str(body.get("emoji") or "")
            if not any(m["_id"] == body.get("messageId") for m in self.messages):
                return jsonify({"success": False, "error": "No message found with the id of \"%s\"."
                                % body.get("messageId")}), 400
            if not re.fullmatch(r":[a-z0-9_+-]+:", emoji):
                return jsonify({"success": False, "error": "Invalid emoji provided. [error-not-allowed]"}), 400
            mine = self.reactions.setdefault(body["messageId"], [])
            if body.get("shouldReact", emoji not in mine) and emoji not in mine:
                mine.append(emoji)
            elif not body.get("shouldReact", emoji not in mine) and emoji in mine:
                mine.remove(emoji)
            return jsonify({"success": True})

        @app.post("/api/v1/rooms.media/<rid>")
        def media(rid: str):
            if rid not in ROOMS:
                return jsonify({"success": False, "error": "error-room-not-found"}), 400
            if list(request.files) != ["file"] or len(request.files.getlist("file")) != 1:
                return jsonify({"success": False, "error": "[invalid-field]", "errorType": "invalid-field"}), 400
            part = request.files["file"]
            info = self.host(rid, part.read(), part.filename or "file", part.mimetype)
            self.pending[info["_id"]] = info
            return jsonify({"file": {"_id": info["_id"], "url": info["url"]}, "success": True})

        @app.post("/api/v1/rooms.mediaConfirm/<rid>/<file_id>")
        def media_confirm(rid: str, file_id: str):
            info = self.pending.get(file_id)
            if info is None or info["rid"] != rid:
                return jsonify({"success": False, "error": "error-file-not-found"}), 400
            del self.pending[file_id]
            body = request.get_json(silent=True) or {}
            message = self._add(rid, BOT_ID, BOT, str(body.get("msg") or ""), tmid=body.get("tmid"),
                                **file_fields(info))
            self.uploads.append({"rid": rid, "filename": info["name"], "content_type": info["type"],
                                 "data": info["data"], "tmid": body.get("tmid"), "message": message["_id"]})
            self.record(**message)
            return jsonify({"message": message, "success": True})

        @app.get("/api/v1/rooms.info")
        def room_info():
            name = request.args.get("roomName")
            room = next((r for r, (t, n) in ROOMS.items() if t == "c" and (n == name or r == request.args.get(
                "roomId"))), None)
            if room is None:
                return jsonify({"success": False, "error": "The required \"roomId\" or \"roomName\" param "
                                "provided does not match any channel [error-room-not-found]"}), 400
            return jsonify({"room": {"_id": room, "name": ROOMS[room][1], "t": "c"}, "success": True})

        @app.post("/api/v1/im.create")
        def im_create():
            user = (request.get_json(silent=True) or {}).get("username")
            room = next((r for r, (t, n) in ROOMS.items() if t == "d" and n == user), None)
            if room is None:
                return jsonify({"success": False, "error": "Failed to create direct room"}), 400
            return jsonify({"room": {"_id": room, "rid": room, "t": "d", "usernames": [BOT, user]}, "success": True})

        @app.get("/file-upload/<file_id>/<name>")
        def download(file_id: str, name: str):
            self.downloads.append(file_id)
            info = self.files.get(file_id)
            if info is None or file_id in self.pending:
                return jsonify({"success": False, "error": "File not found"}), 404
            return info["data"], 200, {"Content-Type": info["type"] or "application/octet-stream"}

        @app.post("/api/v1/chat.postMessage")
        def post():
            limited = self.throttled({"success": False, "error": "Error, too many requests. Please slow down. "
                                      "[error-too-many-requests]"})
            if limited is not None:
                return limited
            body = request.get_json()
            room = body.get("roomId") or next((r for r, (t, n) in ROOMS.items() if "#" + n == body.get("channel")),
                                              None)
            if room is None or not body.get("text"):
                return jsonify({"success": False, "error": "room not found"}), 400
            message = self._add(room, BOT_ID, BOT, body["text"], tmid=body.get("tmid"))
            self.record(**message)
            return jsonify({"ts": 0, "channel": room, "message": message, "success": True})

    def _add(self, room: str, user_id: str, username: str, text: str, **extra: Any) -> dict[str, Any]:
        mentions = [{"_id": BOT_ID, "username": BOT}] if f"@{BOT}" in text else []
        message = {"_id": f"m{self.new_id()}", "rid": room, "msg": text, "ts": stamp(),
                   "u": {"_id": f"id-{username}", "username": username, "name": username.title()},
                   "mentions": mentions, "_updatedAt": stamp(), **{k: v for k, v in extra.items() if v}}
        with self.lock:
            self.messages.append(message)
        return message

    def host(self, rid: str, data: bytes, name: str, mime: str) -> dict[str, Any]:
        file_id = f"f{self.new_id()}"
        self.files[file_id] = {"_id": file_id, "name": name, "type": mime, "size": len(data), "rid": rid,
                               "data": data, "url": f"/file-upload/{file_id}/{quote(name)}"}
        return self.files[file_id]

    def user_sends_file(self, user: str, data: bytes, name: str, mime: str, text: str = "", room: str = "",
                        url: str = "") -> str:
        """A message with a file (its link replaced by `url` when given); returns the room id."""
        room = room or f"DM{user.upper()}ROOM"
        fields = file_fields(self.host(room, data, name, mime))
        if url:
            fields["attachments"][0]["title_link"] = url
        self._add(room, f"id-{user}", user, text, **fields)
        return room

    def user_says(self, user: str, text: str, room: str = "", tmid: str = "") -> str:
        """In the user's direct room unless `room` is given (in the thread of message `tmid`
        when given); returns the room id."""
        room = room or f"DM{user.upper()}ROOM"
        self._add(room, f"id-{user}", user, text, tmid=tmid)
        return room

    def replies(self, room: str) -> list[str]:
        return [m["msg"] for m in self.sent if m["rid"] == room]


def file_fields(info: dict[str, Any]) -> dict[str, Any]:
    """What a message with one file carries, as Rocket.Chat writes it."""
    short = {k: info[k] for k in ("_id", "name", "type", "size")}
    attachment: dict[str, Any] = {"title": info["name"], "title_link": info["url"], "title_link_download": True,
                                  "type": "file"}
    if info["type"].startswith("image/"):
        attachment.update(image_url=info["url"], image_type=info["type"], image_size=info["size"])
    else:
        attachment.update(format=info["name"].rpartition(".")[2].upper(), size=info["size"])
    return {"file": short, "files": [short], "attachments": [attachment]}
