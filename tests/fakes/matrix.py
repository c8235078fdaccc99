"""A fake Matrix homeserver (client-server API v3): whoami, /sync with since tokens
and long-poll timeout, room send with transaction ids (idempotent), typing. Sent
messages appear in the room timeline like on a real server; sends are answered 429
(M_LIMIT_EXCEEDED, Retry-After) while `throttle` holds seconds. An event keeps its whole
content (`format`, `formatted_body` beside `body`); one over 64 KiB is 413 M_TOO_LARGE.

Follows FakePlatform's contract (`sent`, `throttle`, `polls`, `restart`)."""

from __future__ import annotations

import threading
import time
from typing import Any

from flask import Flask, jsonify, request

from fakes.http import FakeServer

PREFIX = "/_matrix/client/v3"
MAX_EVENT = 65_536  # the spec's limit on an event's size (M_TOO_LARGE beyond it)


class FakeMatrix(FakeServer):
    def __init__(self, token: str, bot: str = "@bot:test") -> None:
        self.token, self.bot = token, bot
        self.events: list[tuple[str, dict[str, Any]]] = []  # (room, event); index = stream position
        self.txns: dict[tuple[str, str], str] = {}
        self.typing: list[tuple[str, str, bool]] = []
        self.syncs: list[dict[str, Any]] = []
        self.throttle: list[int] = []
        self.sent: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        app = Flask("fake-matrix")

        @app.before_request
        def auth():
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return jsonify({"errcode": "M_UNKNOWN_TOKEN", "error": "Invalid access token"}), 401

        @app.before_request
        def throttled():
            if request.method == "PUT" and "/send/" in request.path and self.throttle:
                response = jsonify({"errcode": "M_LIMIT_EXCEEDED", "error": "Too many requests",
                                    "retry_after_ms": self.throttle[0] * 1000})
                response.status_code = 429
                response.headers["Retry-After"] = str(self.throttle.pop(0))
                return response

        @app.after_request
        def recorded(response):
            if request.method == "PUT" and "/send/" in request.path and response.status_code == 200:
                self.sent.append({"room": request.path.split("/rooms/")[1].split("/")[0],
                                  "body": request.get_json()["body"], "at": time.time()})
            return response

        @app.get(PREFIX + "/account/whoami")
        def whoami():
            return jsonify({"user_id": self.bot})

        @app.get(PREFIX + "/sync")
        def sync():
            since = request.args.get("since")
            timeout = int(request.args.get("timeout") or 0) / 1000
            self.syncs.append({"since": since, "at": time.time()})
            start = int(since[1:]) if since else 0
            deadline = time.monotonic() + timeout
            with self.cond:
                while since and len(self.events) <= start and time.monotonic() < deadline:
                    self.cond.wait(deadline - time.monotonic())
                new = self.events[start:]
                position = len(self.events)
            rooms: dict[str, Any] = {}
            for room, event in new:
                rooms.setdefault(room, {"timeline": {"events": [], "limited": False}})["timeline"]["events"].append(event)
            return jsonify({"next_batch": f"s{position}", "rooms": {"join": rooms}})

        @app.put(PREFIX + "/rooms/<room>/send/m.room.message/<txn>")
        def send(room: str, txn: str):
            if len(request.get_data()) > MAX_EVENT:
                return jsonify({"errcode": "M_TOO_LARGE", "error": "event too large"}), 413
            with self.cond:
                if (room, txn) not in self.txns:
                    self.txns[(room, txn)] = self._add(room, self.bot, request.get_json()["body"],
                                                       request.get_json())
            return jsonify({"event_id": self.txns[(room, txn)]})

        @app.put(PREFIX + "/rooms/<room>/typing/<user>")
        def typing(room: str, user: str):
            self.typing.append((room, user, bool(request.get_json().get("typing"))))
            return jsonify({})

        super().__init__(app)

    def _add(self, room: str, sender: str, body: str, content: dict[str, Any] | None = None) -> str:
        event_id = f"$ev{len(self.events) + 1}"
        self.events.append((room, {"type": "m.room.message", "sender": sender, "event_id": event_id,
                                   "origin_server_ts": int(time.time() * 1000),
                                   "content": content or {"msgtype": "m.text", "body": body}}))
        self.cond.notify_all()
        return event_id

    def user_says(self, room: str, sender: str, body: str) -> str:
        with self.cond:
            return self._add(room, sender, body)

    def bot_messages(self, room: str) -> list[str]:
        return [e["content"]["body"] for r, e in self.events if r == room and e["sender"] == self.bot]

    def bot_contents(self, room: str) -> list[dict[str, Any]]:
        """The bot's events' whole content (body, format, formatted_body)."""
        return [e["content"] for r, e in self.events if r == room and e["sender"] == self.bot]

    @property
    def polls(self) -> list[dict[str, Any]]:
        return self.syncs
