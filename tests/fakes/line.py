"""A fake LINE Messaging API (https://developers.line.biz/en/reference/messaging-api/):
POST /v2/bot/message/reply {replyToken, messages} and /v2/bot/message/push {to, messages},
Bearer channel access token, 429 with Retry-After while `throttle` holds seconds;
POST /v2/bot/chat/loading/start {chatId, loadingSeconds: 5-60 in steps of 5} answers 202 for a
user id (a group or room id is 400), kept in `loading`.
`event()` builds a webhook body and `signature()` signs it the way LINE does
(X-Line-Signature: base64 HMAC-SHA256 of the raw body, keyed with the channel secret).

Content: `user_sends_file()` stores a user's image / file / audio and builds its webhook
body (an image with `contentProvider` line, or external with its own URLs); `GET
/v2/bot/message/{messageId}/content` (the api-data host's path) serves the bytes to the Bearer
token only, kept in `downloads`. A bot cannot upload: reply/push take only text here, and
LINE's image messages would take `originalContentUrl` (a public HTTPS URL)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from typing import Any

from flask import Flask, jsonify, request

from fakes.http import FakeServer, serve_file


def signature(secret: str, body: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


def event(text: str, user: str, group: str = "") -> bytes:
    """A webhook request body with one text message event from `user` (in `group`)."""
    source = {"type": "group", "groupId": group, "userId": user} if group else {"type": "user", "userId": user}
    return json.dumps({"destination": "Ubot000", "events": [{
        "type": "message", "mode": "active", "timestamp": int(time.time() * 1000),
        "webhookEventId": uuid.uuid4().hex, "deliveryContext": {"isRedelivery": False},
        "replyToken": uuid.uuid4().hex, "source": source,
        "message": {"id": str(uuid.uuid4().int)[:18], "type": "text", "quoteToken": "q", "text": text}}]}).encode()


class FakeLine(FakeServer):
    def __init__(self, access_token: str) -> None:
        self.token = access_token
        self.sent: list[dict[str, Any]] = []  # {api: reply|push, to/replyToken, texts, at}
        self.throttle: list[int] = []
        self.loading: list[str] = []
        self.content: dict[str, tuple[bytes, str]] = {}  # message id -> (bytes, Content-Type)
        self.downloads: list[str] = []
        app = Flask("fake-line")

        @app.get("/v2/bot/message/<message_id>/content")
        def content(message_id: str):
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return jsonify({"message": "Authentication failed"}), 401
            return serve_file(self.content, message_id, self.downloads, {"message": "Not found"})

        @app.post("/v2/bot/chat/loading/start")
        def loading():
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return jsonify({"message": "Authentication failed"}), 401
            body = request.get_json()
            seconds = body.get("loadingSeconds", 20)
            if not str(body.get("chatId") or "").startswith("U") or seconds not in range(5, 61, 5):
                return jsonify({"message": "The request body has 1 error(s)"}), 400
            self.loading.append(body["chatId"])
            return jsonify({}), 202

        @app.post("/v2/bot/message/<api>")
        def message(api: str):
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return jsonify({"message": "Authentication failed"}), 401
            if api not in ("reply", "push"):
                return jsonify({"message": "Not found"}), 404
            if self.throttle:
                return jsonify({"message": "The API rate limit has been exceeded."}), 429, \
                    {"Retry-After": str(self.throttle.pop(0))}
            body = request.get_json()
            messages = body.get("messages") or []
            if not 1 <= len(messages) <= 5 or any(m.get("type") != "text" or len(m["text"]) > 5000
                                                  for m in messages):
                return jsonify({"message": "The request body has 1 error(s)"}), 400
            self.sent.append({"api": api, "to": body.get("to"), "replyToken": body.get("replyToken"),
                              "texts": [m["text"] for m in messages], "at": time.time()})
            return jsonify({"sentMessages": [{"id": str(uuid.uuid4().int)[:18]} for _ in messages]})

        super().__init__(app)

    def user_sends_file(self, user: str, data: bytes, mime_type: str, kind: str = "image", filename: str = "",
                        external: str = "", group: str = "") -> tuple[bytes, str]:
        """(webhook body, message id) of a user's image / file / audio message, its bytes stored."""
        body = json.loads(event("", user, group))
        message = body["events"][0]["message"]
        del message["text"], message["quoteToken"]
        message["type"] = kind
        if kind == "file":
            message.update({"fileName": filename, "fileSize": len(data)})
        elif external:
            message["contentProvider"] = {"type": "external", "originalContentUrl": external,
                                          "previewImageUrl": external}
        else:
            message["contentProvider"] = {"type": "line"}
            if kind == "image":
                message["quoteToken"] = "q"
            if kind == "audio":
                message["duration"] = 1000
        self.content[message["id"]] = (data, mime_type)
        return json.dumps(body).encode(), message["id"]
