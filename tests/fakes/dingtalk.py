"""A fake DingTalk robot API (https://open.dingtalk.com/document/robots/custom-robot-access
and .../orgapp/receive-message): POST /robot/sendBySession?session=<id> (the callback's
sessionWebhook) and the signed custom robot webhook
POST /robot/send?access_token=..&timestamp=<ms>&sign=<urlencoded base64 HMAC-SHA256>,
both answering {"errcode": 0, "errmsg": "ok"}; a wrong token or signature is an errcode,
as DingTalk answers it (HTTP 200). 429 with Retry-After while `throttle` holds seconds.
`callback()` builds an outgoing-robot callback (body + timestamp/sign headers).

Files (the robot's app, AppKey `app_key` / AppSecret `app_secret`): POST
/v1.0/oauth2/accessToken {appKey, appSecret} → {accessToken, expireIn}; GET /gettoken
?appkey&appsecret → {errcode 0, access_token}; POST /v1.0/robot/messageFiles/download
(header x-acs-dingtalk-access-token; {downloadCode, robotCode}) → {downloadUrl}, a temporary
URL served at GET /temp/{id} (or a redirect to `redirect_downloads`); POST /media/upload
?access_token= (multipart `type`, `media`) → {errcode 0, media_id}; robot messages POST
/v1.0/robot/oToMessages/batchSend {robotCode, userIds, msgKey, msgParam} and
/v1.0/robot/groupMessages/send {robotCode, openConversationId, msgKey, msgParam}, whose
sampleImageMsg / sampleFile must name an uploaded media id (`robot_files`)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from typing import Any

from flask import Flask, jsonify, redirect, request

from fakes.http import FakeServer


def sign(secret: str, timestamp: str) -> str:
    string_to_sign = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(secret.encode(), string_to_sign, hashlib.sha256).digest()).decode()


class FakeDingTalk(FakeServer):
    def __init__(self, access_token: str, secret: str, app_key: str = "", app_secret: str = "") -> None:
        self.token, self.secret = access_token, secret
        self.app_key, self.app_secret = app_key, app_secret
        self.app_tokens: list[str] = []
        self.oapi_tokens: list[str] = []
        self.codes: dict[str, bytes] = {}  # downloadCode -> bytes
        self.temp: dict[str, bytes] = {}
        self.downloads: list[str] = []
        self.redirect_downloads = ""
        self.media: dict[str, dict[str, Any]] = {}
        self.robot_files: list[dict[str, Any]] = []
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

        @app.post("/v1.0/oauth2/accessToken")
        def app_token():
            body = request.get_json(silent=True) or {}
            if not self.app_key or (body.get("appKey"), body.get("appSecret")) != (self.app_key, self.app_secret):
                return jsonify({"code": "invalidClientIdOrSecret", "message": "无效的clientId或者clientSecret"}), 400
            self.app_tokens.append(uuid.uuid4().hex)
            return jsonify({"accessToken": self.app_tokens[-1], "expireIn": 7200})

        @app.get("/gettoken")
        def oapi_token():
            if not self.app_key or (request.args.get("appkey"), request.args.get("appsecret")) != \
                    (self.app_key, self.app_secret):
                return jsonify({"errcode": 40089, "errmsg": "不合法的corpid或corpsecret"})
            self.oapi_tokens.append(uuid.uuid4().hex)
            return jsonify({"errcode": 0, "errmsg": "ok", "access_token": self.oapi_tokens[-1], "expires_in": 7200})

        def app_authorized() -> bool:
            return bool(self.app_tokens) and request.headers.get("x-acs-dingtalk-access-token") == self.app_tokens[-1]

        @app.post("/v1.0/robot/messageFiles/download")
        def message_file():
            body = request.get_json(silent=True) or {}
            if not app_authorized():
                return jsonify({"code": "InvalidAuthentication", "message": "不合法的access_token"}), 401
            if body.get("robotCode") != self.app_key or body.get("downloadCode") not in self.codes:
                return jsonify({"code": "invalidParameter", "message": "downloadCode is invalid"}), 400
            temp = uuid.uuid4().hex
            self.temp[temp] = self.codes[body["downloadCode"]]
            return jsonify({"downloadUrl": f"{self.url}/temp/{temp}?Expires=300"})

        @app.get("/temp/<temp>")
        def temporary(temp: str):
            if self.redirect_downloads:
                return redirect(self.redirect_downloads)
            if temp not in self.temp:
                return "expired", 404
            self.downloads.append(temp)
            return self.temp[temp], 200, {"Content-Type": "application/octet-stream"}

        @app.post("/media/upload")
        def media_upload():
            if not self.oapi_tokens or request.args.get("access_token") != self.oapi_tokens[-1]:
                return jsonify({"errcode": 40014, "errmsg": "不合法的access_token"})
            media = request.files.get("media")
            if request.form.get("type") not in ("image", "voice", "video", "file") or media is None:
                return jsonify({"errcode": 40004, "errmsg": "不合法的媒体文件类型"})
            media_id = "@lA" + uuid.uuid4().hex
            self.media[media_id] = {"type": request.form["type"], "filename": media.filename,
                                    "content_type": media.mimetype, "data": media.read()}
            return jsonify({"errcode": 0, "errmsg": "ok", "media_id": media_id, "type": request.form["type"],
                            "created_at": int(time.time() * 1000)})

        @app.post("/v1.0/robot/oToMessages/batchSend", defaults={"kind": "direct"})
        @app.post("/v1.0/robot/groupMessages/send", defaults={"kind": "group"})
        def robot_message(kind: str):
            body = request.get_json(silent=True) or {}
            if not app_authorized():
                return jsonify({"code": "InvalidAuthentication", "message": "不合法的access_token"}), 401
            to = body.get("userIds") if kind == "direct" else body.get("openConversationId")
            try:
                param = json.loads(body.get("msgParam") or "")
            except ValueError:
                param = {}
            media = param.get("photoURL") if body.get("msgKey") == "sampleImageMsg" else \
                param.get("mediaId") if body.get("msgKey") == "sampleFile" else None
            if body.get("robotCode") != self.app_key or not to or media not in self.media:
                return jsonify({"code": "invalidParameter", "message": "参数错误"}), 400
            self.robot_files.append({"kind": kind, "to": to, "msg_key": body["msgKey"], "param": param,
                                     **self.media[media]})
            return jsonify({"processQueryKey": uuid.uuid4().hex})

        super().__init__(app)

    def file_code(self, data: bytes) -> str:
        """A downloadCode for `data`, as a callback carries it."""
        code = base64.b64encode(uuid.uuid4().bytes + b"dl").decode()
        self.codes[code] = data
        return code

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
                 timestamp_ms: int | None = None, webhook_base: str = "", msgtype: str = "text",
                 content: dict[str, Any] | None = None) -> tuple[bytes, dict[str, str]]:
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
            "isInAtList": True, "robotCode": self.app_key or "normal", "msgtype": msgtype,
            "sessionWebhook": f"{webhook_base or self.url}/robot/sendBySession?session={session}",
            **({"text": {"content": " " + text}} if content is None else {"content": content})}).encode()
        timestamp = str(timestamp_ms if timestamp_ms is not None else int(time.time() * 1000))
        return body, {"Content-Type": "application/json", "timestamp": timestamp, "sign": sign(self.secret, timestamp)}
