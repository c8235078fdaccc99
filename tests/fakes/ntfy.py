"""A fake ntfy server (https://docs.ntfy.sh): publish with `POST /<topic>` (body = message,
Title/Tags headers, Bearer auth) and subscribe with `GET /<topic>/sse` (`since=` id,
`all` or `none`; an `open` event, then `message` events, keepalives)."""

from __future__ import annotations

import json
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

    def publish(self, topic: str, text: str, title: str = "", tags: list[str] | None = None) -> dict[str, Any]:
        with self.cond:
            message = {"id": uuid.uuid4().hex[:12], "time": int(time.time()), "event": "message",
                       "topic": topic, "message": text}
            if title:
                message["title"] = title
            if tags:
                message["tags"] = tags
            self.messages.append(message)
            self.cond.notify_all()
            return message

    def bot_messages(self, topic: str) -> list[str]:
        return [m["message"] for m in self.messages if m["topic"] == topic and "agentd" in m.get("tags", [])]
