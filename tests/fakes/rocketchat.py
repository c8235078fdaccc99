"""A fake Rocket.Chat server (https://developer.rocket.chat/apidocs): `X-Auth-Token` +
`X-User-Id`, `GET /api/v1/me`, `channels.list.joined`, `im.list`, `channels.history` /
`im.history` (roomId, oldest, count; newest first), `POST /api/v1/chat.postMessage`
{roomId | channel, text, tmid}; 429 with Retry-After like its rate limiter;
`POST /api/v1/chat.react` {messageId, emoji ":name:", shouldReact}, the bot's reactions
kept in `reactions` (message id -> ":name:")."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

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

    def user_says(self, user: str, text: str, room: str = "", tmid: str = "") -> str:
        """In the user's direct room unless `room` is given (in the thread of message `tmid`
        when given); returns the room id."""
        room = room or f"DM{user.upper()}ROOM"
        self._add(room, f"id-{user}", user, text, tmid=tmid)
        return room

    def replies(self, room: str) -> list[str]:
        return [m["msg"] for m in self.sent if m["rid"] == room]
