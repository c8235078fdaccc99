"""A fake WhatsApp Cloud API (https://developers.facebook.com/docs/whatsapp/cloud-api/
reference/messages): POST /{phone_number_id}/messages with Bearer token and
{messaging_product: whatsapp, to, type: text, text: {body}} → {messaging_product, contacts,
messages: [{id}]}; 429 with Retry-After while `throttle` holds seconds (for text messages);
a `status: read` call with `typing_indicator` ({success: true}, kept in `typing`), and
`type: reaction` messages (one per message; an empty emoji removes it), kept in `reactions`. `event()` builds a
webhook body (payload examples in the docs); it is signed like Messenger's (tests/meta_webhook.py)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from flask import Flask, jsonify, request

from fakes.http import FakeServer

PHONE_ID = "106540352242922"


def event(text: str, wa_id: str, name: str = "Ann") -> bytes:
    return json.dumps({"object": "whatsapp_business_account", "entry": [{"id": "102290129340398", "changes": [{
        "field": "messages", "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE_ID},
            "contacts": [{"profile": {"name": name}, "wa_id": wa_id}],
            "messages": [{"from": wa_id, "id": "wamid." + uuid.uuid4().hex, "timestamp": str(int(time.time())),
                          "type": "text", "text": {"body": text}}]}}]}]}).encode()


class FakeWhatsApp(FakeServer):
    def __init__(self, token: str) -> None:
        self.token = token
        self.sent: list[dict[str, Any]] = []
        self.throttle: list[int] = []
        self.typing: list[str] = []                # message ids a typing indicator named
        self.reactions: dict[str, str] = {}        # message id -> the bot's emoji
        app = Flask("fake-whatsapp")

        @app.post("/<phone_id>/messages")
        def send(phone_id: str):
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return jsonify({"error": {"message": "Invalid OAuth access token", "code": 190}}), 401
            if phone_id != PHONE_ID:
                return jsonify({"error": {"message": "Unsupported post request", "code": 100}}), 400
            body = request.get_json()
            if body.get("status") == "read" and body.get("message_id"):
                if body.get("typing_indicator", {"type": "text"}).get("type") != "text":
                    return jsonify({"error": {"message": "(#100) Invalid parameter", "code": 100}}), 400
                if body.get("typing_indicator"):
                    self.typing.append(body["message_id"])
                return jsonify({"success": True})
            if body.get("type") == "reaction":
                reaction = body.get("reaction") or {}
                if not reaction.get("message_id") or not isinstance(reaction.get("emoji"), str):
                    return jsonify({"error": {"message": "(#100) Invalid parameter", "code": 100}}), 400
                if reaction["emoji"]:
                    self.reactions[reaction["message_id"]] = reaction["emoji"]
                else:
                    self.reactions.pop(reaction["message_id"], None)
                return jsonify({"messaging_product": "whatsapp", "contacts": [{"input": body.get("to"),
                                "wa_id": body.get("to")}], "messages": [{"id": "wamid." + uuid.uuid4().hex}]})
            if self.throttle:
                return jsonify({"error": {"message": "Rate limit hit", "code": 130429}}), 429, \
                    {"Retry-After": str(self.throttle.pop(0))}
            text = (body.get("text") or {}).get("body")
            if body.get("messaging_product") != "whatsapp" or body.get("type") != "text" or \
                    not isinstance(text, str) or len(text) > 4096 or not body.get("to"):
                return jsonify({"error": {"message": "(#100) Invalid parameter", "code": 100}}), 400
            wamid = "wamid." + uuid.uuid4().hex
            self.sent.append({"to": body["to"], "text": text, "id": wamid, "at": time.time()})
            return jsonify({"messaging_product": "whatsapp", "contacts": [{"input": body["to"], "wa_id": body["to"]}],
                            "messages": [{"id": wamid}]})

        super().__init__(app)
