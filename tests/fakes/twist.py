"""A fake Twist API v3 (https://developer.twist.com/v3/): Bearer auth,
`GET users/get_session_user`, `GET channels/get?workspace_id=`,
`GET threads/get?channel_id=&newer_than_ts=`, `GET comments/get?thread_id=&newer_than_ts=`,
`POST comments/add` {thread_id, content} answering the comment."""

from __future__ import annotations

import time
from typing import Any

from flask import jsonify, request

from fakes.platform import FakePlatform

BOT_ID, WORKSPACE = 700, 42
CHANNELS = {301: "general", 302: "random"}
USERS = {"ann": 701, "mallory": 702, "bob": 703}
V3 = "/api/v3/"


class FakeTwist(FakePlatform):
    def __init__(self, token: str) -> None:
        super().__init__("twist")
        self.comments: list[dict[str, Any]] = []
        self.threads = {401: 301, 402: 302}  # thread -> channel
        app = self.app

        @app.before_request
        def auth():
            if request.headers.get("Authorization") != f"Bearer {token}":
                return jsonify({"error_code": 200, "error_string": "Invalid token"}), 401

        @app.get(V3 + "users/get_session_user")
        def me():
            return jsonify({"id": BOT_ID, "name": "Agent Bot", "short_name": "Agent", "bot": True})

        @app.get(V3 + "channels/get")
        def channels():
            self.polled()
            assert int(request.args["workspace_id"]) == WORKSPACE
            return jsonify([{"id": i, "name": n, "workspace_id": WORKSPACE, "archived": False}
                            for i, n in CHANNELS.items()])

        @app.get(V3 + "threads/get")
        def threads():
            channel, since = int(request.args["channel_id"]), int(request.args.get("newer_than_ts", 0))
            out = []
            for thread, owner in self.threads.items():
                times = [c["posted_ts"] for c in self.comments if c["thread_id"] == thread]
                if owner == channel and times and max(times) > since:
                    out.append({"id": thread, "channel_id": channel, "title": f"Thread {thread}",
                                "last_updated_ts": max(times), "workspace_id": WORKSPACE})
            return jsonify(out)

        @app.get(V3 + "comments/get")
        def comments():
            thread, since = int(request.args["thread_id"]), int(request.args.get("newer_than_ts", 0))
            return jsonify([c for c in self.comments if c["thread_id"] == thread and c["posted_ts"] > since])

        @app.post(V3 + "comments/add")
        def add():
            limited = self.throttled({"error_code": 429, "error_string": "Too many requests"})
            if limited is not None:
                return limited
            body = request.get_json(silent=True) or request.form
            made = self._add(BOT_ID, "Agent Bot", int(body["thread_id"]), body["content"])
            self.record(**made)
            return jsonify(made)

    def _add(self, creator: int, name: str, thread: int, content: str) -> dict[str, Any]:
        comment = {"id": self.new_id(), "thread_id": thread, "channel_id": self.threads[thread], "content": content,
                   "creator": creator, "creator_name": name, "posted_ts": int(time.time()),
                   "workspace_id": WORKSPACE}
        self.comments.append(comment)
        return comment

    def user_says(self, user: str, text: str, thread: int = 401) -> int:
        """A comment by `user` in `thread`; returns the thread id."""
        self._add(USERS.get(user, 799), user, thread, text)
        return thread

    def replies(self, thread: int) -> list[str]:
        return [c["content"] for c in self.sent if c["thread_id"] == thread]
