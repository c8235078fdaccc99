"""A fake WhatsApp Cloud API (https://developers.facebook.com/docs/whatsapp/cloud-api/
reference/messages): POST /{phone_number_id}/messages with Bearer token and
{messaging_product: whatsapp, to, type: text, text: {body}} → {messaging_product, contacts,
messages: [{id}]}; 429 with Retry-After while `throttle` holds seconds (for text messages);
a `status: read` call with `typing_indicator` ({success: true}, kept in `typing`), and
`type: reaction` messages (one per message; an empty emoji removes it), kept in `reactions`. `event()` builds a
webhook body (payload examples in the docs); it is signed like Messenger's (tests/meta_webhook.py).

Media (https://developers.facebook.com/docs/whatsapp/cloud-api/reference/media):
`user_sends_file()` stores a user's file and builds the webhook body of its image / document /
audio message (a media id); `GET /{media-id}?phone_number_id=` answers {messaging_product, url,
mime_type, sha256, file_size, id} with the url on `/whatsapp_business/attachments/?mid=` (the
lookaside path; `media_host` moves it elsewhere), which serves the bytes to the Bearer token
only (kept in `downloads`). `POST /{phone_number_id}/media` takes multipart `file` (its part's
type one the Cloud API supports), `type` and `messaging_product=whatsapp` and answers {id}; a
message of type image / audio / document names an uploaded id (`sent_media`)."""

from __future__ import annotations

import hashlib
import base64
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


# The Cloud API's supported media types, by message type.
SUPPORTED = {"image": ("image/jpeg", "image/png"),
             "audio": ("audio/aac", "audio/amr", "audio/mpeg", "audio/mp4", "audio/ogg"),
             "document": ("text/plain", "application/pdf", "application/vnd.ms-powerpoint", "application/msword",
                          "application/vnd.ms-excel",
                          "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
                          "application/vnd.openxmlformats-officedocument.presentationml.presentation",
                          "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet")}


def _error(message: str, code: int = 100, status: int = 400):  # type: ignore[no-untyped-def]
    return jsonify({"error": {"message": message, "code": code}}), status


class FakeWhatsApp(FakeServer):
    def __init__(self, token: str) -> None:
        self.token = token
        self.sent: list[dict[str, Any]] = []
        self.throttle: list[int] = []
        self.typing: list[str] = []                # message ids a typing indicator named
        self.reactions: dict[str, str] = {}        # message id -> the bot's emoji
        self.media: dict[str, dict[str, Any]] = {}   # media id -> {data, mime_type, filename, by}
        self.downloads: list[str] = []               # media ids whose bytes were fetched
        self.lookups: list[str] = []                 # media ids whose URL was asked for
        self.sent_media: list[dict[str, Any]] = []   # media messages the bot sent
        self.media_host = ""                         # another base URL for the download URLs
        app = Flask("fake-whatsapp")

        def authorized() -> bool:
            return request.headers.get("Authorization") == f"Bearer {self.token}"

        @app.get("/<media_id>")
        def media_url(media_id: str):
            if not authorized():
                return _error("Invalid OAuth access token", 190, 401)
            item = self.media.get(media_id)
            if item is None or request.args.get("phone_number_id", PHONE_ID) != PHONE_ID:
                return _error(f"Unsupported get request. Object with ID '{media_id}' does not exist")
            self.lookups.append(media_id)
            base = self.media_host or self.url
            return jsonify({"messaging_product": "whatsapp", "url": f"{base}/whatsapp_business/attachments/"
                            f"?mid={media_id}&ext=1&hash=x", "mime_type": item["mime_type"],
                            "sha256": hashlib.sha256(item["data"]).hexdigest(), "file_size": len(item["data"]),
                            "id": media_id})

        @app.get("/whatsapp_business/attachments/")
        def download():
            if not authorized():
                return "Unauthorized", 401
            item = self.media.get(request.args.get("mid", ""))
            if item is None:
                return "Not found", 404
            self.downloads.append(request.args["mid"])
            return item["data"], 200, {"Content-Type": item["mime_type"]}

        @app.post("/<phone_id>/media")
        def upload(phone_id: str):
            if not authorized():
                return _error("Invalid OAuth access token", 190, 401)
            upload = request.files.get("file")
            if phone_id != PHONE_ID or request.form.get("messaging_product") != "whatsapp" or upload is None:
                return _error("(#100) The parameter messaging_product is required.")
            kind = upload.mimetype
            if kind not in [t for types in SUPPORTED.values() for t in types] or request.form.get("type") != kind:
                return _error(f"(#100) Param file must be a file with one of the following types: {kind} unsupported")
            media_id = str(uuid.uuid4().int)[:16]
            self.media[media_id] = {"data": upload.read(), "mime_type": kind, "filename": upload.filename,
                                    "by": "bot"}
            return jsonify({"id": media_id})

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
            if body.get("type") in SUPPORTED:
                return self._media_message(body)
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

    def _media_message(self, body: dict[str, Any]):  # type: ignore[no-untyped-def]
        kind = body["type"]
        media = body.get(kind) or {}
        item = self.media.get(str(media.get("id") or ""))
        if body.get("messaging_product") != "whatsapp" or not body.get("to") or item is None:
            return _error("(#100) Invalid parameter")
        if item["mime_type"] not in SUPPORTED[kind]:
            return _error(f"(#131053) Media upload error: {item['mime_type']} is not a {kind} type")
        wamid = "wamid." + uuid.uuid4().hex
        self.sent_media.append({"to": body["to"], "type": kind, "filename": media.get("filename"),
                                "mime_type": item["mime_type"], "data": item["data"], "id": wamid})
        return jsonify({"messaging_product": "whatsapp", "contacts": [{"input": body["to"], "wa_id": body["to"]}],
                        "messages": [{"id": wamid}]})

    def user_sends_file(self, wa_id: str, data: bytes, mime_type: str, kind: str = "image", filename: str = "",
                        caption: str = "") -> bytes:
        """Store a user's file as the Cloud API does and return the webhook body announcing it."""
        media_id = str(uuid.uuid4().int)[:16]
        self.media[media_id] = {"data": data, "mime_type": mime_type, "filename": filename, "by": wa_id}
        media: dict[str, Any] = {"mime_type": mime_type, "sha256": base64.b64encode(
            hashlib.sha256(data).digest()).decode(), "id": media_id}
        if filename:
            media["filename"] = filename
        if caption:
            media["caption"] = caption
        if kind == "audio":
            media["voice"] = False
        body = json.loads(event("", wa_id))
        message = body["entry"][0]["changes"][0]["value"]["messages"][0]
        del message["text"]
        message.update({"type": kind, kind: media})
        return json.dumps(body).encode()
