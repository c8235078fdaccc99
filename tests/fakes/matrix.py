"""A fake Matrix homeserver (client-server API v3): whoami, /sync with since tokens
and long-poll timeout, room send with transaction ids (idempotent; `m.reaction`
annotations too, kept in `reactions`), redact, typing; `user_edits()` sends an
`m.replace` edit as a client does. Sent
messages appear in the room timeline like on a real server; sends are answered 429
(M_LIMIT_EXCEEDED, Retry-After) while `throttle` holds seconds. Users can write in a
thread (an `m.relates_to` of `rel_type` `m.thread` naming the root event, with the
`m.in_reply_to` fallback), reply to an event, and mention users intentionally
(`m.mentions.user_ids`, with a matrix.to pill in `formatted_body`), as the spec describes.

Media (client-server API v1.11, authenticated media): `POST /_matrix/media/v3/upload`
answers an `mxc://` URI, `GET /_matrix/client/v1/media/download/{server}/{media}` serves
it with the access token only; users send files as `m.image` / `m.file` messages.

Refresh tokens (client-server API v1.3): with `refresh_token` set, `expire()` ends the
current access token's life: calls with it answer 401 `M_UNKNOWN_TOKEN` with
`soft_logout: true`, and `POST /_matrix/client/v3/refresh` trades the refresh token for a
new access token and a new refresh token (the old one spent; a spent or unknown one is 401
`M_UNKNOWN_TOKEN`, `soft_logout: false`). `refreshes` records each trade.

An event keeps its whole content (`format`, `formatted_body` beside `body`); one over
64 KiB is 413 M_TOO_LARGE.

Follows FakePlatform's contract (`sent`, `throttle`, `polls`, `restart`)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from flask import Flask, jsonify, request

from fakes.http import FakeServer

PREFIX = "/_matrix/client/v3"
MAX_EVENT = 65_536  # the spec's limit on an event's size (M_TOO_LARGE beyond it)


class FakeMatrix(FakeServer):
    def __init__(self, token: str, bot: str = "@bot:test", refresh_token: str = "") -> None:
        self.token, self.bot = token, bot
        self.refresh_token = refresh_token
        self.expired: set[str] = set()  # access tokens past their life
        self.refreshes: list[dict[str, str]] = []  # {"used": refresh token, "access": new token}
        self.events: list[tuple[str, dict[str, Any]]] = []  # (room, event); index = stream position
        self.txns: dict[tuple[str, str], str] = {}
        self.typing: list[tuple[str, str, bool]] = []
        self.reactions: dict[str, dict[str, str]] = {}  # live reaction event -> {room, event_id, key}
        self.redactions: list[str] = []
        self.syncs: list[dict[str, Any]] = []
        self.throttle: list[int] = []
        self.sent: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self.media: dict[str, tuple[str, bytes]] = {}  # media id -> (content type, bytes)
        self.downloads: list[str] = []
        app = Flask("fake-matrix")

        @app.post("/_matrix/media/v3/upload")
        def upload():
            media = uuid.uuid4().hex
            self.media[media] = (request.content_type or "application/octet-stream", request.get_data())
            return jsonify({"content_uri": f"mxc://test/{media}"})

        @app.get("/_matrix/client/v1/media/download/<server>/<media>")
        def download(server: str, media: str):
            self.downloads.append(media)
            if server != "test" or media not in self.media:
                return jsonify({"errcode": "M_NOT_FOUND", "error": "Not found"}), 404
            kind, data = self.media[media]
            return data, 200, {"Content-Type": kind}

        @app.post(PREFIX + "/refresh")
        def refresh():
            body = request.get_json(silent=True)
            if not isinstance(body, dict) or not isinstance(body.get("refresh_token"), str):
                return jsonify({"errcode": "M_MISSING_PARAM", "error": "refresh_token is required"}), 400
            with self.cond:
                if not self.refresh_token or body["refresh_token"] != self.refresh_token:
                    return jsonify({"errcode": "M_UNKNOWN_TOKEN", "error": "Unknown refresh token",
                                    "soft_logout": False}), 401
                self.expired.add(self.token)
                self.token, self.refresh_token = f"syt_{uuid.uuid4().hex}", f"syr_{uuid.uuid4().hex}"
                self.refreshes.append({"used": body["refresh_token"], "access": self.token})
                return jsonify({"access_token": self.token, "refresh_token": self.refresh_token,
                                "expires_in_ms": 60_000})

        @app.before_request
        def auth():
            if request.path == PREFIX + "/refresh":
                return None  # the refresh token is the credential, in the body
            header = request.headers.get("Authorization") or ""
            if header != f"Bearer {self.token}" or self.token in self.expired:
                soft = header.removeprefix("Bearer ") in self.expired
                return jsonify({"errcode": "M_UNKNOWN_TOKEN", "error": "Access token has expired" if soft
                                else "Invalid access token", "soft_logout": soft}), 401

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
            if request.method == "PUT" and "/send/m.room.message/" in request.path and response.status_code == 200:
                content = request.get_json()
                self.sent.append({"room": request.path.split("/rooms/")[1].split("/")[0],
                                  "body": content["body"], "relates_to": content.get("m.relates_to"),
                                  "at": time.time()})
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
                    self.txns[(room, txn)] = self._add(room, self.bot, request.get_json())
            return jsonify({"event_id": self.txns[(room, txn)]})

        @app.put(PREFIX + "/rooms/<room>/send/m.reaction/<txn>")
        def react(room: str, txn: str):
            relation = (request.get_json() or {}).get("m.relates_to") or {}
            if relation.get("rel_type") != "m.annotation" or not relation.get("event_id") or not relation.get("key"):
                return jsonify({"errcode": "M_BAD_JSON", "error": "annotation needs event_id and key"}), 400
            with self.cond:
                if (room, txn) not in self.txns:
                    event_id = f"$ev{len(self.events) + 1}"
                    self.events.append((room, {"type": "m.reaction", "sender": self.bot, "event_id": event_id,
                                               "origin_server_ts": int(time.time() * 1000),
                                               "content": {"m.relates_to": relation}}))
                    self.txns[(room, txn)] = event_id
                    self.reactions[event_id] = {"room": room, "event_id": relation["event_id"],
                                                "key": relation["key"]}
                    self.cond.notify_all()
            return jsonify({"event_id": self.txns[(room, txn)]})

        @app.put(PREFIX + "/rooms/<room>/redact/<event_id>/<txn>")
        def redact(room: str, event_id: str, txn: str):
            self.reactions.pop(event_id, None)
            self.redactions.append(event_id)
            return jsonify({"event_id": f"$redaction{len(self.redactions)}"})

        @app.put(PREFIX + "/rooms/<room>/typing/<user>")
        def typing(room: str, user: str):
            self.typing.append((room, user, bool(request.get_json().get("typing"))))
            return jsonify({})

        super().__init__(app)

    def _add(self, room: str, sender: str, body: str | dict[str, Any]) -> str:
        event_id = f"$ev{len(self.events) + 1}"
        content = body if isinstance(body, dict) else {"msgtype": "m.text", "body": body}
        self.events.append((room, {"type": "m.room.message", "sender": sender, "event_id": event_id,
                                   "origin_server_ts": int(time.time() * 1000), "content": content}))
        self.cond.notify_all()
        return event_id

    def user_says(self, room: str, sender: str, body: str, thread: str = "", reply_to: str = "",
                  mention: str = "") -> str:
        """`sender` writes in `room` (in the thread whose root is `thread`, replying to the event
        `reply_to`, mentioning the user `mention`); returns the event id."""
        content: dict[str, Any] = {"msgtype": "m.text", "body": body}
        if mention:
            content["body"] = f"{mention}: {body}"
            content["format"] = "org.matrix.custom.html"
            content["formatted_body"] = f'<a href="https://matrix.to/#/{mention}">{mention}</a>: {body}'
            content["m.mentions"] = {"user_ids": [mention]}
        if thread:
            content["m.relates_to"] = {"rel_type": "m.thread", "event_id": thread, "is_falling_back": not reply_to,
                                       "m.in_reply_to": {"event_id": reply_to or self._last_in_thread(room, thread)}}
        elif reply_to:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
        with self.cond:
            return self._add(room, sender, content)

    def _last_in_thread(self, room: str, root: str) -> str:
        last = root
        for r, event in self.events:
            relates = event["content"].get("m.relates_to") or {}
            if r == room and relates.get("rel_type") == "m.thread" and relates.get("event_id") == root:
                last = event["event_id"]
        return last

    def thread_of(self, event_id: str) -> str:
        """The root of the thread the event is in ("" for the main timeline)."""
        for _, event in self.events:
            if event["event_id"] == event_id:
                relates = event["content"].get("m.relates_to") or {}
                return relates.get("event_id", "") if relates.get("rel_type") == "m.thread" else ""
        return ""

    def user_sends_file(self, room: str, sender: str, data: bytes, filename: str, mimetype: str,
                        msgtype: str = "m.file", caption: str = "", url: str = "", size: int | None = None) -> str:
        media = uuid.uuid4().hex
        self.media[media] = (mimetype, data)
        content = {"msgtype": msgtype, "body": caption or filename, "url": url or f"mxc://test/{media}",
                   "info": {"mimetype": mimetype, "size": len(data) if size is None else size}}
        if caption:
            content["filename"] = filename
        with self.cond:
            return self._add(room, sender, content)

    def user_edits(self, room: str, sender: str, event_id: str, body: str) -> str:
        """`sender` edits their message `event_id` (an m.replace event, with the fallback body)."""
        with self.cond:
            new_id = f"$ev{len(self.events) + 1}"
            self.events.append((room, {"type": "m.room.message", "sender": sender, "event_id": new_id,
                                       "origin_server_ts": int(time.time() * 1000),
                                       "content": {"msgtype": "m.text", "body": f"* {body}",
                                                   "m.new_content": {"msgtype": "m.text", "body": body},
                                                   "m.relates_to": {"rel_type": "m.replace",
                                                                    "event_id": event_id}}}))
            self.cond.notify_all()
            return new_id

    def expire(self) -> None:
        """The current access token expires (soft logout): the client must refresh it."""
        with self.cond:
            self.expired.add(self.token)
            self.cond.notify_all()

    def reactions_on(self, event_id: str) -> list[str]:
        """The bot's live reactions on `event_id`."""
        return [r["key"] for r in self.reactions.values() if r["event_id"] == event_id]

    def bot_messages(self, room: str) -> list[str]:
        return [e["content"]["body"] for r, e in self.events
                if r == room and e["sender"] == self.bot and e["type"] == "m.room.message"
                and e["content"].get("msgtype") == "m.text"]

    def bot_files(self, room: str) -> list[dict[str, Any]]:
        """Files the bot posted: the message's content and the uploaded bytes."""
        return [{**e["content"], "data": self.media[e["content"]["url"].rsplit("/", 1)[1]][1]}
                for r, e in self.events if r == room and e["sender"] == self.bot and "url" in e["content"]]

    def bot_contents(self, room: str) -> list[dict[str, Any]]:
        """The bot's messages' whole content (body, format, formatted_body)."""
        return [e["content"] for r, e in self.events
                if r == room and e["sender"] == self.bot and e["type"] == "m.room.message"]

    @property
    def polls(self) -> list[dict[str, Any]]:
        return self.syncs
