"""A fake Pumble API and event sender (from the Pumble app SDK docs,
https://cake-com.github.io/pumble-node-sdk/): every API call needs the `token` (bot access
token) and `x-app-token` (app key) headers; GET /oauth2/me (the token's workspace user),
GET /v1/channels/{id} ({channel: {id, channelType: DIRECT|PUBLIC|PRIVATE, ...}}),
POST /v1/channels/{id}/messages and /v1/channels/{id}/messages/{threadRootId} ({text} ->
the new Message); 429 with Retry-After while `throttle` holds seconds.

`event()` builds an app event envelope (`messageType: PUMBLE_EVENT`, `eventType:
NEW_MESSAGE`, the notification JSON as a string in `body`) and `signature()` signs it the
way Pumble does: hex HMAC-SHA256 of `{timestamp}:{raw body}` with the app's signing secret
(`x-pumble-request-signature`, timestamp in `x-pumble-request-timestamp`, epoch ms). When
`listener` is set, the bot's own posts are delivered back to it as events, as Pumble does.

Files, as the SDK's files client uses them: `POST /v1/files/upload/token` ({filename,
length} -> {token}), `POST /upload/files` on the file server (multipart `file`, the
`authtoken` header instead of the API headers; -> the CompleteFileUpload {original, thumbs,
signature}), `POST /v1/files/upload/complete` (that answer -> File {id, path, name}), then a
message with `files: [id]`. A user's message with files (`user_sends_file`) is served by
`GET /v1/channels/{id}/messages/{id}` (its `files`: id, name, mimeType, size, path) and the
file itself by `GET /files/{id}/{name}` with the API headers."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from typing import Any

import requests
from flask import Flask, jsonify, request

from fakes.http import FakeServer

WORKSPACE, BOT = "ws-0001", "bot-user-77"


def signature(secret: str, stamp: str, body: bytes) -> str:
    return hmac.new(secret.encode(), stamp.encode() + b":" + body, hashlib.sha256).hexdigest()


def event(channel: str, author: str, text: str, mentions: tuple[str, ...] = (), message_id: str = "",
          thread: str = "") -> bytes:
    now = int(time.time() * 1000)
    notification = {"mId": message_id or uuid.uuid4().hex[:24], "wId": WORKSPACE, "cId": channel,
                    "trId": thread, "aId": author, "tx": text, "ty": "NEW_MESSAGE", "ts": str(now),
                    "tsm": now, "st": "", "rid": uuid.uuid4().hex, "f": [], "lId": "", "att": {},
                    "mu": list(mentions), "md": [], "mc": [], "e": False, "eph": False}
    return json.dumps({"messageType": "PUMBLE_EVENT", "eventType": "NEW_MESSAGE", "workspaceId": WORKSPACE,
                       "workspaceUserIds": [BOT], "body": json.dumps(notification)}).encode()


def headers(secret: str, body: bytes, stamp: str | None = None) -> dict[str, str]:
    stamp = stamp or str(int(time.time() * 1000))
    return {"Content-Type": "application/json", "x-pumble-request-timestamp": stamp,
            "x-pumble-request-signature": signature(secret, stamp, body)}


class FakePumble(FakeServer):
    def __init__(self, token: str, app_key: str, signing_secret: str) -> None:
        self.token, self.app_key, self.secret = token, app_key, signing_secret
        self.channels: dict[str, str] = {}  # id -> DIRECT | PUBLIC | PRIVATE
        self.sent: list[dict[str, Any]] = []  # {channel, thread, text, id, at}
        self.throttle: list[int] = []
        self.listener = ""  # the app's event URL: the bot's own posts come back as events
        self.echoes: list[int] = []  # status of each echoed event
        self.upload_tokens: dict[str, dict[str, Any]] = {}  # token -> {filename, length}
        self.uploads: dict[str, dict[str, Any]] = {}  # signature -> what the file server took
        self.stored: dict[str, tuple[str, str, bytes]] = {}  # file id -> (name, type, bytes)
        self.messages: dict[str, dict[str, Any]] = {}  # users' messages with files, by id
        self.downloads: list[str] = []
        self.redirect_files = ""
        app = Flask("fake-pumble")

        @app.before_request
        def auth():  # type: ignore[no-untyped-def]
            if request.path == "/upload/files":
                return None  # the file server takes the upload token instead
            if request.headers.get("token") != self.token or request.headers.get("x-app-token") != self.app_key:
                return jsonify({"message": "Unauthorized"}), 401
            return None

        @app.get("/oauth2/me")
        def me():
            return jsonify({"workspaceId": WORKSPACE, "workspaceName": "Acme", "workspaceUserId": BOT,
                            "workspaceUserName": "agentd bot"})

        @app.get("/v1/channels/<channel>")
        def details(channel: str):
            if channel not in self.channels:
                return jsonify({"message": "Channel not found"}), 404
            return jsonify({"channel": {"id": channel, "workspaceId": WORKSPACE, "channelType": self.channels[channel],
                                        "name": channel, "isMember": True}, "users": [BOT]})

        @app.post("/v1/channels/<channel>/messages", defaults={"thread": ""})
        @app.post("/v1/channels/<channel>/messages/<thread>")
        def post(channel: str, thread: str):
            if channel not in self.channels:
                return jsonify({"message": "Channel not found"}), 404
            if self.throttle:
                return jsonify({"message": "Too many requests"}), 429, {"Retry-After": str(self.throttle.pop(0))}
            body = request.get_json(silent=True) or {}
            text, files = body.get("text"), body.get("files") or []
            if not isinstance(text, str) or len(text) > 100000 or (not text and not files):
                return jsonify({"message": "text is required"}), 400
            if not isinstance(files, list) or any(f not in self.stored for f in files):
                return jsonify({"message": "unknown file"}), 400
            message = {"id": uuid.uuid4().hex[:24], "workspaceId": WORKSPACE, "channelId": channel, "author": BOT,
                       "text": text, "timestampMilli": int(time.time() * 1000)}
            self.sent.append({"channel": channel, "thread": thread, "text": text, "id": message["id"], "at": time.time(),
                              "files": [self.stored[f] for f in files]})
            if self.listener:  # Pumble notifies the app of every new message, the bot's own included
                body = event(channel, BOT, text, message_id=message["id"], thread=thread)
                self.echoes.append(requests.post(self.listener, data=body, headers=headers(self.secret, body),
                                                 timeout=5).status_code)
            return jsonify(message)

        @app.get("/v1/channels/<channel>/messages/<message_id>")
        def fetch_message(channel: str, message_id: str):
            message = self.messages.get(message_id)
            if not message or message["channelId"] != channel:
                return jsonify({"message": "Message not found"}), 404
            return jsonify(message)

        @app.post("/v1/files/upload/token")
        def upload_token():
            body = request.get_json(silent=True) or {}
            if not isinstance(body.get("filename"), str) or not isinstance(body.get("length"), int):
                return jsonify({"message": "filename and length are required"}), 400
            token = uuid.uuid4().hex
            self.upload_tokens[token] = body
            return jsonify({"token": token})

        @app.post("/upload/files")
        def upload_file():
            grant = self.upload_tokens.pop(request.headers.get("authtoken", ""), None)
            part = request.files.get("file")
            if grant is None:
                return jsonify({"message": "Unauthorized"}), 401
            data = part.read() if part else b""
            if part is None or part.filename != grant["filename"] or len(data) != grant["length"]:
                return jsonify({"message": "the file does not match the upload token"}), 400
            signature = uuid.uuid4().hex
            upload_id = uuid.uuid4().hex[:24]
            self.uploads[signature] = {"name": part.filename, "type": part.mimetype, "data": data, "id": upload_id}
            return jsonify({"original": {"mimeType": part.mimetype, "size": len(data), "path": f"files/{upload_id}",
                                         "requestedFileUploadId": upload_id, "width": 0, "height": 0,
                                         "duration": 0, "waveform": [], "base64Value": ""},
                            "thumbs": [], "signature": signature})

        @app.post("/v1/files/upload/complete")
        def complete_upload():
            body = request.get_json(silent=True) or {}
            upload = self.uploads.pop(str(body.get("signature")), None)
            if upload is None or (body.get("original") or {}).get("requestedFileUploadId") != upload["id"]:
                return jsonify({"message": "invalid upload"}), 400
            self.stored[upload["id"]] = (upload["name"], upload["type"], upload["data"])
            return jsonify({"id": upload["id"], "path": f"{self.url}/files/{upload['id']}/{upload['name']}",
                            "name": upload["name"]})

        @app.get("/files/<file_id>/<name>")
        def download(file_id: str, name: str):
            self.downloads.append(file_id)
            if self.redirect_files:
                return "", 302, {"Location": self.redirect_files}
            if file_id not in self.stored:
                return jsonify({"message": "not found"}), 404
            return self.stored[file_id][2], 200, {"Content-Type": self.stored[file_id][1]}

        super().__init__(app)

    def user_sends_file(self, channel: str, author: str, data: bytes, name: str, mime: str, text: str = "",
                        size: int = 0, path: str = "") -> bytes:
        """A user's message with one file; returns its NEW_MESSAGE event (to be signed and posted)."""
        file_id, message_id = uuid.uuid4().hex[:24], uuid.uuid4().hex[:24]
        self.stored[file_id] = (name, mime, data)
        self.messages[message_id] = {
            "id": message_id, "workspaceId": WORKSPACE, "channelId": channel, "author": author, "text": text,
            "timestampMilli": int(time.time() * 1000),
            "files": [{"id": file_id, "owner": author, "name": name, "mimeType": mime, "size": size or len(data),
                       "path": path or f"{self.url}/files/{file_id}/{name}"}]}
        body = json.loads(event(channel, author, text, message_id=message_id))
        notification = json.loads(body["body"])
        notification["f"] = [{"id": file_id}]
        body["body"] = json.dumps(notification)
        return json.dumps(body).encode()

    def replies(self, channel: str) -> list[str]:
        return [s["text"] for s in self.sent if s["channel"] == channel]
