"""A fake signal-cli-rest-api (https://bbernhard.github.io/signal-cli-rest-api/):
`GET /v1/receive/{number}?timeout=` hands over the queued envelopes (and removes them),
`POST /v2/send` {message, number, recipients} answers 201 {timestamp},
`PUT /v1/typing-indicator/{number}` {recipient} answers 204, `POST`/`DELETE
/v1/reactions/{number}` {reaction, recipient, target_author, timestamp} answers 204 (400
without a target), the bot's reaction per message kept in `reactions` (timestamp -> emoji).

Attachments: `user_sends_file()` queues a data message whose `attachments` list {contentType,
filename, id, size} as signal-cli does; `GET /v1/attachments/{id}` serves the bytes (kept in
`downloads`). `/v2/send` takes `base64_attachments`, each
`data:<mime>;filename=<name>;base64,<data>` (anything else is 400), kept in `files`."""

from __future__ import annotations

import base64
import binascii
import re
import time
import uuid
from typing import Any

from flask import jsonify, request

from fakes.platform import FakePlatform

BOT = "+15550000001"
DATA_URI = re.compile(r"data:([\w.+-]+/[\w.+-]+);filename=([^;,]+);base64,([A-Za-z0-9+/=]+)\Z")
NUMBERS = {"ann": "+15550000002", "mallory": "+15550000003", "bob": "+15550000004"}


class FakeSignal(FakePlatform):
    def __init__(self) -> None:
        super().__init__("signal")
        self.queue: list[dict[str, Any]] = []
        self.typing: list[str] = []
        self.reactions: dict[int, str] = {}
        self.delivered: list[dict[str, Any]] = []  # every envelope users sent, kept
        self.attachments: dict[str, bytes] = {}
        self.downloads: list[str] = []
        self.files: list[dict[str, Any]] = []      # attachments the bot sent
        app = self.app

        @app.get("/v1/attachments/<attachment>")
        def attachment(attachment: str):
            if attachment not in self.attachments:
                return jsonify({"error": "Couldn't find attachment"}), 404
            self.downloads.append(attachment)
            return self.attachments[attachment], 200, {"Content-Type": "application/octet-stream"}

        @app.get("/v1/receive/<number>")
        def receive(number: str):
            if number != BOT:
                return jsonify({"error": "User " + number + " is not registered."}), 400
            self.polled()
            deadline = time.monotonic() + float(request.args.get("timeout", 1))
            with self.lock:
                while not self.queue and time.monotonic() < deadline:
                    self.lock.wait(deadline - time.monotonic())
                envelopes, self.queue = self.queue, []
            return jsonify(envelopes)

        @app.post("/v2/send")
        def send():
            limited = self.throttled({"error": "Rate limit exceeded"})
            if limited is not None:
                return limited
            body = request.get_json()
            files = []
            for item in body.get("base64_attachments") or []:
                match = DATA_URI.match(item) if isinstance(item, str) else None
                try:
                    files.append((match.group(1), match.group(2), base64.b64decode(match.group(3), validate=True)))
                except (AttributeError, binascii.Error):
                    return jsonify({"error": "Couldn't process request - invalid base64 attachment"}), 400
            if body.get("number") != BOT or not body.get("recipients") or not (body.get("message") or files):
                return jsonify({"error": "Couldn't process request - invalid request"}), 400
            stamp = int(time.time() * 1000)
            for content_type, filename, data in files:
                self.files.append({"recipients": body["recipients"], "content_type": content_type,
                                   "filename": filename, "data": data, "timestamp": stamp})
            if files and not body.get("message"):
                return jsonify({"timestamp": str(stamp)}), 201
            self.record(number=body["number"], recipients=body["recipients"], message=body["message"],
                        timestamp=stamp)
            return jsonify({"timestamp": str(stamp)}), 201

        app.add_url_rule("/v1/reactions/<number>", "reactions", lambda number: self._react(),
                         methods=["POST", "DELETE"])

        @app.put("/v1/typing-indicator/<number>")
        def typing(number: str):
            self.typing.append(request.get_json()["recipient"])
            return "", 204

    def _react(self):  # type: ignore[no-untyped-def]
        body = request.get_json() or {}
        if not body.get("recipient") or not body.get("target_author") or not isinstance(body.get("timestamp"), int) \
                or not body.get("reaction"):
            return jsonify({"error": "Couldn't process request - invalid request"}), 400
        if request.method == "POST":
            self.reactions[body["timestamp"]] = body["reaction"]
        elif self.reactions.get(body["timestamp"]) == body["reaction"]:
            del self.reactions[body["timestamp"]]
        return "", 204

    def user_says(self, user: str, text: str, group: str = "") -> str:
        number = NUMBERS.get(user, user)
        stamp = int(time.time() * 1000)
        message: dict[str, Any] = {"timestamp": stamp, "message": text, "expiresInSeconds": 0,
                                   "viewOnce": False}
        if group:
            message["groupInfo"] = {"groupId": group, "type": "DELIVER"}
        self._deliver(user, number, stamp, message)
        return number

    def user_sends_file(self, user: str, data: bytes, filename: str | None, content_type: str, text: str = "",
                        size: int | None = None) -> str:
        """Queue a data message carrying one attachment, stored under a signal-cli style id."""
        number = NUMBERS.get(user, user)
        stamp = int(time.time() * 1000)
        attachment_id = uuid.uuid4().hex[:20] + (filename[filename.rfind("."):] if filename and "." in filename else "")
        self.attachments[attachment_id] = data
        message: dict[str, Any] = {"timestamp": stamp, "message": text or None, "expiresInSeconds": 0,
                                   "viewOnce": False, "attachments": [{
                                       "contentType": content_type, "filename": filename, "id": attachment_id,
                                       "size": len(data) if size is None else size, "width": None, "height": None,
                                       "caption": None, "uploadTimestamp": None}]}
        self._deliver(user, number, stamp, message)
        return attachment_id

    def _deliver(self, user: str, number: str, stamp: int, message: dict[str, Any]) -> None:
        """Queue `message` as the data message of an envelope from `user`, as signal-cli receives it."""
        envelope = {"envelope": {"source": number, "sourceNumber": number, "sourceUuid": f"uuid-{user}",
                                 "sourceName": user.title(), "sourceDevice": 1, "timestamp": stamp,
                                 "dataMessage": message}, "account": BOT}
        with self.lock:
            self.queue.append(envelope)
            self.delivered.append(envelope)
            self.lock.notify_all()

    def replies(self, recipient: str) -> list[str]:
        return [m["message"] for m in self.sent if m["recipients"] == [recipient]]
