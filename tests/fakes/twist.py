"""A fake Twist API v3 (https://developer.twist.com/v3/): Bearer auth,
`GET users/get_session_user`, `GET channels/get?workspace_id=`,
`GET threads/get?channel_id=&newer_than_ts=`, `GET comments/get?thread_id=&newer_than_ts=`,
`POST comments/add` {thread_id, content, attachments} answering the comment.

Attachments: `POST attachments/upload` (multipart `file` plus `file_name`, `file_size`,
`underlying_type` and the client's `attachment_id`; the declared size must match) answers
the attachment object (`attachment_id`, `title`, `url`, `url_type`, `file_name`,
`file_size`, `underlying_type`, `upload_state`, image size for images); a comment may carry
attachments this upload returned. Files are served from `/files/<attachment_id>/<name>`
with the Bearer token (the file host is the API's own here).

Reactions: `POST reactions/add` and `reactions/remove` with one of `thread_id`, `comment_id` or
`conversation_message_id` and `emoji`; `reactions` maps a comment id to the bot's emoji on it."""

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
        self.files: dict[str, dict[str, Any]] = {}  # attachment_id -> attachment + data
        self.downloads: list[str] = []
        self.file_comments: list[dict[str, Any]] = []  # the bot's comments carrying attachments
        self.reactions: dict[int, list[str]] = {}  # comment id -> the bot's emoji on it, in order
        self.removed: list[tuple[int, str]] = []
        app = self.app

        @app.post(V3 + "reactions/<verb>")
        def react(verb: str):
            body = request.get_json(silent=True) or request.form
            targets = [k for k in ("thread_id", "comment_id", "conversation_message_id") if body.get(k)]
            if verb not in ("add", "remove") or len(targets) != 1 or not body.get("emoji"):
                return jsonify({"error_code": 20, "error_string": "Required argument is missing"}), 400
            comment = int(body.get("comment_id") or 0)
            if targets != ["comment_id"] or not any(c["id"] == comment for c in self.comments):
                return jsonify({"error_code": 404, "error_string": "Not found"}), 404
            on = self.reactions.setdefault(comment, [])
            if verb == "add" and body["emoji"] not in on:
                on.append(body["emoji"])
            elif verb == "remove" and body["emoji"] in on:
                on.remove(body["emoji"])
                self.removed.append((comment, body["emoji"]))
            return jsonify({})

        @app.post(V3 + "attachments/upload")
        def upload():
            part, form = request.files.get("file"), request.form
            if part is None or not form.get("attachment_id") or not form.get("file_name"):
                return jsonify({"error_code": 20, "error_string": "Required argument is missing"}), 400
            data = part.read()
            if str(len(data)) != form.get("file_size"):
                return jsonify({"error_code": 20, "error_string": "file_size does not match the file"}), 400
            item = self._file(form["attachment_id"], form["file_name"], form.get("underlying_type") or "", data)
            return jsonify({k: v for k, v in item.items() if k != "data"})

        @app.get("/files/<attachment_id>/<name>")
        def download(attachment_id: str, name: str):
            item = self.files.get(attachment_id)
            if item is None or item["file_name"] != name:
                return jsonify({"error_code": 404, "error_string": "Not found"}), 404
            self.downloads.append(name)
            return item["data"], 200, {"Content-Type": item["underlying_type"]}

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
            attached = body.get("attachments") or []
            if any(not isinstance(a, dict) or a.get("attachment_id") not in self.files for a in attached):
                return jsonify({"error_code": 20, "error_string": "Unknown attachment"}), 400
            made = self._add(BOT_ID, "Agent Bot", int(body["thread_id"]), body["content"],
                             attachments=[{k: v for k, v in self.files[a["attachment_id"]].items() if k != "data"}
                                          for a in attached])
            if attached:
                self.file_comments.append({**made, "files": [self.files[a["attachment_id"]] for a in attached]})
            else:
                self.record(**made)
            return jsonify(made)

    def _file(self, attachment_id: str, name: str, kind: str, data: bytes) -> dict[str, Any]:
        item = {"attachment_id": attachment_id, "title": name, "url": f"{self.url}/files/{attachment_id}/{name}",
                "url_type": "file", "file_name": name, "file_size": len(data), "underlying_type": kind,
                "upload_state": "uploaded", "data": data}
        if kind.startswith("image/"):
            item.update(image=item["url"], image_width=1, image_height=1)
        self.files[attachment_id] = item
        return item

    def user_sends_file(self, user: str, data: bytes, name: str, kind: str, text: str, thread: int = 401,
                        url: str = "") -> int:
        """A comment by `user` with one uploaded file (or an attachment pointing at `url`)."""
        item = {k: v for k, v in self._file(f"att-{self.new_id()}", name, kind, data).items() if k != "data"}
        if url:
            item["url"] = url
        self._add(USERS.get(user, 799), user, thread, text, attachments=[item])
        return thread

    def _add(self, creator: int, name: str, thread: int, content: str,
             attachments: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        comment = {"id": self.new_id(), "thread_id": thread, "channel_id": self.threads[thread], "content": content,
                   "creator": creator, "creator_name": name, "posted_ts": int(time.time()),
                   "workspace_id": WORKSPACE, "attachments": attachments or []}
        self.comments.append(comment)
        return comment

    def user_says(self, user: str, text: str, thread: int = 401) -> int:
        """A comment by `user` in `thread`; returns the thread id."""
        self._add(USERS.get(user, 799), user, thread, text)
        return thread

    def replies(self, thread: int) -> list[str]:
        return [c["content"] for c in self.sent if c["thread_id"] == thread]
