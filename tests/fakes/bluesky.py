"""A fake Bluesky PDS (https://docs.bsky.app/docs/api): XRPC
`com.atproto.server.createSession` {identifier, password} -> {did, handle, accessJwt,
refreshJwt}; `app.bsky.notification.listNotifications` (newest first; isRead against
the last `updateSeen`); `app.bsky.notification.updateSeen` {seenAt};
`com.atproto.repo.createRecord` {repo, collection, record} -> {uri, cid}.
`expire()` makes the current access token answer 400 ExpiredToken."""

from __future__ import annotations

import datetime as dt
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
        app = self.app

        def error(status: int, name: str, message: str):  # type: ignore[no-untyped-def]
            return jsonify({"error": name, "message": message}), status

        @app.before_request
        def auth():
            if request.path.endswith("createSession"):
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
            if body["repo"] != BOT_DID or body["collection"] != "app.bsky.feed.post" \
                    or record.get("$type") != "app.bsky.feed.post" or len(record["text"]) > 300:
                return error(400, "InvalidRequest", "Invalid app.bsky.feed.post record")
            rkey = f"bot{self.new_id()}"
            made = {"uri": f"at://{BOT_DID}/app.bsky.feed.post/{rkey}", "cid": f"bafy{rkey}"}
            self.record(**made, text=record["text"], reply=record.get("reply"))
            return jsonify({**made, "validationStatus": "valid"})

    def expire(self) -> None:
        self.expired.update(self.sessions)

    def user_says(self, user: str, text: str, reply_to: dict | None = None) -> str:
        """`user` (a handle) mentions the bot, or replies to `reply_to` {uri, cid, root}; returns the uri."""
        rkey = f"p{self.new_id()}"
        did = f"did:plc:{user.split('.')[0]}"
        uri = f"at://{did}/app.bsky.feed.post/{rkey}"
        record: dict[str, Any] = {"$type": "app.bsky.feed.post", "text": text, "createdAt": now()}
        if reply_to:
            record["reply"] = {"root": reply_to["root"], "parent": {"uri": reply_to["uri"], "cid": reply_to["cid"]}}
        self.notifications.append({
            "uri": uri, "cid": f"bafy{rkey}", "reason": "reply" if reply_to else "mention", "record": record,
            "author": {"did": did, "handle": user, "displayName": user.split(".")[0].title()},
            "indexedAt": now(), "isRead": False, "labels": []})
        return uri

    def replies(self, uri: str) -> list[str]:
        return [p["text"] for p in self.sent if p["reply"] and p["reply"]["parent"]["uri"] == uri]
