"""A fake Nextcloud Talk server (https://nextcloud-talk.readthedocs.io): OCS v2 envelope,
`OCS-APIRequest: true` required, Bearer auth; `GET /ocs/v2.php/cloud/user`,
`GET .../spreed/api/v4/room`, chat `GET .../spreed/api/v1/chat/{token}` with
lookIntoFuture=1 + lastKnownMessageId + timeout (304 when nothing new) and
`POST .../chat/{token}` {message, replyTo} answering 201 with the message; reactions
`POST`/`DELETE .../spreed/api/v1/reaction/{token}/{messageId}` {reaction} (201 / 200; 404
for an unknown message), the bot's kept in `reactions` (message id -> emoji).

Files: WebDAV on `/remote.php/dav/files/{user}/{path}` (Bearer, no OCS header needed): `MKCOL`
(405 when the folder exists), `PUT` (409 when the parent folder does not exist), `GET`.
`POST /ocs/v2.php/apps/files_sharing/api/v1/shares` {shareType: 10, shareWith: room token,
path} posts a `{file}` message in the room, as Talk does; `user_shares_file` is a user doing
the same (the file then sits under `Talk/` of the bot's files too, as a received share)."""

from __future__ import annotations

import time
import mimetypes
from typing import Any

from flask import jsonify, request

from fakes.platform import FakePlatform

BOT = "agentbot"
ROOMS = {"dmann": (1, "ann"), "dmmallory": (1, "mallory"), "teamroom": (2, "Team")}
CHAT = "/ocs/v2.php/apps/spreed/api/v1/chat/<token>"


def ocs(data: Any, status: int = 200):  # type: ignore[no-untyped-def]
    meta = {"status": "ok" if status < 300 else "failure", "statuscode": status, "message": "OK"}
    return jsonify({"ocs": {"meta": meta, "data": data}}), status


class FakeNextcloud(FakePlatform):
    def __init__(self, token: str) -> None:
        super().__init__("nextcloud")
        self.messages: list[dict[str, Any]] = []
        self.reactions: dict[int, list[str]] = {}
        self.files: dict[str, bytes] = {}  # "user/path" -> bytes
        self.folders: set[str] = set()  # "user/path"
        self.downloads: list[str] = []
        self.redirect_files = ""
        app = self.app

        @app.before_request
        def auth():
            if request.path.startswith("/remote.php/dav/"):
                if request.headers.get("Authorization") != f"Bearer {token}":
                    return "", 401
                return None
            if request.headers.get("OCS-APIRequest") != "true":
                return jsonify({"message": "CSRF check failed"}), 412
            if request.headers.get("Authorization") != f"Bearer {token}":
                return ocs([], 401)

        @app.get("/ocs/v2.php/cloud/user")
        def user():
            return ocs({"id": BOT, "display-name": "Agent Bot", "enabled": True})

        @app.get("/ocs/v2.php/apps/spreed/api/v4/room")
        def rooms():
            out = []
            for token_, (kind, name) in ROOMS.items():
                last = next((m for m in reversed(self.messages) if m["token"] == token_), None)
                out.append({"token": token_, "type": kind, "name": name, "displayName": name,
                            **({"lastMessage": last} if last else {})})
            return ocs(out)

        @app.get(CHAT)
        def receive(token: str):
            assert request.args["lookIntoFuture"] == "1"
            self.polled()
            last, deadline = int(request.args["lastKnownMessageId"]), time.monotonic() + int(request.args["timeout"])
            with self.lock:
                while True:
                    found = [m for m in self.messages if m["token"] == token and m["id"] > last]
                    if found or time.monotonic() >= deadline:
                        break
                    self.lock.wait(max(0.01, deadline - time.monotonic()))
            if not found:
                return "", 304
            response, status = ocs(found[:int(request.args.get("limit", 100))])
            response.headers["X-Chat-Last-Given"] = str(found[-1]["id"])
            return response, status

        @app.route("/ocs/v2.php/apps/spreed/api/v1/reaction/<token>/<int:message_id>", methods=["POST", "DELETE"])
        def reaction(token: str, message_id: int):
            emoji = str((request.get_json(silent=True) or {}).get("reaction") or request.args.get("reaction") or "")
            if not emoji or not any(m["id"] == message_id and m["token"] == token for m in self.messages):
                return ocs([], 404)
            mine = self.reactions.setdefault(message_id, [])
            if request.method == "POST":
                if emoji not in mine:
                    mine.append(emoji)
                return ocs({emoji: [{"actorType": "users", "actorId": BOT}]}, 201)
            if emoji in mine:
                mine.remove(emoji)
            return ocs({})

        @app.route("/remote.php/dav/files/<user>/<path:path>", methods=["GET", "PUT", "MKCOL"])
        def dav(user: str, path: str):
            key = f"{user}/{path.strip('/')}"
            if user != BOT:
                return "", 403
            if request.method == "MKCOL":
                if key in self.folders:
                    return "", 405
                self.folders.add(key)
                return "", 201
            if request.method == "PUT":
                if key.rsplit("/", 1)[0] != user and key.rsplit("/", 1)[0] not in self.folders:
                    return "", 409
                self.files[key] = request.get_data()
                return "", 201
            self.downloads.append(path)
            if self.redirect_files:
                return "", 302, {"Location": self.redirect_files}
            if key not in self.files:
                return "", 404
            return self.files[key], 200, {"Content-Type": mimetypes.guess_type(path)[0] or "application/octet-stream"}

        @app.post("/ocs/v2.php/apps/files_sharing/api/v1/shares")
        def share():
            body = request.get_json(silent=True) or request.form
            path = str(body.get("path") or "")
            if int(body.get("shareType", -1)) != 10 or body.get("shareWith") not in ROOMS:
                return ocs([], 400)
            if f"{BOT}/{path.strip('/')}" not in self.files:
                return ocs([], 404)
            message = self._add(str(body["shareWith"]), BOT, "{file}", self._file_param(path, BOT))
            self.record(**message)
            return ocs({"id": str(message["id"]), "share_type": 10, "path": path})

        @app.post(CHAT)
        def post(token: str):
            limited = self.throttled({"ocs": {"meta": {"status": "failure", "statuscode": 429}, "data": []}})
            if limited is not None:
                return limited
            body = request.get_json()
            message = self._add(token, BOT, body["message"], parent=body.get("replyTo"))
            self.record(**message)
            return ocs(message, 201)

    def _add(self, token: str, actor: str, text: str, parameters: dict | None = None,
             parent: int | None = None) -> dict[str, Any]:
        message = {"id": self.new_id(), "token": token, "actorType": "users", "actorId": actor,
                   "actorDisplayName": actor.title(), "timestamp": int(time.time()), "message": text,
                   "messageParameters": parameters or [], "systemMessage": "", "messageType": "comment",
                   "isReplyable": True, **({"parent": {"id": parent}} if parent else {})}
        with self.lock:
            self.messages.append(message)
            self.lock.notify_all()
        return message

    def _file_param(self, path: str, owner: str, size: int = 0) -> dict[str, Any]:
        data = self.files.get(f"{BOT}/{path.strip('/')}", b"")
        return {"file": {"type": "file", "id": str(abs(hash(path)) % 100000), "name": path.rsplit("/", 1)[-1],
                         "size": size or len(data), "path": path.strip("/"), "link": f"{self.url}/f/1",
                         "mimetype": mimetypes.guess_type(path)[0] or "application/octet-stream",
                         "preview-available": "no"}}

    def user_shares_file(self, user: str, data: bytes, name: str, size: int = 0, path: str = "") -> str:
        """A user shares a file into their one-to-one room with the bot; returns the room token."""
        room = f"dm{user}"
        self.files[f"{BOT}/Talk/{name}"] = data
        param = self._file_param(f"Talk/{name}", user, size)
        if path:
            param["file"]["path"] = path
        self._add(room, user, "{file}", param)
        return room

    def bot_files(self, room: str) -> list[tuple[str, bytes]]:
        """(name, bytes) of each file the bot shared into `room`."""
        return [(m["messageParameters"]["file"]["name"], self.files[f"{BOT}/{m['messageParameters']['file']['path']}"])
                for m in self.sent if m["token"] == room and m["message"] == "{file}"]

    def user_says(self, user: str, text: str, room: str = "", mention: bool = False) -> str:
        """In the user's one-to-one room unless `room` is given; returns the room token."""
        room = room or f"dm{user}"
        params = {"mention-user1": {"type": "user", "id": BOT, "name": "Agent Bot"}} if mention else None
        self._add(room, user, ("{mention-user1} " if mention else "") + text, params)
        return room

    def replies(self, room: str) -> list[str]:
        return [m["message"] for m in self.sent if m["token"] == room and m["message"] != "{file}"]
