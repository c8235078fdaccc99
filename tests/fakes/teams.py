"""A fake Bot Framework (https://learn.microsoft.com/azure/bot-service/rest-api/): the
OpenID configuration and its JWKS (RSA keys with `endorsements`), the Microsoft identity
platform token endpoint (client credentials, scope https://api.botframework.com/.default),
and the Connector API: POST /v3/conversations/{conversationId}/activities[/{activityId}]
with `Authorization: Bearer <token>` → {"id"} (a `typing` activity is kept in `typing`;
a message may carry attachments, such as an Adaptive Card), PUT .../activities/{id} to
update one (`updates`); 429 with Retry-After while `throttle` holds seconds. `submit()`
builds the message activity of an Adaptive Card's Action.Submit press (`value`, `replyToId`).
Files: `inline_image()` keeps bytes on the Connector's attachment store
(GET /v3/attachments/{id}/views/original, Bearer token required) and `personal_file()` on
a SharePoint-like pre-authenticated URL (GET /personal/{name}?tempauth=..., no token), each
returning the attachment an activity carries (`image/*` with `contentUrl`, or
`application/vnd.microsoft.teams.file.download.info` with `content.downloadUrl`);
`downloads` lists what was fetched. A sent message may carry only attachments (no text).
FileConsentCard: `consent()` builds the `fileConsent/invoke` activity of a user's Allow (or
Decline) of a sent `file.consent` card, whose `uploadInfo.uploadUrl` is an upload session
here: PUT /upload/{session} with the whole file and `Content-Range: bytes 0-{n-1}/{n}`, no
token (`uploaded` keeps it), 201 with the drive item.
`activity()` builds an inbound message activity and `token()` signs the
Bearer JWT the Bot Connector sends with it (RS256, kid in the header)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from flask import Flask, jsonify, request
from jwt.algorithms import RSAAlgorithm

from fakes.http import FakeServer, serve_file

ISSUER = "https://api.botframework.com"
SCOPE = "https://api.botframework.com/.default"


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class FakeBotFramework(FakeServer):
    def __init__(self, app_id: str, app_password: str) -> None:
        self.app_id, self.password = app_id, app_password
        self.key, self.kid = new_key(), "kid-" + uuid.uuid4().hex[:8]
        self.endorsements = ["msteams", "webchat"]
        self.issued: list[str] = []  # access tokens handed out
        self.sent: list[dict[str, Any]] = []  # {conversation, reply_to, activity, at}
        self.throttle: list[int] = []
        self.jwks_fetches = 0
        self.typing: list[str] = []  # conversations a typing activity was sent to
        self.updates: list[dict[str, Any]] = []
        self.stored: dict[str, tuple[bytes, str]] = {}  # attachment id or file name -> (bytes, type)
        self.tempauth = uuid.uuid4().hex
        self.downloads: list[str] = []
        self.sessions: dict[str, str] = {}  # upload session -> file name
        self.uploaded: dict[str, bytes] = {}
        app = Flask("fake-botframework")

        @app.get("/v3/attachments/<attachment_id>/views/original")
        def attachment_view(attachment_id: str):
            if not self.issued or request.headers.get("Authorization") != f"Bearer {self.issued[-1]}":
                return jsonify({"error": {"code": "Unauthorized", "message": "Authorization has been denied"}}), 401
            return serve_file(self.stored, attachment_id, self.downloads, {"error": {"code": "NotFound"}})

        @app.put("/upload/<session>")
        def upload_session(session: str):
            data = request.get_data()
            if session not in self.sessions or "Authorization" in request.headers:
                return jsonify({"error": {"code": "accessDenied"}}), 401
            if request.headers.get("Content-Range") != f"bytes 0-{len(data) - 1}/{len(data)}" or not data:
                return jsonify({"error": {"code": "invalidRange"}}), 400
            name = self.sessions.pop(session)
            self.uploaded[name] = data
            return jsonify({"id": uuid.uuid4().hex, "name": name, "size": len(data)}), 201

        @app.get("/personal/<name>")
        def sharepoint(name: str):
            # A pre-authenticated URL: its own tempauth, never a bot token.
            if request.args.get("tempauth") != self.tempauth or "Authorization" in request.headers:
                return jsonify({"error": {"code": "accessDenied"}}), 401
            return serve_file(self.stored, name, self.downloads, {"error": {"code": "itemNotFound"}})

        @app.get("/v1/.well-known/openidconfiguration")
        def openid():
            return jsonify({"issuer": ISSUER, "authorization_endpoint": "https://invalid.botframework.com",
                            "jwks_uri": f"{self.url}/v1/.well-known/keys",
                            "id_token_signing_alg_values_supported": ["RS256"],
                            "token_endpoint_auth_methods_supported": ["private_key_jwt"]})

        @app.get("/v1/.well-known/keys")
        def keys():
            self.jwks_fetches += 1
            jwk = json.loads(RSAAlgorithm.to_jwk(self.key.public_key()))
            return jsonify({"keys": [{**jwk, "kid": self.kid, "use": "sig", "x5t": self.kid,
                                      "endorsements": self.endorsements}]})

        @app.post("/botframework.com/oauth2/v2.0/token")
        def token_endpoint():
            form = request.form
            if form.get("grant_type") != "client_credentials" or form.get("scope") != SCOPE:
                return jsonify({"error": "invalid_request"}), 400
            if form.get("client_id") != self.app_id or form.get("client_secret") != self.password:
                return jsonify({"error": "invalid_client", "error_description": "AADSTS7000215"}), 401
            self.issued.append("eyJ0" + uuid.uuid4().hex)
            return jsonify({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599,
                            "access_token": self.issued[-1]})

        @app.post("/v3/conversations/<conversation>/activities", defaults={"reply_to": ""})
        @app.post("/v3/conversations/<conversation>/activities/<reply_to>")
        def activities(conversation: str, reply_to: str):
            if not self.issued or request.headers.get("Authorization") != f"Bearer {self.issued[-1]}":
                return jsonify({"error": {"code": "Unauthorized", "message": "Authorization has been denied"}}), 401
            if self.throttle:
                return jsonify({"error": {"code": "TooManyRequests"}}), 429, {"Retry-After": str(self.throttle.pop(0))}
            body = request.get_json(silent=True) or {}
            if body.get("type") == "typing":
                self.typing.append(conversation)
                return jsonify({"id": "typing-" + uuid.uuid4().hex[:8]})
            if body.get("type") != "message" or not (isinstance(body.get("text"), str) or body.get("attachments")):
                return jsonify({"error": {"code": "BadArgument", "message": "Activity type is required"}}), 400
            if reply_to and body.get("replyToId") != reply_to:
                return jsonify({"error": {"code": "BadArgument", "message": "replyToId mismatch"}}), 400
            activity_id = "1:" + uuid.uuid4().hex[:12]
            self.sent.append({"conversation": conversation, "reply_to": reply_to, "activity": body,
                              "id": activity_id, "at": time.time()})
            return jsonify({"id": activity_id})

        @app.put("/v3/conversations/<conversation>/activities/<activity_id>")
        def update_activity(conversation: str, activity_id: str):
            if not self.issued or request.headers.get("Authorization") != f"Bearer {self.issued[-1]}":
                return jsonify({"error": {"code": "Unauthorized", "message": "Authorization has been denied"}}), 401
            sent = next((s for s in self.sent if s["id"] == activity_id and s["conversation"] == conversation), None)
            if sent is None:
                return jsonify({"error": {"code": "ActivityNotFound", "message": "Activity not found"}}), 404
            body = request.get_json(silent=True) or {}
            sent["activity"] = body
            self.updates.append({"conversation": conversation, "id": activity_id, "activity": body})
            return jsonify({"id": activity_id})

        super().__init__(app)

    def submit(self, card_id: str, data: dict[str, Any], user: str, conversation_type: str = "personal",
               conversation: str = "") -> dict[str, Any]:
        """The message activity Teams sends when `user` presses an Action.Submit button of
        the card `card_id`: no text, the button's `data` as `value`."""
        activity = self.activity("", user, conversation_type, conversation)
        activity.pop("text")
        return {**activity, "value": data, "replyToId": card_id}

    def inline_image(self, data: bytes, kind: str = "image/*", url: str = "") -> dict[str, Any]:
        """An inline image as a channel or group chat message carries it."""
        attachment_id = "0-eus-d1-" + uuid.uuid4().hex
        self.stored[attachment_id] = (data, "image/png")
        return {"contentType": kind, "contentUrl": url or f"{self.url}/v3/attachments/{attachment_id}/views/original"}

    def personal_file(self, data: bytes, name: str, file_type: str, url: str = "") -> dict[str, Any]:
        """A file sent to the bot in a personal chat (the app's manifest has supportsFiles)."""
        self.stored[name] = (data, "application/octet-stream")
        return {"contentType": "application/vnd.microsoft.teams.file.download.info", "name": name,
                "contentUrl": f"{self.url}/personal/Documents/{name}",
                "content": {"downloadUrl": url or f"{self.url}/personal/{name}?tempauth={self.tempauth}",
                            "uniqueId": uuid.uuid4().hex, "fileType": file_type}}

    def consent(self, card: dict[str, Any], accept: bool = True) -> dict[str, Any]:
        """The invoke activity Teams sends when the user answers the consent card `card` (a
        sent activity) in that personal chat."""
        attachment = card["activity"]["attachments"][0]
        user = card["conversation"].removeprefix("a:1")
        activity = self.activity("", user, conversation=card["conversation"])
        activity.pop("text")
        name = attachment["name"]
        session = uuid.uuid4().hex
        self.sessions[session] = name
        value: dict[str, Any] = {"type": "fileUpload", "action": "accept" if accept else "decline",
                                 "context": attachment["content"]["acceptContext" if accept else "declineContext"]}
        if accept:
            value["uploadInfo"] = {"contentUrl": f"{self.url}/personal/Documents/Applications/{name}",
                                   "name": name, "uploadUrl": f"{self.url}/upload/{session}",
                                   "uniqueId": uuid.uuid4().hex, "fileType": name.rpartition(".")[2]}
        return {**activity, "type": "invoke", "name": "fileConsent/invoke", "value": value}

    def rotate(self, key: rsa.RSAPrivateKey | None = None) -> None:
        """A new signing key replaces the old one (new kid), as Microsoft rotates them."""
        self.key, self.kid = key or new_key(), "kid-" + uuid.uuid4().hex[:8]

    @property
    def service_url(self) -> str:
        return self.url + "/"

    def token(self, service_url: str = "", key: Any = None, kid: str = "", algorithm: str = "RS256",
              **claims: Any) -> str:
        """The Bearer JWT the Bot Connector signs for a request to the bot."""
        now = int(time.time())
        body = {"iss": ISSUER, "aud": self.app_id, "exp": now + 3600, "nbf": now - 60, "iat": now - 60,
                "serviceUrl": service_url or self.service_url, **claims}
        signing = key if key is not None else self.key
        return jwt.encode(body, signing, algorithm=algorithm, headers={"kid": kid or self.kid})

    def activity(self, text: str, user: str, conversation_type: str = "personal", conversation: str = "",
                 tenant: str = "tenant-1", channel: str = "msteams", service_url: str = "") -> dict[str, Any]:
        """A message activity; an `<at>HelperBot</at>` in the text mentions the bot, carried as a
        `mention` entity naming the bot's account, as Teams sends it."""
        entities = [{"type": "mention", "text": "<at>HelperBot</at>",
                     "mentioned": {"id": "28:" + self.app_id, "name": "HelperBot"}}] if "<at>HelperBot</at>" in text else []
        return {"type": "message", "entities": entities, "id": str(int(time.time() * 1e6)), "timestamp": "2026-11-23T12:00:00.000Z",
                "serviceUrl": service_url or self.service_url, "channelId": channel,
                "from": {"id": "29:" + user, "name": user.title(), "aadObjectId": "aad-" + user},
                "conversation": {"id": conversation or "a:1" + user, "conversationType": conversation_type,
                                 "tenantId": tenant, "isGroup": conversation_type != "personal"},
                "recipient": {"id": "28:" + self.app_id, "name": "HelperBot"},
                "text": text, "textFormat": "plain", "locale": "en-US",
                "channelData": {"tenant": {"id": tenant}}}
