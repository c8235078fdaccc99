"""A fake Graph API Send API (https://developers.facebook.com/docs/messenger-platform/
reference/send-api/): POST /me/messages?access_token=<page token> with {recipient:{id},
messaging_type, message:{text}} → {recipient_id, message_id}; 429 with Retry-After while
`throttle` holds seconds. `event()` builds a page webhook body; `signature()` signs it as
Meta does (X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body, app secret>)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from typing import Any

from flask import Flask, jsonify, request

from fakes.http import FakeServer

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
        app = Flask("fake-messenger")

        @app.post("/me/messages")
        def send():
            if request.args.get("access_token") != self.token:
                return jsonify({"error": {"message": "Invalid OAuth access token.", "type": "OAuthException",
                                          "code": 190}}), 400
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
