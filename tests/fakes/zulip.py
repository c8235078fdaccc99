"""A fake Zulip server (https://zulip.com/api/): HTTP Basic auth (email + API key),
`GET /api/v1/users/me`, `POST /api/v1/register` (event queue), long-poll
`GET /api/v1/events` (heartbeat after `heartbeat` seconds, BAD_EVENT_QUEUE_ID for an
unknown queue), `POST /api/v1/messages` (stream + topic or private), `POST /api/v1/typing`,
`POST`/`DELETE /api/v1/messages/{id}/reactions` (emoji_name; REACTION_ALREADY_EXISTS,
REACTION_DOES_NOT_EXIST), kept in `reactions` (message id -> names).
Files: `POST /api/v1/user_uploads` (multipart, exactly one file part) answers `uri` and
`url` (`/user_uploads/<realm>/<hash>/<name>`) and `filename`; the file is shared by a message
linking it, and served at `GET /user_uploads/...` to the bot's basic auth (`downloads` lists
what was fetched). `user_sends_file` hosts a file and sends a message linking it."""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any
from urllib.parse import quote

from flask import jsonify, request

from fakes.platform import FakePlatform

BOT_EMAIL, BOT_ID, BOT_NAME = "agent-bot@zulip.test", 9, "Agent Bot"
REALM = 2
USERS = {"ann": 11, "mallory": 12, "bob": 13}


class FakeZulip(FakePlatform):
    def __init__(self, api_key: str, heartbeat: float = 1.0) -> None:
        super().__init__("zulip")
        self.queues: dict[str, list[dict[str, Any]]] = {}
        self.typing: list[dict[str, Any]] = []
        self.reactions: dict[int, list[str]] = {}
        self.heartbeat = heartbeat
        self.files: dict[str, tuple[bytes, str]] = {}  # "/user_uploads/..." path -> (data, type)
        self.uploads: list[dict[str, Any]] = []  # what the bot uploaded: filename, content_type, data, url
        self.downloads: list[str] = []
        app = self.app

        @app.before_request
        def auth():
            if request.authorization is None or (request.authorization.username, request.authorization.password) \
                    != (BOT_EMAIL, api_key):
                return jsonify({"result": "error", "msg": "Invalid API key", "code": "UNAUTHORIZED"}), 401

        @app.get("/api/v1/users/me")
        def me():
            return jsonify({"result": "success", "msg": "", "user_id": BOT_ID, "email": BOT_EMAIL,
                            "full_name": BOT_NAME, "is_bot": True})

        @app.post("/api/v1/register")
        def register():
            assert json.loads(request.form["event_types"]) == ["message"]
            queue_id = f"q-{self.new_id()}"
            self.queues[queue_id] = []
            return jsonify({"result": "success", "msg": "", "queue_id": queue_id, "last_event_id": -1})

        @app.get("/api/v1/events")
        def events():
            queue_id, last = request.args["queue_id"], int(request.args["last_event_id"])
            if queue_id not in self.queues:
                return jsonify({"result": "error", "code": "BAD_EVENT_QUEUE_ID", "queue_id": queue_id,
                                "msg": f"Bad event queue ID: {queue_id}"}), 400
            self.polled()
            deadline = time.monotonic() + self.heartbeat
            with self.lock:
                self.queues[queue_id] = [e for e in self.queues[queue_id] if e["id"] > last]
                while not self.queues[queue_id] and time.monotonic() < deadline:
                    self.lock.wait(deadline - time.monotonic())
                found = list(self.queues[queue_id])
                if not found:  # Zulip answers an idle long poll with a heartbeat event
                    found = [{"type": "heartbeat", "id": last + 1}]
                    self.queues[queue_id].append(found[0])
            return jsonify({"result": "success", "msg": "", "events": found, "queue_id": queue_id})

        @app.post("/api/v1/messages")
        def send():
            limited = self.throttled({"result": "error", "code": "RATE_LIMIT_HIT", "msg": "API usage exceeded"})
            if limited is not None:
                return limited
            form = request.form
            to = form["to"] if form["type"] == "stream" else tuple(json.loads(form["to"]))
            message_id = self.new_id()
            self.record(type=form["type"], to=to, topic=form.get("topic"), content=form["content"], id=message_id)
            return jsonify({"result": "success", "msg": "", "id": message_id})

        @app.route("/api/v1/messages/<int:message_id>/reactions", methods=["POST", "DELETE"])
        def reaction(message_id: int):
            name = request.values.get("emoji_name") or ""
            if not re.fullmatch(r"[a-z0-9_+-]+", name):
                return jsonify({"result": "error", "code": "BAD_REQUEST", "msg": f"Invalid emoji name '{name}'"}), 400
            mine = self.reactions.setdefault(message_id, [])
            if request.method == "POST":
                if name in mine:
                    return jsonify({"result": "error", "code": "REACTION_ALREADY_EXISTS",
                                    "msg": "Reaction already exists."}), 400
                mine.append(name)
            elif name in mine:
                mine.remove(name)
            else:
                return jsonify({"result": "error", "code": "REACTION_DOES_NOT_EXIST",
                                "msg": "Reaction doesn't exist."}), 400
            return jsonify({"result": "success", "msg": ""})

        @app.post("/api/v1/user_uploads")
        def upload():
            parts = [f for name in request.files for f in request.files.getlist(name)]
            if len(parts) != 1:
                return jsonify({"result": "error", "code": "BAD_REQUEST",
                                "msg": "You must specify a file to upload" if not parts
                                else "You may only upload one file at a time"}), 400
            part = parts[0]
            data = part.read()
            url = self.host(data, part.filename or "uploaded-file", part.mimetype)
            self.uploads.append({"filename": part.filename, "content_type": part.mimetype, "data": data, "url": url})
            return jsonify({"result": "success", "msg": "", "uri": url, "url": url,
                            "filename": url.rsplit("/", 1)[1]})

        @app.get("/user_uploads/<int:realm>/<path:rest>")
        def download(realm: int, rest: str):
            path = f"/user_uploads/{realm}/{rest}"
            self.downloads.append(path)
            if path not in self.files:
                return jsonify({"result": "error", "code": "BAD_REQUEST", "msg": "File not found."}), 404
            data, mime = self.files[path]
            return data, 200, {"Content-Type": mime or "application/octet-stream"}

        @app.post("/api/v1/typing")
        def typing():
            self.typing.append({"op": request.form["op"], "to": json.loads(request.form["to"])})
            return jsonify({"result": "success", "msg": ""})

    def host(self, data: bytes, name: str, mime: str) -> str:
        """Store a file as an upload of the realm; its `/user_uploads/...` path."""
        digest = hashlib.sha1(data + name.encode() + str(self.new_id()).encode()).hexdigest()
        path = f"/user_uploads/{REALM}/{digest[:2]}/{digest[2:26]}/{quote(name)}"
        self.files[path] = (data, mime)
        return path

    def user_sends_file(self, user: str, data: bytes, name: str, mime: str, text: str = "", stream: str = "",
                        topic: str = "general", url: str = "") -> Any:
        """A message linking a file uploaded by `user` (or linking `url` as it is)."""
        link = url or self.host(data, name, mime)
        return self.user_says(user, f"{text} [{name}]({link})".strip(), stream, topic)

    def user_says(self, user: str, text: str, stream: str = "", topic: str = "general") -> Any:
        """`stream` empty: a private message to the bot; returns where the reply goes."""
        user = user.split("@", 1)[0]
        message = {"id": self.new_id(), "sender_id": USERS.get(user, 99), "sender_email": f"{user}@zulip.test",
                   "sender_full_name": user.title(), "content": text, "timestamp": int(time.time()),
                   "client": "website"}
        if stream:
            message.update(type="stream", display_recipient=stream, subject=topic, stream_id=5)
            flags = ["mentioned"] if f"@**{BOT_NAME}**" in text else []
            target: Any = (stream, topic)
        else:
            message.update(type="private", subject="", display_recipient=[
                {"id": BOT_ID, "email": BOT_EMAIL}, {"id": message["sender_id"], "email": message["sender_email"]}])
            flags, target = [], (f"{user}@zulip.test",)
        with self.lock:
            for queue in self.queues.values():
                last = max([e["id"] for e in queue], default=-1)
                queue.append({"type": "message", "id": last + 1, "message": message, "flags": flags})
            self.lock.notify_all()
        return target

    def replies(self, target: Any) -> list[str]:
        if isinstance(target, tuple) and len(target) == 2 and not target[0].endswith("zulip.test"):
            return [m["content"] for m in self.sent if (m["to"], m["topic"]) == target]
        return [m["content"] for m in self.sent if m["to"] == target]
