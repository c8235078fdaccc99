"""A fake Discourse forum (https://docs.discourse.org): `Api-Key`/`Api-Username`
headers, `GET /posts.json` (latest posts, newest first), `GET /categories.json`,
`POST /posts.json` {topic_id, raw, reply_to_post_number} answering the created post;
429 with Retry-After and Discourse's rate-limit body.

Uploads: `POST /uploads.json` (multipart `file`, `type` one of Discourse's upload types,
`synchronous`) answers the upload (`id`, `url`, `short_url` upload://..., `original_filename`,
`filesize`, `human_filesize`, `width`/`height` for an image; 422 for an extension not in
`authorized_extensions`); files are served from `/uploads/default/original/1X/<sha1>.<ext>`
with the API headers (a login-required forum). A post's raw may name `upload://` short
URLs of existing uploads, which its cooked HTML shows as Discourse does: an image in a
lightbox link, any other file as `<a class="attachment">`."""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from flask import jsonify, request

from fakes.platform import FakePlatform

BOT = "agentbot"
CATEGORIES = {4: "support", 5: "lounge"}
AUTHORIZED = ("jpg", "jpeg", "png", "gif", "webp", "txt", "pdf", "md")
UPLOAD_TYPES = ("avatar", "profile_background", "card_background", "custom_emoji", "composer")
SHORT = re.compile(r"(!?)\[([^\]|]*)(?:\|[^\]]*)?\]\((upload://[^)]+)\)")


class FakeDiscourse(FakePlatform):
    def __init__(self, api_key: str) -> None:
        super().__init__("discourse")
        self.posts: list[dict[str, Any]] = []
        self.next_topic = 40
        self.uploads: dict[str, dict[str, Any]] = {}  # short_url -> upload + data
        self.downloads: list[str] = []
        self.redirect_files = ""
        app = self.app

        @app.post("/uploads.json")
        def upload():
            part = request.files.get("file")
            if part is None or request.form.get("type") not in UPLOAD_TYPES:
                return jsonify({"errors": ["param is missing or the value is empty: file/type"],
                                "error_type": "invalid_parameters"}), 400
            ext = (part.filename or "").rsplit(".", 1)[-1].lower()
            if ext not in AUTHORIZED:
                return jsonify({"errors": ["Sorry, the file you are trying to upload is not authorized "
                                           f"(authorized extensions: {', '.join(AUTHORIZED)})."]}), 422
            item = self._upload(part.filename, part.mimetype, part.read())
            return jsonify({k: v for k, v in item.items() if k not in ("data", "content_type")})

        @app.get("/uploads/default/original/1X/<name>")
        def download(name: str):
            item = next((u for u in self.uploads.values() if u["url"].endswith("/" + name)), None)
            if item is None:
                return "not found", 404
            self.downloads.append(item["original_filename"])
            if self.redirect_files:
                return "", 302, {"Location": self.redirect_files}
            return item["data"], 200, {"Content-Type": item["content_type"]}

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
            if any(m.group(3) not in self.uploads for m in SHORT.finditer(body["raw"])):
                return jsonify({"errors": ["An upload this post names does not exist"],
                                "error_type": "invalid_parameters"}), 422
            post = self._post(BOT, body["raw"], body["topic_id"], topic["category_id"])
            post["reply_to_post_number"] = body.get("reply_to_post_number")
            self.record(**post)
            return jsonify(post)

    def _post(self, username: str, raw: str, topic: int, category: int) -> dict[str, Any]:
        with self.lock:
            number = 1 + sum(1 for p in self.posts if p["topic_id"] == topic)
            post = {"id": self.new_id(), "username": username, "name": username.title(), "raw": raw,
                    "cooked": f"<p>{SHORT.sub(self._cooked, raw)}</p>", "topic_id": topic, "topic_slug": f"topic-{topic}",
                    "post_number": number, "post_type": 1, "category_id": category,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())}
            self.posts.append(post)
            return post

    def _upload(self, filename: str, content_type: str, data: bytes) -> dict[str, Any]:
        sha = hashlib.sha1(data + filename.encode()).hexdigest()
        ext = filename.rsplit(".", 1)[-1].lower()
        item = {"id": self.new_id(), "url": f"/uploads/default/original/1X/{sha}.{ext}",
                "original_filename": filename, "filesize": len(data), "human_filesize": f"{len(data)} Bytes",
                "extension": ext, "short_url": f"upload://{sha[:27]}.{ext}", "short_path": f"/uploads/short-url/"
                f"{sha[:27]}.{ext}", "content_type": content_type, "data": data}
        if content_type.startswith("image/"):
            item.update(width=1, height=1, thumbnail_width=1, thumbnail_height=1)
        self.uploads[item["short_url"]] = item
        return item

    def _cooked(self, match: "re.Match[str]") -> str:
        item = self.uploads.get(match.group(3))
        if item is None:
            return match.group(0)
        if match.group(1):
            return (f'<div class="lightbox-wrapper"><a class="lightbox" href="{self.url}{item["url"]}" '
                    f'data-download-href="/uploads/default/{item["short_url"][9:]}?dl=1" title="{match.group(2)}">'
                    f'<img src="{self.url}/uploads/default/optimized/1X/x_1x1.png" alt="{match.group(2)}" '
                    f'width="1" height="1"></a></div>')
        return f'<a class="attachment" href="{item["url"]}">{match.group(2)}</a>'

    def user_sends_file(self, user: str, data: bytes, filename: str, content_type: str, text: str,
                        topic: int = 0, url: str = "") -> int:
        """A user posts `text` and a file uploaded the way the composer does (or an image at `url`)."""
        if url:
            return self.user_says(user, f'{text}\n<img src="{url}">', topic)
        item = self._upload(filename, content_type, data)
        if content_type.startswith("image/"):
            return self.user_says(user, f"{text}\n![{filename}|1x1]({item['short_url']})", topic)
        return self.user_says(user, f"{text}\n[{filename}|attachment]({item['short_url']}) "
                                    f"({item['human_filesize']})", topic)

    def user_says(self, user: str, text: str, topic: int = 0, category: int = 5) -> int:
        """A user posts (a new topic unless `topic` is given); returns the topic id."""
        if not topic:
            self.next_topic += 1
            topic = self.next_topic
        self._post(user, text, topic, category)
        return topic

    def replies(self, topic: int) -> list[str]:
        return [p["raw"] for p in self.sent if p["topic_id"] == topic]
