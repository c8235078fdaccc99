"""A fake Webex REST API (https://developer.webex.com/docs/api/v1/): Bearer bot token,
`GET /v1/people/me`, webhooks (`GET/POST /v1/webhooks`, `DELETE /v1/webhooks/{id}`),
messages (`POST /v1/messages`, `GET /v1/messages/{id}`). When a user writes, the fake
calls every active `messages`/`created` webhook the way Webex does: a JSON envelope
whose `data` holds ids only (no text), signed `X-Spark-Signature` = hex HMAC-SHA1 of the
body with the webhook's secret. In a group space the bot is only told about messages
that mention it, and the text then starts with its display name.

Files: a message's `files` are URLs of `GET /v1/contents/{id}` (Bearer token; `HEAD` gives
`Content-Disposition`, `Content-Type` and `Content-Length` without the bytes; `downloads`
lists the GETs). `POST /v1/messages` also takes multipart/form-data with `roomId` and one
file in `files` (`uploaded` lists them); `user_sends_file()` posts a user's file.

Follows FakePlatform's contract (`sent`, `throttle`, `polls`, `restart`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from typing import Any

import requests
from flask import jsonify, request

from fakes.platform import FakePlatform

BOT_ID = "Y2lzY29zcGFyazovL3VzL1BFT1BMRS9ib3Q"
BOT_NAME = "Helper Bot"


def spark_signature(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()


class FakeWebex(FakePlatform):
    def __init__(self, token: str) -> None:
        super().__init__("webex")
        self.token = token
        self.webhooks: dict[str, dict[str, Any]] = {}
        self.messages: dict[str, dict[str, Any]] = {}
        self.deliveries: list[requests.Response] = []
        app = self.app

        @app.before_request
        def auth():
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return jsonify({"message": "The request requires a valid access token set in the "
                                           "Authorization request header.", "trackingId": "ROUTER_1"}), 401

        @app.get("/v1/people/me")
        def me():
            return jsonify({"id": BOT_ID, "emails": ["helper@webex.bot"], "displayName": BOT_NAME,
                            "nickName": "Helper", "type": "bot"})

        @app.get("/v1/webhooks")
        def list_hooks():
            return jsonify({"items": [{k: v for k, v in h.items() if k != "secret"} for h in self.webhooks.values()]})

        @app.post("/v1/webhooks")
        def create_hook():
            body = request.get_json()
            if not body.get("targetUrl") or not body.get("name") or not body.get("resource") or not body.get("event"):
                return jsonify({"message": "targetUrl, name, resource and event are required"}), 400
            hook = {"id": "WH" + uuid.uuid4().hex, "name": body["name"], "targetUrl": body["targetUrl"],
                    "resource": body["resource"], "event": body["event"], "secret": body.get("secret"),
                    "status": "active", "created": "2026-11-23T12:00:00.000Z"}
            self.webhooks[hook["id"]] = hook
            return jsonify({k: v for k, v in hook.items() if k != "secret"})

        @app.delete("/v1/webhooks/<hook_id>")
        def delete_hook(hook_id: str):
            if self.webhooks.pop(hook_id, None) is None:
                return jsonify({"message": "The requested resource could not be found."}), 404
            return "", 204

        @app.get("/v1/messages/<message_id>")
        def get_message(message_id: str):
            self.polled()
            message = self.messages.get(message_id)
            if message is None:
                return jsonify({"message": "The requested resource could not be found."}), 404
            return jsonify(message)

        @app.get("/v1/contents/<content_id>")
        def content(content_id: str):
            if content_id not in self.contents:
                return jsonify({"message": "The requested resource could not be found."}), 404
            name, kind, data = self.contents[content_id]
            if request.method == "GET":
                self.downloads.append(content_id)
            return data, 200, {"Content-Type": kind, "Content-Disposition": f'attachment; filename="{name}"'}

        @app.post("/v1/messages")
        def post_message():
            limited = self.throttled({"message": "Too Many Requests"})
            if limited is not None:
                return limited
            if request.mimetype == "multipart/form-data":
                return self._post_file()
            body = request.get_json()
            room = body.get("roomId")
            if room not in self.rooms or not (body.get("markdown") or body.get("text")):
                return jsonify({"message": "Could not find a room, or no text."}), 404
            message = self._add(room, BOT_ID, "helper@webex.bot", body.get("markdown") or body["text"])
            self.record(room=room, markdown=body.get("markdown"), text=body.get("text"), id=message["id"])
            self._notify(message)  # Webex tells the bot about its own messages too
            return jsonify(message)

        self.rooms: dict[str, str] = {}  # room id -> "direct" | "group"
        self.contents: dict[str, tuple[str, str, bytes]] = {}  # id -> (file name, type, bytes)
        self.downloads: list[str] = []
        self.uploaded: list[dict[str, Any]] = []

    def _post_file(self):  # type: ignore[no-untyped-def]
        room, files = request.form.get("roomId"), request.files.getlist("files")
        if room not in self.rooms:
            return jsonify({"message": "Could not find a room."}), 404
        if len(files) != 1:
            return jsonify({"message": "Only one file may be attached to a message."}), 400
        upload = files[0]
        data = upload.read()
        content = self.store(upload.filename or "file", upload.mimetype or "application/octet-stream", data)
        message = self._add(room, BOT_ID, "helper@webex.bot", request.form.get("markdown") or "")
        message["files"] = [content]
        self.uploaded.append({"room": room, "filename": upload.filename, "content_type": upload.mimetype,
                              "data": data, "id": message["id"]})
        self._notify(message)
        return jsonify(message)

    def store(self, name: str, kind: str, data: bytes) -> str:
        content_id = "Y2lzY29zcGFyazovL3VzL0NPTlRFTlQv" + uuid.uuid4().hex
        self.contents[content_id] = (name, kind, data)
        return f"{self.url}/v1/contents/{content_id}"

    def user_sends_file(self, user: str, data: bytes, name: str, kind: str, text: str = "", url: str = "") -> str:
        """`user` sends the bot a file (with `text`) in their direct room; `url` names it elsewhere."""
        name_part = user.split("@")[0]
        room = f"DM-{name_part}"
        self.rooms[room] = "direct"
        message = self._add(room, f"PERSON-{name_part}", f"{name_part}@example.com", text)
        message["files"] = [url or self.store(name, kind, data)]
        self._notify(message)
        return room

    def _add(self, room: str, person: str, email: str, text: str) -> dict[str, Any]:
        message = {"id": "MSG" + uuid.uuid4().hex, "roomId": room, "roomType": self.rooms[room], "text": text,
                   "personId": person, "personEmail": email, "created": "2026-11-23T12:00:00.000Z"}
        self.messages[message["id"]] = message
        return message

    def user_says(self, user: str, text: str, room: str = "", group: bool = False) -> str:
        """`user` (a name or an email address) writes `text` (to the bot directly, or
        mentioning it in the group `room`); their person id is `PERSON-<name>`."""
        name = user.split("@")[0]
        room = room or f"DM-{name}"
        self.rooms[room] = "group" if group else "direct"
        message = self._add(room, f"PERSON-{name}", user if "@" in user else f"{user}@example.com",
                            f"{BOT_NAME.split()[0] if group else ''} {text}".strip())
        self._notify(message)
        return room

    def _notify(self, message: dict[str, Any]) -> None:
        for hook in list(self.webhooks.values()):
            if hook["resource"] != "messages" or hook["event"] != "created":
                continue
            data = {k: message[k] for k in ("id", "roomId", "roomType", "personId", "personEmail", "created")}
            body = json.dumps({"id": hook["id"], "name": hook["name"], "targetUrl": hook["targetUrl"],
                               "resource": "messages", "event": "created", "orgId": "ORG1", "createdBy": BOT_ID,
                               "appId": "APP1", "ownedBy": "creator", "status": "active", "actorId":
                               message["personId"], "data": data}).encode()
            headers = {"Content-Type": "application/json"}
            if hook.get("secret"):
                headers["X-Spark-Signature"] = spark_signature(hook["secret"], body)
            self.deliveries.append(requests.post(hook["targetUrl"], data=body, headers=headers, timeout=5))

    def replies(self, room: str) -> list[str]:
        return [s["markdown"] for s in self.sent if s["room"] == room]
