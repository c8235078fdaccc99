"""A fake Revolt (delta REST + Bonfire WebSocket), written from Revolt's documentation
(revoltchat/documentation: docs/stack/bonfire/{establishing,events}.md and
docs/stack/delta/rate_limits.md, plus the OpenAPI schema for Message and Channel).

REST: `GET /users/@me`, `GET /channels/{id}`,
`POST /channels/{id}/messages` ({content, replies: [{id, mention}]}, content 1-2000
characters); `x-bot-token` or 401 `{"type": "InvalidSession"}`; a scripted 429 answers
`{"retry_after": <milliseconds>}` with `X-RateLimit-Reset-After` (milliseconds) and no
Retry-After header, as Revolt's limiter does.

Bonfire on `/`: `Authenticate` -> `Authenticated` + `Ready` (or `Error` InvalidSession);
`Ping` -> `Pong` with the same data (unless `pong` is False); `BeginTyping` recorded;
`Message` events to every authenticated socket, the bot's own included. `GET /` (no
Upgrade) is the API root naming Autumn (`features.autumn.url`), served here under
`/autumn`: `POST /autumn/attachments` (multipart part `file`, `x-bot-token`) -> `{"id"}`,
`GET /autumn/attachments/{id}` the bytes; a message may carry `attachments: [id]` (each
id once, content then optional) and users' messages carry File objects. Reactions:
`PUT`/`DELETE /channels/{c}/messages/{m}/reactions/{emoji}` (204; 404 NotFound for an
unknown message), the bot's kept in `reactions` (message id -> emoji).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from flask import jsonify, request
from simple_websocket import ConnectionClosed

from fakes.gateway import FakeGateway

BOT = {"_id": "01BOT00000000000000000000A", "username": "agentbot", "discriminator": "0001",
       "bot": {"owner": "01OWNER000000000000000000A"}, "online": True}
SERVER = "01SERVER0000000000000000AA"
GENERAL = "01GENERAL000000000000000AA"
LATER = "01LATER00000000000000000AA"   # a channel Ready does not list (fetched on demand)


def user(name: str) -> dict[str, Any]:
    return {"_id": f"01USER{name.upper():0<20}"[:26], "username": name, "discriminator": "1234", "online": True}


class FakeRevolt(FakeGateway):
    def __init__(self, token: str) -> None:
        super().__init__("revolt")
        self.token = token
        self.pong = True
        self.events: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.typing: list[str] = []
        self.reactions: dict[str, list[str]] = {}
        self.people = {n: user(n) for n in ("ann", "bob", "mallory")}
        self.people["otherbot"] = {**user("otherbot"), "bot": {"owner": "someone"}}
        self.ids = itertools.count(1)
        self.channels = {GENERAL: {"channel_type": "TextChannel", "_id": GENERAL, "server": SERVER, "name": "general"},
                         LATER: {"channel_type": "TextChannel", "_id": LATER, "server": SERVER, "name": "later"}}
        for name, person in self.people.items():
            self.channels[f"DM{name.upper()}"] = {"channel_type": "DirectMessage", "_id": f"DM{name.upper()}",
                                                  "active": True, "recipients": [BOT["_id"], person["_id"]]}
        app, sock = self.app, self.sock

        self.redirect_files = ""  # a URL Autumn's downloads redirect to
        self.files: dict[str, dict[str, Any]] = {}   # Autumn: id -> File object + data
        self.downloads: list[str] = []
        self.file_messages: list[dict[str, Any]] = []  # the bot's messages carrying attachments

        @app.before_request
        def root():
            if request.path == "/" and request.headers.get("Upgrade", "").lower() != "websocket":
                return jsonify({"revolt": "0.8.0", "ws": self.url.replace("http", "ws", 1),
                                "features": {"autumn": {"enabled": True, "url": f"{self.url}/autumn"},
                                             "january": {"enabled": False, "url": ""}}})
            return None

        @app.get("/autumn/<tag>/<file_id>")
        def download(tag: str, file_id: str):
            item = self.files.get(file_id)
            if item is None or item["tag"] != tag:
                return jsonify({"type": "NotFound"}), 404
            self.downloads.append(file_id)
            if self.redirect_files:
                return "", 302, {"Location": self.redirect_files}
            return item["data"], 200, {"Content-Type": item["content_type"]}

        @app.post("/autumn/<tag>")
        def upload(tag: str):
            part = request.files.get("file")
            if tag != "attachments" or part is None:
                return jsonify({"type": "FailedValidation", "error": "file"}), 400
            data = part.read()
            item = self._file(part.filename or "file", part.mimetype or "application/octet-stream", data)
            return jsonify({"id": item["_id"]})

        @app.before_request
        def auth():
            if request.path.startswith("/autumn/") and request.method == "GET":
                return None  # attachments are served to anyone who has the id
            if request.path != "/" and request.headers.get("x-bot-token") != self.token:
                return jsonify({"type": "InvalidSession", "location": "crates/core/database/src/models/users"}), 401

        @app.get("/users/@me")
        def me():
            return jsonify(BOT)

        @app.get("/channels/<channel>")
        def fetch_channel(channel: str):
            if channel not in self.channels:
                return jsonify({"type": "NotFound"}), 404
            return jsonify(self.channels[channel])

        @app.route("/channels/<channel>/messages/<message>/reactions/<emoji>", methods=["PUT", "DELETE"])
        def reaction(channel: str, message: str, emoji: str):
            if not any(m.get("_id") == message for m in self.messages):
                return jsonify({"type": "NotFound"}), 404
            mine = self.reactions.setdefault(message, [])
            if request.method == "PUT" and emoji not in mine:
                mine.append(emoji)
            elif request.method == "DELETE" and emoji in mine:
                mine.remove(emoji)
            return "", 204

        @app.post("/channels/<channel>/messages")
        def send(channel: str):
            if self.throttle:
                millis = self.throttle.pop(0) * 1000
                response = jsonify({"retry_after": millis})
                response.status_code = 429
                response.headers.update({"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "0",
                                         "X-RateLimit-Bucket": "messages", "X-RateLimit-Reset-After": str(millis)})
                return response
            body = request.get_json()
            content = body.get("content") or ""
            ids = body.get("attachments") or []
            if channel not in self.channels or len(content) > 2000 or not (content or ids):
                return jsonify({"type": "FailedValidation", "error": "content"}), 400
            if any(i not in self.files or self.files[i].get("used") for i in ids):
                return jsonify({"type": "InvalidOperation", "error": "attachments"}), 400
            for i in ids:
                self.files[i]["used"] = True
            files = [{k: v for k, v in self.files[i].items() if k not in ("data", "used")} for i in ids]
            message = self._post(channel, BOT["_id"], content, replies=[r["id"] for r in body.get("replies") or []],
                                 attachments=files)
            if ids:
                self.file_messages.append({"channel": channel, "content": content, "replies": body.get("replies") or [],
                                           "files": [self.files[i] for i in ids]})
            else:
                self.record(channel=channel, content=content, replies=body.get("replies") or [])
            return jsonify(message)

        @sock.route("/", endpoint="bonfire")
        def bonfire(ws):
            self._serve(ws)

    def _serve(self, ws: Any) -> None:
        self.socks.append(ws)
        # Events from the moment the socket is open are delivered once it authenticates: the
        # client may tell its caller it is connected before its Authenticate frame arrives.
        opened, cursor = len(self.events), None
        try:
            while True:
                raw = ws.receive(timeout=0.05)
                if raw is not None:
                    frame = json.loads(raw)
                    self.received.append(frame)
                    kind = frame.get("type")
                    if kind == "Authenticate":
                        if frame.get("token") != self.token:
                            ws.send(json.dumps({"type": "Error", "error": "InvalidSession"}))
                            continue
                        ws.send(json.dumps({"type": "Authenticated"}))
                        ws.send(json.dumps({"type": "Ready", "users": [BOT, *self.people.values()],
                                            "servers": [{"_id": SERVER, "name": "Test", "owner": "x",
                                                         "channels": [GENERAL, LATER]}],
                                            "channels": [c for i, c in self.channels.items() if i != LATER]}))
                        cursor = opened
                    elif kind == "Ping":
                        self.polled()
                        if self.pong:
                            ws.send(json.dumps({"type": "Pong", "data": frame.get("data")}))
                    elif kind == "BeginTyping":
                        self.typing.append(frame.get("channel"))
                if cursor is not None:
                    while cursor < len(self.events):
                        ws.send(json.dumps(self.events[cursor]))
                        cursor += 1
        except (ConnectionClosed, OSError):
            return

    def _post(self, channel: str, author: str, content: str, **extra: Any) -> dict[str, Any]:
        message = {"_id": f"01MSG{next(self.ids):021d}", "channel": channel, "author": author, "content": content,
                   **{k: v for k, v in extra.items() if v}}
        self.messages.append(message)
        with self.lock:
            self.events.append({"type": "Message", **message})
        return message

    def _file(self, filename: str, content_type: str, data: bytes) -> dict[str, Any]:
        kind = "Image" if content_type.startswith("image/") else "File"
        item = {"_id": f"01FILE{next(self.ids):020d}", "tag": "attachments", "filename": filename,
                "metadata": {"type": kind, **({"width": 1, "height": 1} if kind == "Image" else {})},
                "content_type": content_type, "size": len(data), "data": data}
        self.files[item["_id"]] = item
        return item

    def user_sends_file(self, name: str, data: bytes, filename: str, content_type: str, text: str = "",
                        channel: str = "", size: int | None = None, tag: str = "attachments") -> str:
        """`name` posts a file (in their DM unless `channel`, then mentioning the bot)."""
        item = self._file(filename, content_type, data)
        item["tag"] = tag
        shown = {k: v for k, v in item.items() if k != "data"}
        if size is not None:
            shown["size"] = size
        person = self.people[name]
        if channel:
            self._post(channel, person["_id"], f"<@{BOT['_id']}> {text}", mentions=[BOT["_id"]], attachments=[shown])
        else:
            channel = f"DM{name.upper()}"
            self._post(channel, person["_id"], text, attachments=[shown])
        return channel

    def user_says(self, name: str, text: str, channel: str = "", mention: bool = False) -> str:
        """`name` writes in their DM with the bot unless `channel`; `mention` adds `<@bot>`."""
        channel = channel or f"DM{name.upper()}"
        person = self.people[name]
        if mention:
            self._post(channel, person["_id"], f"<@{BOT['_id']}> {text}", mentions=[BOT["_id"]])
        else:
            self._post(channel, person["_id"], text)
        return channel

