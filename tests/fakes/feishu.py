"""A fake Feishu/Lark Open Platform (https://open.feishu.cn/document/server-docs/):
POST /open-apis/auth/v3/tenant_access_token/internal {app_id, app_secret} →
{code 0, tenant_access_token, expire}; POST /open-apis/im/v1/messages?receive_id_type=chat_id
and /open-apis/im/v1/messages/{message_id}/reply with `Authorization: Bearer <tenant token>`,
`msg_type` text and `content` a JSON string {"text": ...} → {code 0, data {message_id}}.
While `throttle` holds seconds: HTTP 429, code 99991400 and `x-ogw-ratelimit-reset`, as
Feishu's rate limiter answers. `callback()` builds an event subscription v2 callback the
way Feishu sends it: optionally encrypted (base64(IV + AES-256-CBC with sha256(encrypt key),
PKCS#7)) and signed (X-Lark-Signature = hex sha256(timestamp + nonce + encrypt key + body)).

Files: `resource()` keeps bytes under a key for a message id; GET
/open-apis/im/v1/messages/{message_id}/resources/{key}?type=image|file (tenant token, the key
must belong to that message and match the type) returns them (`downloads`). Uploads:
POST /open-apis/im/v1/images (multipart `image_type` message, `image`) → data.image_key and
POST /open-apis/im/v1/files (`file_type`, `file_name`, `file`) → data.file_key (`uploads`);
a message of msg_type image/file must name a key uploaded here (`sent` has `key`).

Reactions: POST /open-apis/im/v1/messages/{message_id}/reactions
{"reaction_type": {"emoji_type": NAME}} → data {reaction_id, operator, action_time,
reaction_type}, NAME one of Feishu's emoji types (a Unicode emoji is refused with code 231001);
DELETE /open-apis/im/v1/messages/{message_id}/reactions/{reaction_id} takes one off
(`reactions` holds those still on, `unreacted` those taken off)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import uuid
from typing import Any

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from flask import Flask, jsonify, request

from fakes.http import FakeServer


# A few of Feishu's emoji types (its reaction names; Unicode emoji are not among them).
EMOJI_TYPES = {"OK", "THUMBSUP", "DONE", "SMILE", "HEART", "GLANCE", "CRY", "Typing", "Fire", "PARTY",
               "THINKING", "CheckMark", "CrossMark"}


def encrypt(key: str, plain: bytes) -> str:
    padder = padding.PKCS7(128).padder()
    data = padder.update(plain) + padder.finalize()
    iv = os.urandom(16)
    encryptor = Cipher(algorithms.AES(hashlib.sha256(key.encode()).digest()), modes.CBC(iv)).encryptor()
    return base64.b64encode(iv + encryptor.update(data) + encryptor.finalize()).decode()


def sign(key: str, timestamp: str, nonce: str, body: bytes) -> str:
    return hashlib.sha256((timestamp + nonce + key).encode() + body).hexdigest()


def message_event(text: str, open_id: str, token: str, chat_type: str = "p2p", chat_id: str = "",
                  mention: str = "", event_id: str = "", message_type: str = "text",
                  content: dict[str, Any] | None = None, message_id: str = "") -> dict[str, Any]:
    """An im.message.receive_v1 event (schema 2.0); `mention` names the @-mentioned bot."""
    mentions = []
    if mention:
        text = "@_user_1 " + text
        mentions = [{"key": "@_user_1", "id": {"open_id": "ou_bot", "union_id": "on_bot", "user_id": ""},
                     "name": mention, "tenant_key": "tk1"}]
    now = str(int(time.time() * 1000))
    return {"schema": "2.0", "header": {"event_id": event_id or uuid.uuid4().hex, "token": token,
                                        "create_time": now, "event_type": "im.message.receive_v1",
                                        "tenant_key": "tk1", "app_id": "cli_test"},
            "event": {"sender": {"sender_id": {"union_id": "on_" + open_id, "user_id": "u_" + open_id,
                                               "open_id": open_id}, "sender_type": "user", "tenant_key": "tk1"},
                      "message": {"message_id": message_id or "om_" + uuid.uuid4().hex, "root_id": "", "parent_id": "",
                                  "create_time": now, "update_time": now,
                                  "chat_id": chat_id or "oc_dm_" + open_id, "chat_type": chat_type,
                                  "message_type": message_type,
                                  "content": json.dumps({"text": text} if content is None else content),
                                  "mentions": mentions}}}


def callback(payload: dict[str, Any], encrypt_key: str = "", signed: bool = True) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of a callback: encrypted and signed when an encrypt key is given."""
    headers = {"Content-Type": "application/json"}
    if not encrypt_key:
        return json.dumps(payload).encode(), headers
    body = json.dumps({"encrypt": encrypt(encrypt_key, json.dumps(payload).encode())}).encode()
    if signed:
        timestamp, nonce = str(int(time.time())), uuid.uuid4().hex[:16]
        headers.update({"X-Lark-Request-Timestamp": timestamp, "X-Lark-Request-Nonce": nonce,
                        "X-Lark-Signature": sign(encrypt_key, timestamp, nonce, body)})
    return body, headers


class FakeFeishu(FakeServer):
    def __init__(self, app_id: str, app_secret: str) -> None:
        self.app_id, self.app_secret = app_id, app_secret
        self.tokens: list[str] = []  # tenant tokens issued
        self.sent: list[dict[str, Any]] = []  # {api: reply|create, to, text, message_id, at}
        self.throttle: list[int] = []
        self.resources: dict[tuple[str, str], tuple[str, bytes]] = {}  # (message id, key) -> (type, bytes)
        self.downloads: list[str] = []
        self.uploads: dict[str, dict[str, Any]] = {}  # key -> {kind, file_type, file_name, data, ...}
        self.reactions: list[dict[str, str]] = []  # {message_id, emoji_type, reaction_id} still on
        self.unreacted: list[dict[str, str]] = []
        app = Flask("fake-feishu")

        @app.post("/open-apis/im/v1/messages/<message_id>/reactions")
        def react(message_id: str):
            if not self._authorized():
                return jsonify({"code": 99991663, "msg": "Invalid access token for authorization."}), 400
            emoji = ((request.get_json(silent=True) or {}).get("reaction_type") or {}).get("emoji_type")
            if emoji not in EMOJI_TYPES:
                return jsonify({"code": 231001, "msg": "reaction type is invalid."}), 400
            reaction = {"message_id": message_id, "emoji_type": emoji, "reaction_id": "r_" + uuid.uuid4().hex}
            self.reactions.append(reaction)
            return jsonify({"code": 0, "msg": "success", "data": {
                "reaction_id": reaction["reaction_id"], "operator": {"operator_id": self.app_id, "operator_type": "app"},
                "action_time": str(int(time.time() * 1000)), "reaction_type": {"emoji_type": emoji}}})

        @app.delete("/open-apis/im/v1/messages/<message_id>/reactions/<reaction_id>")
        def unreact(message_id: str, reaction_id: str):
            if not self._authorized():
                return jsonify({"code": 99991663, "msg": "Invalid access token for authorization."}), 400
            found = [r for r in self.reactions if r["message_id"] == message_id and r["reaction_id"] == reaction_id]
            if not found:
                return jsonify({"code": 231003, "msg": "The reaction does not exist."}), 400
            self.reactions.remove(found[0])
            self.unreacted.append(found[0])
            return jsonify({"code": 0, "msg": "success", "data": {"reaction_id": reaction_id}})

        @app.get("/open-apis/im/v1/messages/<message_id>/resources/<key>")
        def resource(message_id: str, key: str):
            if not self._authorized():
                return jsonify({"code": 99991663, "msg": "Invalid access token for authorization."}), 400
            kind, data = self.resources.get((message_id, key), ("", b""))
            if not data or request.args.get("type") != kind:
                return jsonify({"code": 234003, "msg": "File not in msg."}), 400
            self.downloads.append(key)
            return data, 200, {"Content-Type": "application/octet-stream"}

        @app.post("/open-apis/im/v1/images")
        def upload_image():
            image = request.files.get("image")
            if not self._authorized():
                return jsonify({"code": 99991663, "msg": "Invalid access token for authorization."}), 400
            if request.form.get("image_type") not in ("message", "avatar") or image is None:
                return jsonify({"code": 234001, "msg": "Invalid request param."}), 400
            key = "img_v3_" + uuid.uuid4().hex
            self.uploads[key] = {"kind": "image", "image_type": request.form["image_type"],
                                 "file_name": image.filename, "data": image.read()}
            return jsonify({"code": 0, "msg": "success", "data": {"image_key": key}})

        @app.post("/open-apis/im/v1/files")
        def upload_file():
            upload = request.files.get("file")
            if not self._authorized():
                return jsonify({"code": 99991663, "msg": "Invalid access token for authorization."}), 400
            if request.form.get("file_type") not in ("opus", "mp4", "pdf", "doc", "xls", "ppt", "stream") \
                    or not request.form.get("file_name") or upload is None:
                return jsonify({"code": 234001, "msg": "Invalid request param."}), 400
            key = "file_v3_" + uuid.uuid4().hex
            self.uploads[key] = {"kind": "file", "file_type": request.form["file_type"],
                                 "file_name": request.form["file_name"], "data": upload.read()}
            return jsonify({"code": 0, "msg": "success", "data": {"file_key": key}})

        @app.post("/open-apis/auth/v3/tenant_access_token/internal")
        def tenant_token():
            body = request.get_json(silent=True) or {}
            if body.get("app_id") != self.app_id or body.get("app_secret") != self.app_secret:
                return jsonify({"code": 10014, "msg": "app secret invalid"})
            self.tokens.append("t-" + uuid.uuid4().hex)
            return jsonify({"code": 0, "msg": "ok", "tenant_access_token": self.tokens[-1], "expire": 7200})

        @app.post("/open-apis/im/v1/messages")
        def create():
            if request.args.get("receive_id_type") != "chat_id":
                return jsonify({"code": 99992402, "msg": "field validation failed"}), 400
            return self._message("create", (request.get_json(silent=True) or {}).get("receive_id"))

        @app.post("/open-apis/im/v1/messages/<message_id>/reply")
        def reply(message_id: str):
            return self._message("reply", message_id)

        super().__init__(app)

    def _authorized(self) -> bool:
        return bool(self.tokens) and request.headers.get("Authorization") == f"Bearer {self.tokens[-1]}"

    def resource(self, message_id: str, kind: str, data: bytes) -> str:
        """Bytes the message `message_id` carries (an image or a file); their key."""
        key = ("img_v3_" if kind == "image" else "file_v3_") + uuid.uuid4().hex
        self.resources[(message_id, key)] = (kind, data)
        return key

    def _message(self, api: str, to: Any):  # type: ignore[no-untyped-def]
        if not self._authorized():
            return jsonify({"code": 99991663, "msg": "Invalid access token for authorization."}), 400
        if self.throttle:
            return jsonify({"code": 99991400, "msg": "request trigger frequency limit"}), 429, \
                {"x-ogw-ratelimit-limit": "5", "x-ogw-ratelimit-reset": str(self.throttle.pop(0))}
        body = request.get_json(silent=True) or {}
        try:
            content = json.loads(body.get("content") or "")
            text = content.get("text")
        except (ValueError, AttributeError):
            content, text = {}, None
        if body.get("msg_type") in ("image", "file") and to:
            key = content.get(f"{body['msg_type']}_key")
            if (self.uploads.get(key) or {}).get("kind") != body["msg_type"]:
                return jsonify({"code": 230001, "msg": "invalid message content"}), 400
            message_id = "om_" + uuid.uuid4().hex
            self.sent.append({"api": api, "to": to, "text": None, "msg_type": body["msg_type"], "key": key,
                              "message_id": message_id, "at": time.time()})
            return jsonify({"code": 0, "msg": "success", "data": {"message_id": message_id}})
        if body.get("msg_type") != "text" or not isinstance(text, str) or not to:
            return jsonify({"code": 230001, "msg": "invalid message content"}), 400
        message_id = "om_" + uuid.uuid4().hex
        self.sent.append({"api": api, "to": to, "text": text, "message_id": message_id, "at": time.time()})
        return jsonify({"code": 0, "msg": "success", "data": {"message_id": message_id, "msg_type": "text",
                                                               "body": {"content": body["content"]}}})
