"""A fake Gotify server (https://gotify.net/api-docs): `GET /stream` WebSocket with a
client token, `POST /message` with an application token. Every message is pushed
to every stream client, our own replies included (as on a real server)."""

from __future__ import annotations

import itertools
from datetime import datetime, timezone
from typing import Any

from flask import Flask, jsonify, request
from flask_sock import Sock

from fakes.http import FakeServer
from fakes.websocket_hub import Hub


class FakeGotify(FakeServer):
    def __init__(self, app_token: str, client_token: str, bot_app_id: int = 1) -> None:
        self.app_token, self.client_token, self.bot_app_id = app_token, client_token, bot_app_id
        self.messages: list[dict[str, Any]] = []
        self.ids = itertools.count(1)
        self.hub = Hub()
        app = Flask("fake-gotify")
        sock = Sock(app)

        def token() -> str:
            return request.headers.get("X-Gotify-Key") or request.args.get("token") or ""

        @app.before_request
        def auth():
            wanted = self.client_token if request.path in ("/stream", "/application") else self.app_token
            if token() != wanted:
                return jsonify({"error": "Unauthorized", "errorCode": 401,
                                "errorDescription": "you need to provide a valid access token"}), 401

        @app.post("/message")
        def message():
            body = request.get_json()
            return jsonify(self.post(self.bot_app_id, body["message"], body.get("title", "")))

        @app.get("/application")
        def applications():
            return jsonify([{"id": self.bot_app_id, "token": self.app_token, "name": "agentd", "internal": False},
                            {"id": 7, "token": "OtherAppToken", "name": "monitor", "internal": False}])

        @sock.route("/stream")
        def stream(ws):
            self.hub.serve(ws)

        super().__init__(app)

    def post(self, app_id: int, text: str, title: str = "") -> dict[str, Any]:
        message = {"id": next(self.ids), "appid": app_id, "message": text, "title": title, "priority": 5,
                   "date": datetime.now(timezone.utc).isoformat()}
        self.messages.append(message)
        self.hub.broadcast(message)
        return message

    def bot_messages(self) -> list[str]:
        return [m["message"] for m in self.messages if m["appid"] == self.bot_app_id]
