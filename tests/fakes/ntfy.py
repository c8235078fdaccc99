"""A fake ntfy server (https://docs.ntfy.sh): publish with `POST /<topic>` (body = message,
Title/Tags headers, Bearer auth) and subscribe with `GET /<topic>/sse` (`since=` id,
`all` or `none`; an `open` event, then `message` events, keepalives). Files: `PUT /<topic>`
with the bytes as the body and the name in `Filename` (or `?filename=`) makes a message with
an `attachment` (`name`, `type`, `size`, `expires`, `url`), served at `GET /file/<id>.<ext>`."""

from __future__ import annotations

import json
import mimetypes
import threading
import time
import uuid
from typing import Any

from flask import Flask, Response, jsonify, request

from fakes.http import FakeServer


class FakeNtfy(FakeServer):
    def __init__(self, token: str) -> None:
        self.token = token
        self.messages: list[dict[str, Any]] = []
        self.subscriptions: list[dict[str, Any]] = []
        self.files: dict[str, tuple[bytes, str]] = {}
        self.downloads: list[str] = []
        self.redirect_files = ""
        self.cond = threading.Condition()
        app = Flask("fake-ntfy")

        @app.before_request
        def auth():
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return jsonify({"code": 40101, "http": 401, "error": "unauthorized"}), 401

        @app.post("/<topic>")
        def publish(topic: str):
            tags = [t.strip() for t in request.headers.get("Tags", "").split(",") if t.strip()]
            return jsonify(self.publish(topic, request.get_data(as_text=True),
                                        title=request.headers.get("Title", ""), tags=tags))

        @app.put("/<topic>")
        def attach(topic: str):
            name = request.headers.get("Filename") or request.args.get("filename") or ""
            if not name:
                return jsonify({"code": 40000, "http": 400, "error": "no file name"}), 400
            tags = [t.strip() for t in request.headers.get("Tags", "").split(",") if t.strip()]
            return jsonify(self.publish_file(topic, request.get_data(), name, tags=tags,
                                             title=request.headers.get("Title", "")))

        @app.get("/file/<name>")
        def download(name: str):
            self.downloads.append(name)
            if self.redirect_files:
                return "", 302, {"Location": self.redirect_files}
            file_id = name.split(".")[0]
            if file_id not in self.files:
                return jsonify({"code": 40401, "http": 404, "error": "not found"}), 404
            data, kind = self.files[file_id]
            return data, 200, {"Content-Type": kind}

        @app.get("/<topic>/sse")
        def subscribe(topic: str):
            since = request.args.get("since", "none")
            self.subscriptions.append({"topic": topic, "since": since, "at": time.time()})
            with self.cond:
                ids = [m["id"] for m in self.messages]
                if since == "all":
                    position = 0
                elif since in ids:
                    position = ids.index(since) + 1
                else:
                    position = len(self.messages)

            def stream():
                nonlocal position
                yield "event: open\ndata: " + json.dumps({"id": uuid.uuid4().hex[:12], "event": "open",
                                                          "topic": topic, "time": int(time.time())}) + "\n\n"
                while True:
                    with self.cond:
                        if len(self.messages) <= position:
                            self.cond.wait(0.5)
                        new, position = self.messages[position:], len(self.messages)
                    sent = False
                    for message in new:
                        if message["topic"] == topic:
                            sent = True
                            yield "event: message\ndata: " + json.dumps(message) + "\n\n"
                    if not sent:
                        yield "event: keepalive\ndata: {\"event\": \"keepalive\"}\n\n"

            return Response(stream(), mimetype="text/event-stream")

        super().__init__(app)

    def publish_file(self, topic: str, data: bytes, name: str, text: str = "", tags: list[str] | None = None,
                     title: str = "", url: str = "", size: int = 0) -> dict[str, Any]:
        """A file attached to a message (as `PUT /<topic>` does); `url` names one hosted elsewhere."""
        file_id = uuid.uuid4().hex[:12]
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        self.files[file_id] = (data, kind)
        extension = name.rsplit(".", 1)[-1] if "." in name else "bin"
        attachment = {"name": name, "type": kind, "size": size or len(data), "expires": int(time.time()) + 10800,
                      "url": url or f"{self.url}/file/{file_id}.{extension}"}
        return self.publish(topic, text or f"You received a file: {name}", title=title, tags=tags,
                            attachment=attachment)

    def bot_files(self, topic: str) -> list[tuple[str, str, bytes]]:
        """(name, type, bytes) of each file the bot attached."""
        return [(m["attachment"]["name"], m["attachment"]["type"],
                 self.files[m["attachment"]["url"].rsplit("/", 1)[1].split(".")[0]][0])
                for m in self.messages if m["topic"] == topic and "attachment" in m and "agentd" in m.get("tags", [])]

    def publish(self, topic: str, text: str, title: str = "", tags: list[str] | None = None,
                attachment: dict[str, Any] | None = None) -> dict[str, Any]:
        with self.cond:
            message = {"id": uuid.uuid4().hex[:12], "time": int(time.time()), "event": "message",
                       "topic": topic, "message": text}
            if attachment:
                message["attachment"] = attachment
            if title:
                message["title"] = title
            if tags:
                message["tags"] = tags
            self.messages.append(message)
            self.cond.notify_all()
            return message

    def bot_messages(self, topic: str) -> list[str]:
        return [m["message"] for m in self.messages if m["topic"] == topic and "agentd" in m.get("tags", [])
                and "attachment" not in m]
