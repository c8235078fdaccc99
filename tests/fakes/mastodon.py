"""A fake Mastodon server (https://docs.joinmastodon.org/methods/): Bearer token,
`GET /api/v1/accounts/verify_credentials`, `GET /api/v2/instance` (naming its streaming
URL, as a real instance does), the user stream `GET /api/v1/streaming/user` (SSE:
`event: notification` + JSON, `:thump` heartbeats), `GET /api/v1/notifications`
(`since_id`, `types[]`) and `POST /api/v1/statuses` (500 characters at most,
`in_reply_to_id` must exist, visibility one of the four). A user's status mentioning the
bot is rendered as Mastodon renders it (HTML, h-card mention link) and notified.

Media (https://docs.joinmastodon.org/methods/media/): `POST /api/v2/media` (multipart
`file`, optional `description`) answers 200 with the attachment for an image (images, video and
audio only; 422 for other types) and 202 with
`url: null` for anything else, which `GET /api/v1/media/{id}` then answers 206 once and 200
after; a status may carry `media_ids` (then `status` may be empty; an unprocessed or
unknown id is 422). Files are served from the media host, `localhost:<port>` (the host of
the instance's `thumbnail` and the bot's avatar), under `/system/media_attachments/...`.

Follows FakePlatform's contract (`sent`, `throttle`, `polls`, `restart`)."""

from __future__ import annotations

import html
import json
import queue
import time
from typing import Any

from flask import Response, jsonify, request

from fakes.platform import FakePlatform

VISIBILITIES = ("public", "unlisted", "private", "direct")


class FakeMastodon(FakePlatform):
    def __init__(self, token: str) -> None:
        super().__init__("mastodon")
        self.token = token
        self.bot = {"id": "109000000000000001", "username": "helper", "acct": "helper",
                    "display_name": "Helper", "url": "https://social.test/@helper"}
        self.media: dict[str, dict[str, Any]] = {}
        self.async_media = False  # every upload answered 202 (still processing), as a busy instance does
        self.downloads: list[str] = []
        self.media_posts: list[dict[str, Any]] = []  # the bot's statuses carrying media
        self.statuses: dict[str, dict[str, Any]] = {}
        self.notifications: list[dict[str, Any]] = []
        self.streams: list["queue.Queue[str]"] = []
        app = self.app

        @app.get("/system/media_attachments/files/<media_id>/original/<name>")
        def media_file(media_id: str, name: str):
            item = self.media.get(media_id)
            if item is None or request.host != self.media_host:
                return jsonify({"error": "Not found"}), 404
            self.downloads.append(name)
            return item["data"], 200, {"Content-Type": item["content_type"]}

        @app.post("/api/v2/media")
        def upload_media():
            part = request.files.get("file")
            if part is None:
                return jsonify({"error": "Validation failed: File can't be blank"}), 422
            if part.mimetype.split("/")[0] not in ("image", "video", "audio"):
                return jsonify({"error": "Validation failed: File content type is invalid"}), 422
            item = self._media(part.filename or "file", part.mimetype, part.read())
            item["description"] = request.form.get("description")
            if item["type"] == "image" and not self.async_media:
                return jsonify(self._shown(item))
            item["pending"] = 2  # processed after being asked about twice
            return jsonify({**self._shown(item), "url": None}), 202

        @app.get("/api/v1/media/<media_id>")
        def get_media(media_id: str):
            item = self.media.get(media_id)
            if item is None:
                return jsonify({"error": "Record not found"}), 404
            if item.get("pending"):
                item["pending"] -= 1
                return jsonify({**self._shown(item), "url": None}), 206
            return jsonify(self._shown(item))

        @app.before_request
        def auth():
            if request.path.startswith("/system/"):
                return None  # media files are public
            given = request.headers.get("Authorization") or f"Bearer {request.args.get('access_token')}"
            if given != f"Bearer {self.token}":
                return jsonify({"error": "The access token is invalid"}), 401

        @app.get("/api/v1/accounts/verify_credentials")
        def me():
            return jsonify({**self.bot, "avatar": f"http://{self.media_host}/accounts/avatars/original/1.png",
                            "header": f"http://{self.media_host}/headers/original/missing.png"})

        @app.get("/api/v2/instance")
        def instance():
            return jsonify({"domain": "social.test", "title": "Fake", "version": "4.3.0",
                            "thumbnail": {"url": f"http://{self.media_host}/site_uploads/files/thumbnail.png"},
                            "configuration": {"urls": {"streaming": f"ws://127.0.0.1:{self.port}"},
                                              "statuses": {"max_characters": 500}}})

        @app.get("/api/v1/streaming/user")
        def stream():
            self.polled()
            outbox: "queue.Queue[str]" = queue.Queue()
            self.streams.append(outbox)

            def events():
                try:
                    yield ":)\n\n"
                    while True:
                        try:
                            yield outbox.get(timeout=0.5)
                        except queue.Empty:
                            yield ":thump\n\n"
                finally:
                    self.streams.remove(outbox)

            return Response(events(), mimetype="text/event-stream")

        @app.get("/api/v1/notifications")
        def notifications():
            self.polled()
            since = int(request.args.get("since_id") or 0)
            types = request.args.getlist("types[]")
            found = [n for n in self.notifications if int(n["id"]) > since and (not types or n["type"] in types)]
            return jsonify(list(reversed(found))[: int(request.args.get("limit") or 40)])

        @app.post("/api/v1/statuses")
        def post_status():
            limited = self.throttled({"error": "Too many requests"})
            if limited is not None:
                return limited
            body = request.get_json(silent=True) or request.form.to_dict()
            text, reply_to = body.get("status") or "", body.get("in_reply_to_id")
            visibility = body.get("visibility") or "public"
            media_ids = body.get("media_ids") or request.form.getlist("media_ids[]")
            if any(m not in self.media or self.media[m].get("pending") for m in media_ids):
                return jsonify({"error": "Cannot attach files that have not finished processing. "
                                         "Try again in a moment!"}), 422
            if not (text or media_ids) or len(text) > 500 or visibility not in VISIBILITIES:
                return jsonify({"error": "Validation failed: Text character limit of 500 exceeded"}), 422
            if reply_to and reply_to not in self.statuses:
                return jsonify({"error": "Record not found"}), 404
            status = self._status(self.bot, text, visibility, reply_to)
            parent = self.statuses.get(reply_to or "")
            status["thread_user"] = parent["thread_user"] if parent else ""
            if media_ids:
                status["media_attachments"] = [self._shown(self.media[m]) for m in media_ids]
                self.media_posts.append({"id": status["id"], "status": text, "in_reply_to_id": reply_to,
                                         "visibility": visibility, "media": [self.media[m] for m in media_ids]})
            else:
                self.record(id=status["id"], status=text, in_reply_to_id=reply_to, visibility=visibility,
                            to=status["thread_user"])
            return jsonify({k: v for k, v in status.items() if k != "thread_user"})

    def _status(self, account: dict[str, Any], content: str, visibility: str,
                reply_to: str | None = None) -> dict[str, Any]:
        status = {"id": str(self.new_id() * 1000), "created_at": "2026-11-23T12:00:00.000Z",
                  "in_reply_to_id": reply_to, "visibility": visibility, "content": content,
                  "account": account, "mentions": [], "thread_user": account["acct"]}
        self.statuses[status["id"]] = status
        return status

    @property
    def media_host(self) -> str:
        return f"localhost:{self.port}"

    def _media(self, filename: str, content_type: str, data: bytes) -> dict[str, Any]:
        kind = content_type.split("/")[0]
        item = {"id": str(self.new_id() * 1000 + 7), "type": kind if kind in ("image", "video", "audio") else "unknown",
                "filename": filename, "content_type": content_type, "data": data, "description": None}
        self.media[item["id"]] = item
        return item

    def _shown(self, item: dict[str, Any]) -> dict[str, Any]:
        url = f"http://{self.media_host}/system/media_attachments/files/{item['id']}/original/{item['filename']}"
        return {"id": item["id"], "type": item["type"], "url": url, "preview_url": url, "remote_url": None,
                "description": item["description"], "meta": {}, "blurhash": None}

    def user_sends_file(self, user: str, data: bytes, filename: str, content_type: str, text: str = "",
                        url: str = "") -> str:
        """`user` posts a status with one media attachment (served from the media host unless `url`)."""
        shown = self._shown(self._media(filename, content_type, data))
        if url:
            shown.update(url=url, remote_url=url)
        return self.user_says(user, text, media=[shown])

    def user_says(self, user: str, text: str, visibility: str = "public",
                  media: list[dict[str, Any]] | None = None) -> str:
        """`user` (a remote account `user@other.test`) posts a status mentioning the bot."""
        account = {"id": f"2{abs(hash(user)) % 10 ** 8}", "username": user.split("@")[0], "acct": user,
                   "display_name": user.title(), "url": f"https://other.test/@{user}"}
        content = (f'<p><span class="h-card" translate="no"><a href="{self.bot["url"]}" class="u-url mention">'
                   f'@<span>helper</span></a></span> {html.escape(text)}</p>')
        status = self._status(account, content, visibility)
        status["mentions"] = [{k: self.bot[k] for k in ("id", "username", "acct", "url")}]
        status["media_attachments"] = media or []
        notification = {"id": str(self.new_id()), "type": "mention", "created_at": status["created_at"],
                        "account": account, "status": {k: v for k, v in status.items() if k != "thread_user"}}
        self.notifications.append(notification)
        frame = f"event: notification\ndata: {json.dumps(notification)}\n\n"
        for outbox in list(self.streams):
            outbox.put(frame)
        return user

    def replies(self, user: str) -> list[str]:
        """The bot's statuses in threads `user` started, without the leading `@user `."""
        prefix = f"@{user} "
        return [s["status"][len(prefix):] if s["status"].startswith(prefix) else s["status"]
                for s in self.sent if s["to"] == user]

    def wait_streaming(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.streams and time.monotonic() < deadline:
            time.sleep(0.05)
