"""A fake Reddit API (https://www.reddit.com/dev/api, https://github.com/reddit-archive/reddit/wiki/OAuth2):
`POST /api/v1/access_token` (password grant, client credentials as HTTP Basic) on the
auth host; on the API host (`bearer` token, User-Agent required)
`GET /r/{sub}/comments/new.json` (a Listing of t1 comments, newest first) and
`POST /api/comment` (form api_type=json, thing_id, text)."""

from __future__ import annotations

import time
from typing import Any

from flask import jsonify, request

from fakes.platform import FakePlatform

BOT, CLIENT_ID = "agentd_bot", "client-id-1"


class FakeReddit(FakePlatform):
    def __init__(self, secret: str, password: str) -> None:
        super().__init__("reddit")
        self.comments: list[dict[str, Any]] = []
        self.tokens: list[str] = []
        app = self.app

        @app.post("/api/v1/access_token")
        def access_token():
            auth = request.authorization
            if auth is None or (auth.username, auth.password) != (CLIENT_ID, secret):
                return jsonify({"message": "Unauthorized", "error": 401}), 401
            form = request.form
            if (form.get("grant_type"), form.get("username"), form.get("password")) != ("password", BOT, password):
                return jsonify({"error": "invalid_grant"})  # Reddit answers 200 with an error field
            self.tokens.append(f"tok-{self.new_id()}")
            return jsonify({"access_token": self.tokens[-1], "token_type": "bearer", "expires_in": 86400,
                            "scope": "*"})

        def authorised() -> bool:
            return bool(self.tokens) and request.headers.get("Authorization") == f"bearer {self.tokens[-1]}" \
                and "agentd" in request.headers.get("User-Agent", "")

        @app.get("/r/<sub>/comments/new.json")
        def new_comments(sub: str):
            if not authorised():
                return jsonify({"message": "Unauthorized", "error": 401}), 401
            self.polled()
            children = [{"kind": "t1", "data": c} for c in reversed(self.comments) if c["subreddit"] == sub]
            return jsonify({"kind": "Listing", "data": {"after": None, "before": None, "dist": len(children),
                                                        "children": children[:int(request.args.get("limit", 25))]}})

        @app.post("/api/comment")
        def comment():
            if not authorised():
                return jsonify({"message": "Unauthorized", "error": 401}), 401
            limited = self.throttled({"message": "Too Many Requests", "error": 429})
            if limited is not None:
                return limited
            form = request.form
            parent = next((c for c in self.comments if c["name"] == form["thing_id"]), None)
            if form.get("api_type") != "json" or parent is None:
                return jsonify({"json": {"errors": [["NOT_FOUND", "that thing does not exist", "thing_id"]]}})
            made = self._add(BOT, form["text"], parent["subreddit"], parent["link_id"], parent["name"])
            self.record(**made)
            return jsonify({"json": {"errors": [], "data": {"things": [{"kind": "t1", "data": made}]}}})

    def _add(self, author: str, body: str, sub: str, link: str, parent: str) -> dict[str, Any]:
        cid = f"c{self.new_id()}"
        comment = {"id": cid, "name": f"t1_{cid}", "author": author, "body": body, "subreddit": sub,
                   "link_id": link, "parent_id": parent, "created_utc": time.time(), "permalink": f"/r/{sub}/{cid}"}
        self.comments.append(comment)
        return comment

    def user_says(self, user: str, text: str, sub: str = "agents", parent: str = "") -> str:
        """A comment on the post t3_post1 (or under `parent`); returns the comment's fullname."""
        return self._add(user, text, sub, "t3_post1", parent or "t3_post1")["name"]

    def replies(self, parent: str) -> list[str]:
        return [c["body"] for c in self.sent if c["parent_id"] == parent]
