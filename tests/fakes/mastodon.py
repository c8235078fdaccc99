"""A fake Mastodon server (https://docs.joinmastodon.org/methods/): Bearer token,
`GET /api/v1/accounts/verify_credentials`, `GET /api/v2/instance` (naming its streaming
URL, as a real instance does), the user stream `GET /api/v1/streaming/user` (SSE:
`event: notification` + JSON, `:thump` heartbeats), `GET /api/v1/notifications`
(`since_id`, `types[]`) and `POST /api/v1/statuses` (500 characters at most,
`in_reply_to_id` must exist, visibility one of the four). A user's status mentioning the
bot is rendered as Mastodon renders it (HTML, h-card mention link) and notified.

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
        self.statuses: dict[str, dict[str, Any]] = {}
        self.notifications: list[dict[str, Any]] = []
        self.streams: list["queue.Queue[str]"] = []
        app = self.app

        @app.before_request
        def auth():
            given = request.headers.get("Authorization") or f"Bearer {request.args.get('access_token')}"
            if given != f"Bearer {self.token}":
                return jsonify({"error": "The access token is invalid"}), 401

        @app.get("/api/v1/accounts/verify_credentials")
        def me():
            return jsonify(self.bot)

        @app.get("/api/v2/instance")
        def instance():
            return jsonify({"domain": "social.test", "title": "Fake", "version": "4.3.0",
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
            if not text or len(text) > 500 or visibility not in VISIBILITIES:
                return jsonify({"error": "Validation failed: Text character limit of 500 exceeded"}), 422
            if reply_to and reply_to not in self.statuses:
                return jsonify({"error": "Record not found"}), 404
            status = self._status(self.bot, text, visibility, reply_to)
            parent = self.statuses.get(reply_to or "")
            status["thread_user"] = parent["thread_user"] if parent else ""
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

    def user_says(self, user: str, text: str, visibility: str = "public") -> str:
        """`user` (a remote account `user@other.test`) posts a status mentioning the bot."""
        account = {"id": f"2{abs(hash(user)) % 10 ** 8}", "username": user.split("@")[0], "acct": user,
                   "display_name": user.title(), "url": f"https://other.test/@{user}"}
        content = (f'<p><span class="h-card" translate="no"><a href="{self.bot["url"]}" class="u-url mention">'
                   f'@<span>helper</span></a></span> {html.escape(text)}</p>')
        status = self._status(account, content, visibility)
        status["mentions"] = [{k: self.bot[k] for k in ("id", "username", "acct", "url")}]
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
