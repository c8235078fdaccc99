"""A fake Bluesky PDS (https://docs.bsky.app/docs/api): XRPC
`com.atproto.server.createSession` {identifier, password} -> {did, handle, accessJwt,
refreshJwt}; `app.bsky.notification.listNotifications` (newest first; isRead against
the last `updateSeen`); `app.bsky.notification.updateSeen` {seenAt};
`com.atproto.repo.createRecord` {repo, collection, record} -> {uri, cid}.
`expire()` makes the current access token answer 400 ExpiredToken.

Images: `com.atproto.repo.uploadBlob` (the raw bytes, their type in Content-Type) ->
{blob: {$type: blob, ref: {$link: cid}, mimeType, size}}; a post may embed
`app.bsky.embed.images` (1-4 images of uploaded blobs, each at most 1,000,000 bytes and
image/*, `alt` required; `text` may then be empty). Users' images are served by the CDN,
`localhost:<port>` here: `/img/feed_fullsize/plain/{did}/{cid}@{jpeg|png|webp}`."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

from flask import jsonify, request

from fakes.platform import FakePlatform

BOT_HANDLE, BOT_DID = "agent.bsky.test", "did:plc:agentbot"


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class FakeBluesky(FakePlatform):
    def __init__(self, app_password: str) -> None:
        super().__init__("bluesky")
        self.notifications: list[dict[str, Any]] = []
        self.sessions: list[str] = []
        self.expired: set[str] = set()
        self.seen_at = ""
        self.blobs: dict[str, dict[str, Any]] = {}  # cid -> {did, mimeType, data}
        self.downloads: list[str] = []
        self.image_posts: list[dict[str, Any]] = []  # the bot's posts embedding images
        app = self.app

        @app.get("/img/feed_fullsize/plain/<did>/<name>")
        def cdn(did: str, name: str):
            cid, _, fmt = name.partition("@")
            blob = self.blobs.get(cid)
            if blob is None or blob["did"] != did or request.host != self.cdn_host or fmt not in ("jpeg", "png", "webp"):
                return "not found", 404
            self.downloads.append(cid)
            return blob["data"], 200, {"Content-Type": f"image/{fmt}"}

        @app.post("/xrpc/com.atproto.repo.uploadBlob")
        def upload_blob():
            data = request.get_data()
            kind = request.headers.get("Content-Type", "")
            if not data or not kind:
                return error(400, "InvalidRequest", "A blob and its Content-Type are required")
            return jsonify({"blob": self._blob(BOT_DID, kind, data)})

        def error(status: int, name: str, message: str):  # type: ignore[no-untyped-def]
            return jsonify({"error": name, "message": message}), status

        @app.before_request
        def auth():
            if request.path.endswith("createSession") or request.path.startswith("/img/"):
                return None
            token = request.headers.get("Authorization", "").removeprefix("Bearer ")
            if token in self.expired:
                return error(400, "ExpiredToken", "Token has expired")
            if token not in self.sessions:
                return error(401, "AuthenticationRequired", "Invalid identifier or password")

        @app.post("/xrpc/com.atproto.server.createSession")
        def create_session():
            body = request.get_json()
            if body.get("identifier") not in (BOT_HANDLE, BOT_DID) or body.get("password") != app_password:
                return error(401, "AuthenticationRequired", "Invalid identifier or password")
            self.sessions.append(f"jwt-{self.new_id()}")
            return jsonify({"did": BOT_DID, "handle": BOT_HANDLE, "accessJwt": self.sessions[-1],
                            "refreshJwt": "refresh", "active": True})

        @app.get("/xrpc/app.bsky.notification.listNotifications")
        def notifications():
            self.polled()
            items = [{**n, "isRead": n["indexedAt"] <= self.seen_at} for n in reversed(self.notifications)]
            return jsonify({"notifications": items[:int(request.args.get("limit", 50))], "seenAt": self.seen_at})

        @app.post("/xrpc/app.bsky.notification.updateSeen")
        def update_seen():
            self.seen_at = request.get_json()["seenAt"]
            return "", 200

        @app.post("/xrpc/com.atproto.repo.createRecord")
        def create_record():
            limited = self.throttled({"error": "RateLimitExceeded", "message": "Rate Limit Exceeded"})
            if limited is not None:
                return limited
            body = request.get_json()
            record = body["record"]
            embed = record.get("embed")
            if body["repo"] != BOT_DID or body["collection"] != "app.bsky.feed.post" \
                    or record.get("$type") != "app.bsky.feed.post" or len(record["text"]) > 300 \
                    or (embed is None and not record["text"]) or (embed is not None and not self._valid(embed)):
                return error(400, "InvalidRequest", "Invalid app.bsky.feed.post record")
            rkey = f"bot{self.new_id()}"
            made = {"uri": f"at://{BOT_DID}/app.bsky.feed.post/{rkey}", "cid": f"bafy{rkey}"}
            if embed is not None:
                self.image_posts.append({**made, "text": record["text"], "reply": record.get("reply"),
                                         "images": [{"alt": i["alt"], **self.blobs[i["image"]["ref"]["$link"]]}
                                                    for i in embed["images"]]})
            else:
                self.record(**made, text=record["text"], reply=record.get("reply"))
            return jsonify({**made, "validationStatus": "valid"})

    @property
    def cdn_host(self) -> str:
        return f"localhost:{self.port}"

    def _blob(self, did: str, kind: str, data: bytes) -> dict[str, Any]:
        cid = "bafkrei" + hashlib.sha256(data + did.encode()).hexdigest()[:40]
        self.blobs[cid] = {"did": did, "mimeType": kind, "data": data}
        return {"$type": "blob", "ref": {"$link": cid}, "mimeType": kind, "size": len(data)}

    def _valid(self, embed: dict[str, Any]) -> bool:
        images = embed.get("images") or []
        if embed.get("$type") != "app.bsky.embed.images" or not 1 <= len(images) <= 4:
            return False
        for item in images:
            blob = item.get("image") or {}
            stored = self.blobs.get((blob.get("ref") or {}).get("$link", ""))
            if not isinstance(item.get("alt"), str) or stored is None or stored["did"] != BOT_DID \
                    or not stored["mimeType"].startswith("image/") or len(stored["data"]) > 1_000_000:
                return False
        return True

    def user_sends_image(self, user: str, data: bytes, mime: str, text: str) -> str:
        """`user` mentions the bot in a post embedding one image; returns the uri."""
        blob = self._blob(f"did:plc:{user.split('.')[0]}", mime, data)
        return self.user_says(user, text, embed={"$type": "app.bsky.embed.images",
                                                 "images": [{"alt": "", "image": blob}]})

    def expire(self) -> None:
        self.expired.update(self.sessions)

    def user_says(self, user: str, text: str, reply_to: dict | None = None, embed: dict | None = None) -> str:
        """`user` (a handle) mentions the bot, or replies to `reply_to` {uri, cid, root}; returns the uri."""
        rkey = f"p{self.new_id()}"
        did = f"did:plc:{user.split('.')[0]}"
        uri = f"at://{did}/app.bsky.feed.post/{rkey}"
        record: dict[str, Any] = {"$type": "app.bsky.feed.post", "text": text, "createdAt": now()}
        if reply_to:
            record["reply"] = {"root": reply_to["root"], "parent": {"uri": reply_to["uri"], "cid": reply_to["cid"]}}
        if embed:
            record["embed"] = embed
        self.notifications.append({
            "uri": uri, "cid": f"bafy{rkey}", "reason": "reply" if reply_to else "mention", "record": record,
            "author": {"did": did, "handle": user, "displayName": user.split(".")[0].title()},
            "indexedAt": now(), "isRead": False, "labels": []})
        return uri

    def replies(self, uri: str) -> list[str]:
        return [p["text"] for p in self.sent if p["reply"] and p["reply"]["parent"]["uri"] == uri]
