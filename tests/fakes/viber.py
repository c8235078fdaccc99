"""A fake Viber REST Bot API (https://developers.viber.com/docs/api/rest-bot-api/):
POST /pa/set_webhook (calls the URL back with a signed `webhook` event, as Viber does)
and /pa/send_message, X-Viber-Auth-Token auth, `status` 0 on success; 429 with
Retry-After while `throttle` holds seconds. `event()`/`signature()` build callbacks
the way Viber signs them (X-Viber-Content-Signature: hex HMAC-SHA256 of the body, auth token).

Media: `user_sends_file()` stores a user's picture / file and builds its callback (`media`
a URL on this server, standing in for dl-media.viber.com; `file_name`, `file_size`);
`GET /media/<key>` serves the bytes (kept in `downloads`). Viber's picture and file messages
take only a `media` URL, so there is no upload endpoint."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from typing import Any

import requests
from flask import Flask, jsonify, request

from fakes.http import FakeServer, serve_file


def signature(token: str, body: bytes) -> str:
    return hmac.new(token.encode(), body, hashlib.sha256).hexdigest()


def event(text: str, user: str, name: str = "Ann") -> bytes:
    return json.dumps({"event": "message", "timestamp": int(time.time() * 1000), "chat_hostname": "SN-1",
                       "message_token": int(time.time() * 1e6),
                       "sender": {"id": user, "name": name, "language": "en", "country": "DE", "api_version": 1},
                       "message": {"type": "text", "text": text}, "silent": False}).encode()


class FakeViber(FakeServer):
    def __init__(self, token: str) -> None:
        self.token = token
        self.sent: list[dict[str, Any]] = []
        self.webhooks: list[dict[str, Any]] = []
        self.throttle: list[int] = []
        self.next_token = 5000
        self.media: dict[str, tuple[bytes, str]] = {}
        self.downloads: list[str] = []
        app = Flask("fake-viber")

        @app.get("/media/<key>")
        def media(key: str):
            return serve_file(self.media, key, self.downloads)

        @app.post("/pa/<method>")
        def api(method: str):
            if request.headers.get("X-Viber-Auth-Token") != self.token:
                return jsonify({"status": 2, "status_message": "invalidAuthToken"})
            body = request.get_json()
            if method == "set_webhook":
                check = json.dumps({"event": "webhook", "timestamp": int(time.time() * 1000),
                                    "message_token": 1}).encode()
                answer = requests.post(body["url"], data=check, timeout=5,
                                       headers={"X-Viber-Content-Signature": signature(self.token, check)})
                if answer.status_code != 200:
                    return jsonify({"status": 1, "status_message": "invalidUrl"})
                self.webhooks.append(body)
                return jsonify({"status": 0, "status_message": "ok", "event_types": body.get("event_types")})
            if method != "send_message":
                return jsonify({"status": 1, "status_message": "unknown method"}), 404
            if self.throttle:
                return jsonify({"status": 12, "status_message": "tooManyRequests"}), 429, \
                    {"Retry-After": str(self.throttle.pop(0))}
            name = (body.get("sender") or {}).get("name")
            if body.get("type") != "text" or not body.get("receiver") or not name or len(name) > 28:
                return jsonify({"status": 3, "status_message": "badData"})
            self.next_token += 1
            self.sent.append({"to": body["receiver"], "text": body["text"], "name": name, "at": time.time()})
            return jsonify({"status": 0, "status_message": "ok", "message_token": self.next_token})

        super().__init__(app)

    def user_sends_file(self, user: str, data: bytes, mime_type: str, kind: str = "picture", filename: str = "",
                        text: str = "", url: str = "") -> bytes:
        """The callback body of a user's picture or file message (its bytes served at `media`)."""
        key = uuid.uuid4().hex + (filename[filename.rfind("."):] if "." in filename else ".jpg")
        self.media[key] = (data, mime_type)
        body = json.loads(event(text, user))
        message: dict[str, Any] = {"type": kind, "media": url or f"{self.url}/media/{key}"}
        if kind == "picture":
            message.update({"text": text, "thumbnail": message["media"]})
        else:
            message.update({"file_name": filename, "file_size": len(data)})
        body["message"] = message
        return json.dumps(body).encode()
