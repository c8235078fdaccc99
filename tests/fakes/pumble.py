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
`listener` is set, the bot's own posts are delivered back to it as events, as Pumble does."""

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
        app = Flask("fake-pumble")

        @app.before_request
        def auth():  # type: ignore[no-untyped-def]
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
            text = (request.get_json(silent=True) or {}).get("text")
            if not isinstance(text, str) or len(text) > 100000:
                return jsonify({"message": "text is required"}), 400
            message = {"id": uuid.uuid4().hex[:24], "workspaceId": WORKSPACE, "channelId": channel, "author": BOT,
                       "text": text, "timestampMilli": int(time.time() * 1000)}
            self.sent.append({"channel": channel, "thread": thread, "text": text, "id": message["id"], "at": time.time()})
            if self.listener:  # Pumble notifies the app of every new message, the bot's own included
                body = event(channel, BOT, text, message_id=message["id"], thread=thread)
                self.echoes.append(requests.post(self.listener, data=body, headers=headers(self.secret, body),
                                                 timeout=5).status_code)
            return jsonify(message)

        super().__init__(app)

    def replies(self, channel: str) -> list[str]:
        return [s["text"] for s in self.sent if s["channel"] == channel]
