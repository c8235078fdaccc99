"""A fake DingTalk robot API (https://open.dingtalk.com/document/robots/custom-robot-access
and .../orgapp/receive-message): POST /robot/sendBySession?session=<id> (the callback's
sessionWebhook) and the signed custom robot webhook
POST /robot/send?access_token=..&timestamp=<ms>&sign=<urlencoded base64 HMAC-SHA256>,
both answering {"errcode": 0, "errmsg": "ok"}; a wrong token or signature is an errcode,
as DingTalk answers it (HTTP 200). 429 with Retry-After while `throttle` holds seconds.
`callback()` builds an outgoing-robot callback (body + timestamp/sign headers)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from typing import Any

from flask import Flask, jsonify, request

from fakes.http import FakeServer


def sign(secret: str, timestamp: str) -> str:
    string_to_sign = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(secret.encode(), string_to_sign, hashlib.sha256).digest()).decode()


class FakeDingTalk(FakeServer):
    def __init__(self, access_token: str, secret: str) -> None:
        self.token, self.secret = access_token, secret
        self.sent: list[dict[str, Any]] = []  # {api: session|robot, session, content, at_user_ids, at}
        self.sessions: dict[str, float] = {}  # session id -> expiry (ms)
        self.throttle: list[int] = []
        app = Flask("fake-dingtalk")

        @app.post("/robot/sendBySession")
        def by_session():
            session = request.args.get("session", "")
            if self.sessions.get(session, 0) < time.time() * 1000:
                return jsonify({"errcode": 300001, "errmsg": "session is expired or invalid"})
            return self._message("session", session)

        @app.post("/robot/send")
        def robot():
            if request.args.get("access_token") != self.token:
                return jsonify({"errcode": 300001, "errmsg": "token is not exist"})
            timestamp = request.args.get("timestamp", "")
            if not timestamp.isdigit() or abs(time.time() * 1000 - int(timestamp)) > 3600 * 1000:
                return jsonify({"errcode": 310000, "errmsg": "sign not match, more: timestamp is invalid"})
            if request.args.get("sign") != sign(self.secret, timestamp):
                return jsonify({"errcode": 310000, "errmsg": "sign not match"})
            return self._message("robot", "")

        super().__init__(app)

    def _message(self, api: str, session: str):  # type: ignore[no-untyped-def]
        if self.throttle:
            return jsonify({"errcode": 130101, "errmsg": "send too fast"}), 429, \
                {"Retry-After": str(self.throttle.pop(0))}
        body = request.get_json(silent=True) or {}
        content = (body.get("text") or {}).get("content")
        if body.get("msgtype") != "text" or not isinstance(content, str):
            return jsonify({"errcode": 40035, "errmsg": "missing parameter msgtype/text"})
        self.sent.append({"api": api, "session": session, "content": content,
                          "at_user_ids": (body.get("at") or {}).get("atUserIds"), "at": time.time()})
        return jsonify({"errcode": 0, "errmsg": "ok"})

    def callback(self, text: str, staff_id: str, group: bool = True, session_ttl: float = 5400,
                 timestamp_ms: int | None = None, webhook_base: str = "") -> tuple[bytes, dict[str, str]]:
        """An outgoing-robot callback from `staff_id` (body, headers) with a fresh session."""
        session = uuid.uuid4().hex
        expires = int(time.time() * 1000 + session_ttl * 1000)
        self.sessions[session] = expires
        body = json.dumps({
            "conversationId": "cidGroup123==" if group else "cidDM" + staff_id,
            "atUsers": [{"dingtalkId": "$:LWCP_v1:$bot"}], "chatbotCorpId": "ding123",
            "chatbotUserId": "$:LWCP_v1:$bot", "msgId": "msg" + uuid.uuid4().hex[:12],
            "senderNick": staff_id.title(), "isAdmin": False, "senderStaffId": staff_id,
            "sessionWebhookExpiredTime": expires, "createAt": int(time.time() * 1000),
            "senderCorpId": "ding123", "conversationType": "2" if group else "1",
            "senderId": "$:LWCP_v1:$" + staff_id, "conversationTitle": "Team" if group else "",
            "isInAtList": True, "robotCode": "normal", "msgtype": "text",
            "sessionWebhook": f"{webhook_base or self.url}/robot/sendBySession?session={session}",
            "text": {"content": " " + text}}).encode()
        timestamp = str(timestamp_ms if timestamp_ms is not None else int(time.time() * 1000))
        return body, {"Content-Type": "application/json", "timestamp": timestamp, "sign": sign(self.secret, timestamp)}
