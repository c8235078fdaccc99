"""A fake Graph API Send API (https://developers.facebook.com/docs/messenger-platform/
reference/send-api/): POST /me/messages?access_token=<page token> with {recipient:{id},
messaging_type, message:{text}} → {recipient_id, message_id}; 429 with Retry-After while
`throttle` holds seconds. `event()` builds a page webhook body; `signature()` signs it as
Meta does (X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body, app secret>).

Attachments: `user_sends_file()` stores a user's file and builds the webhook body of a
message with `attachments: [{type, payload: {url}}]`, the URL on this server standing in for
the CDN (`GET /cdn/...`, kept in `downloads`). The Send API also takes multipart form data
(https://developers.facebook.com/docs/messenger-platform/send-messages/saving-assets):
`recipient` and `message` as JSON strings, `message.attachment` {type image|audio|video|file,
payload}, and the file as `filedata`, whose part's type must match an image or audio
attachment; kept in `files`."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from typing import Any

from flask import Flask, jsonify, request

from fakes.http import FakeServer, serve_file

PAGE_ID = "1122334455"


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def event(text: str, psid: str, echo: bool = False) -> bytes:
    now = int(time.time() * 1000)
    message: dict[str, Any] = {"mid": "m_" + uuid.uuid4().hex, "text": text}
    if echo:
        message["is_echo"] = True
    return json.dumps({"object": "page", "entry": [{"id": PAGE_ID, "time": now, "messaging": [
        {"sender": {"id": psid}, "recipient": {"id": PAGE_ID}, "timestamp": now, "message": message}]}]}).encode()


class FakeMessenger(FakeServer):
    def __init__(self, page_token: str) -> None:
        self.token = page_token
        self.sent: list[dict[str, Any]] = []
        self.throttle: list[int] = []
        self.actions: list[dict[str, Any]] = []  # sender actions (typing_on, mark_seen...)
        self.cdn: dict[str, tuple[bytes, str]] = {}
        self.downloads: list[str] = []
        self.files: list[dict[str, Any]] = []
        app = Flask("fake-messenger")

        @app.get("/cdn/<path:path>")
        def cdn(path: str):
            return serve_file(self.cdn, path, self.downloads)

        @app.post("/me/messages")
        def send():
            if request.args.get("access_token") != self.token:
                return jsonify({"error": {"message": "Invalid OAuth access token.", "type": "OAuthException",
                                          "code": 190}}), 400
            if request.mimetype == "multipart/form-data":
                return self._upload()
            body = request.get_json()
            if body.get("sender_action"):
                if body["sender_action"] not in ("typing_on", "typing_off", "mark_seen") or \
                        not (body.get("recipient") or {}).get("id"):
                    return jsonify({"error": {"message": "(#100) Invalid parameter", "code": 100}}), 400
                self.actions.append({"to": body["recipient"]["id"], "action": body["sender_action"]})
                return jsonify({"recipient_id": body["recipient"]["id"]})
            if self.throttle:
                return jsonify({"error": {"message": "Calls to this api have exceeded the rate limit.",
                                          "code": 613}}), 429, {"Retry-After": str(self.throttle.pop(0))}
            text = (body.get("message") or {}).get("text")
            psid = (body.get("recipient") or {}).get("id")
            if not psid or not isinstance(text, str) or len(text) > 2000 or not body.get("messaging_type"):
                return jsonify({"error": {"message": "(#100) Invalid parameter", "code": 100}}), 400
            mid = "m_" + uuid.uuid4().hex
            self.sent.append({"to": psid, "text": text, "type": body["messaging_type"], "mid": mid,
                              "at": time.time()})
            return jsonify({"recipient_id": psid, "message_id": mid})

        super().__init__(app)

    def _upload(self):  # type: ignore[no-untyped-def]
        invalid = jsonify({"error": {"message": "(#100) Invalid parameter", "code": 100}}), 400
        try:
            recipient = json.loads(request.form.get("recipient") or "")
            attachment = json.loads(request.form.get("message") or "")["attachment"]
        except (ValueError, KeyError, TypeError):
            return invalid
        upload = request.files.get("filedata")
        kind = attachment.get("type") if isinstance(attachment, dict) else None
        if not isinstance(recipient, dict) or not recipient.get("id") or upload is None or \
                kind not in ("image", "audio", "video", "file") or not isinstance(attachment.get("payload"), dict):
            return invalid
        if kind in ("image", "audio", "video") and upload.mimetype.split("/")[0] != kind:
            return jsonify({"error": {"message": "(#100) Upload attachment failure.", "code": 100}}), 400
        mid = "m_" + uuid.uuid4().hex
        self.files.append({"to": recipient["id"], "type": kind, "filename": upload.filename,
                           "content_type": upload.mimetype, "data": upload.read(), "mid": mid})
        return jsonify({"recipient_id": recipient["id"], "message_id": mid,
                        "attachment_id": str(uuid.uuid4().int)[:15]})

    def user_sends_file(self, psid: str, data: bytes, mime_type: str, filename: str, kind: str = "image",
                        text: str = "", url: str = "") -> bytes:
        """The webhook body of a user's message with one attachment (its bytes on the fake CDN)."""
        path = f"v/t59.2708-21/{uuid.uuid4().hex[:8]}_{filename}"
        self.cdn[path] = (data, mime_type)
        body = json.loads(event(text, psid))
        message = body["entry"][0]["messaging"][0]["message"]
        if not text:
            del message["text"]
        message["attachments"] = [{"type": kind, "payload": {"url": url or f"{self.url}/cdn/{path}?_nc_cat=1"}}]
        return json.dumps(body).encode()
