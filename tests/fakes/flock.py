"""A fake Flock API and event sender (https://docs.flock.com/display/flockos/):
POST /v1/chat.sendMessage (form or query `token`, `to`, `text`) -> {"uid": ...}; a wrong
token is 403 {"error", "description"}; 429 with Retry-After while `throttle` holds seconds.

`event_token()` signs a JWS the way the Event Tokens page describes (JOSE header
{"alg":"HS256","typ":"JWT"}, claims appId/userId/exp/iat/jti, HMAC-SHA256 with the app
secret, URL-safe base64 without padding); `receive_message()` and `install()` build the
`chat.receiveMessage` and `app.install` event bodies."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from typing import Any

from flask import Flask, jsonify, request

from fakes.http import FakeServer

APP_ID, BOT = "a7a2f2e0-agentd-app", "u:bot-agentd"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def event_token(secret: str, user: str, app_id: str = APP_ID, ttl: float = 10.0, alg: str = "HS256") -> str:
    now = int(time.time())
    header = _b64(json.dumps({"alg": alg, "typ": "JWT"}).encode())
    claims = _b64(json.dumps({"appId": app_id, "userId": user, "exp": int(now + ttl), "iat": now,
                              "jti": str(uuid.uuid4())}).encode())
    signature = _b64(hmac.new(secret.encode(), f"{header}.{claims}".encode(), hashlib.sha256).digest())
    return f"{header}.{claims}.{signature if alg == 'HS256' else ''}"


def receive_message(user: str, text: str, to: str = BOT) -> bytes:
    return json.dumps({"name": "chat.receiveMessage", "userId": user, "message": {
        "from": user, "to": to, "text": text, "id": uuid.uuid4().hex, "uid": f"{int(time.time() * 1000)}-{uuid.uuid4().hex[:6]}",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())}}).encode()


def install(user: str, name: str = "app.install") -> bytes:
    body: dict[str, Any] = {"name": name, "userId": user}
    if name == "app.install":
        body.update(token="user-token-" + uuid.uuid4().hex[:8], userToken="user-token")
    return json.dumps(body).encode()


class FakeFlock(FakeServer):
    def __init__(self, bot_token: str) -> None:
        self.token = bot_token
        self.sent: list[dict[str, Any]] = []  # {to, text, uid, at}
        self.throttle: list[int] = []
        app = Flask("fake-flock")

        @app.post("/v1/chat.sendMessage")
        def send_message():
            params = {**request.args.to_dict(), **request.form.to_dict()}
            if params.get("token") != self.token:
                return jsonify({"error": "InvalidToken", "description": "The token is invalid"}), 403
            if self.throttle:
                return jsonify({"error": "RateLimitExceeded", "description": "Too many requests"}), 429, \
                    {"Retry-After": str(self.throttle.pop(0))}
            to, text = params.get("to", ""), params.get("text", "")
            if not to.startswith(("u:", "g:")) or not text:
                return jsonify({"error": "InvalidParameter", "description": "to and text are required"}), 400
            uid = f"{int(time.time() * 1000)}-{uuid.uuid4().hex[:6]}"
            self.sent.append({"to": to, "text": text, "uid": uid, "at": time.time()})
            return jsonify({"uid": uid})

        super().__init__(app)

    def replies(self, to: str) -> list[str]:
        return [s["text"] for s in self.sent if s["to"] == to]
