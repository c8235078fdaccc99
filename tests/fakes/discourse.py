"""A fake Discourse forum (https://docs.discourse.org): `Api-Key`/`Api-Username`
headers, `GET /posts.json` (latest posts, newest first), `GET /categories.json`,
`POST /posts.json` {topic_id, raw, reply_to_post_number} answering the created post;
429 with Retry-After and Discourse's rate-limit body."""

from __future__ import annotations

import time
from typing import Any

from flask import jsonify, request

from fakes.platform import FakePlatform

BOT = "agentbot"
CATEGORIES = {4: "support", 5: "lounge"}


class FakeDiscourse(FakePlatform):
    def __init__(self, api_key: str) -> None:
        super().__init__("discourse")
        self.posts: list[dict[str, Any]] = []
        self.next_topic = 40
        app = self.app

        @app.before_request
        def auth():
            if request.headers.get("Api-Key") != api_key or request.headers.get("Api-Username") != BOT:
                return jsonify({"errors": ["You are not permitted to view the requested resource."],
                                "error_type": "invalid_access"}), 403

        @app.get("/posts.json")
        def latest():
            self.polled()
            return jsonify({"latest_posts": sorted(self.posts, key=lambda p: -p["id"])[:50]})

        @app.get("/categories.json")
        def categories():
            return jsonify({"category_list": {"categories": [{"id": i, "slug": s, "name": s.title()}
                                                             for i, s in CATEGORIES.items()]}})

        @app.post("/posts.json")
        def create():
            limited = self.throttled({"errors": ["You’ve performed this action too many times."],
                                      "error_type": "rate_limit", "extras": {"wait_seconds": 1}})
            if limited is not None:
                return limited
            body = request.get_json()
            topic = next((p for p in self.posts if p["topic_id"] == body["topic_id"]), None)
            if topic is None:
                return jsonify({"errors": ["Topic not found"], "error_type": "not_found"}), 404
            post = self._post(BOT, body["raw"], body["topic_id"], topic["category_id"])
            post["reply_to_post_number"] = body.get("reply_to_post_number")
            self.record(**post)
            return jsonify(post)

    def _post(self, username: str, raw: str, topic: int, category: int) -> dict[str, Any]:
        with self.lock:
            number = 1 + sum(1 for p in self.posts if p["topic_id"] == topic)
            post = {"id": self.new_id(), "username": username, "name": username.title(), "raw": raw,
                    "cooked": f"<p>{raw}</p>", "topic_id": topic, "topic_slug": f"topic-{topic}",
                    "post_number": number, "post_type": 1, "category_id": category,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())}
            self.posts.append(post)
            return post

    def user_says(self, user: str, text: str, topic: int = 0, category: int = 5) -> int:
        """A user posts (a new topic unless `topic` is given); returns the topic id."""
        if not topic:
            self.next_topic += 1
            topic = self.next_topic
        self._post(user, text, topic, category)
        return topic

    def replies(self, topic: int) -> list[str]:
        return [p["raw"] for p in self.sent if p["topic_id"] == topic]
