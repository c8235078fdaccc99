"""A fake of LinkedIn's versioned REST API for organization messages (Rest.li 2.0
conventions, https://learn.microsoft.com/linkedin/shared/api-guide/concepts): Bearer
token, `LinkedIn-Version` + `X-Restli-Protocol-Version: 2.0.0` required;
`GET /rest/messages?q=organization&organization=<urn>&createdAfter=<ms>` -> {elements,
paging}; `POST /rest/messages` {author, recipients, thread, body: {text}} -> 201 with the
new message's URN in `x-restli-id`."""

from __future__ import annotations

import time
from typing import Any

from flask import jsonify, request

from fakes.platform import FakePlatform

ORG = "urn:li:organization:5515"


class FakeLinkedIn(FakePlatform):
    def __init__(self, token: str) -> None:
        super().__init__("linkedin")
        self.messages: list[dict[str, Any]] = []
        app = self.app

        @app.before_request
        def auth():
            if request.headers.get("Authorization") != f"Bearer {token}":
                return jsonify({"status": 401, "serviceErrorCode": 65600, "code": "INVALID_ACCESS_TOKEN",
                                "message": "Invalid access token"}), 401
            if not request.headers.get("LinkedIn-Version") or request.headers.get("X-Restli-Protocol-Version") != "2.0.0":
                return jsonify({"status": 426, "code": "NONEXISTENT_VERSION", "message": "Requested version  is not active"}), 426

        @app.get("/rest/messages")
        def finder():
            if request.args.get("q") != "organization" or request.args.get("organization") != ORG:
                return jsonify({"status": 400, "message": "Invalid finder"}), 400
            self.polled()
            after = int(request.args.get("createdAfter", 0))
            found = [m for m in self.messages if m["createdAt"] > after]
            return jsonify({"elements": found, "paging": {"start": 0, "count": len(found), "total": len(found)}})

        @app.post("/rest/messages")
        def create():
            limited = self.throttled({"status": 429, "message": "Resource level throttle limit exceeded."})
            if limited is not None:
                return limited
            body = request.get_json()
            if body.get("author") != ORG or not body.get("recipients") or not (body.get("body") or {}).get("text"):
                return jsonify({"status": 422, "message": "Invalid message"}), 422
            made = self._add(ORG, body["body"]["text"], body.get("thread") or f"urn:li:messagingThread:{self.new_id()}")
            made["recipients"] = body["recipients"]
            self.record(**made)
            response = jsonify({})
            response.status_code = 201
            response.headers["x-restli-id"] = made["entityUrn"]
            return response

    def _add(self, author: str, text: str, thread: str) -> dict[str, Any]:
        message = {"entityUrn": f"urn:li:message:{self.new_id()}", "author": author, "thread": thread,
                   "body": {"text": text}, "createdAt": int(time.time() * 1000)}
        self.messages.append(message)
        return message

    def user_says(self, user: str, text: str) -> str:
        """Member `user` writes to the organization in their own thread; returns the thread URN."""
        thread = f"urn:li:messagingThread:{user}"
        self._add(f"urn:li:person:{user}", text, thread)
        return thread

    def replies(self, thread: str) -> list[str]:
        return [m["body"]["text"] for m in self.sent if m["thread"] == thread]
