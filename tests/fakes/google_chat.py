"""A fake Google Chat (https://developers.google.com/workspace/chat/): the X.509
certificates of chat@system.gserviceaccount.com (GET /service_accounts/v1/metadata/x509/
chat@system.gserviceaccount.com → {kid: PEM}), the OAuth 2.0 token endpoint's JWT-bearer
grant (the assertion is checked against the service account's public key: iss, aud = this
endpoint, scope chat.bot, at most an hour), and spaces.messages.create
(POST /v1/spaces/{space}/messages[?messageReplyOption=...] with Bearer → a Message);
429 with Retry-After while `throttle` holds seconds. `event()` builds a MESSAGE interaction
event and `token()` the Bearer JWT Chat signs for it (audience: the project number).
Files: `attachment()` keeps bytes as uploaded content and returns the message's
`attachment` entry (`attachmentDataRef.resourceName`); media.download,
GET /v1/media/{resourceName}?alt=media with the Bearer token, returns them (`downloads`)."""

from __future__ import annotations

import base64
import datetime
import json
import time
import uuid
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from flask import Flask, jsonify, request

from fakes.http import FakeServer, serve_file

CHAT_ISSUER = "chat@system.gserviceaccount.com"
SCOPE = "https://www.googleapis.com/auth/chat.bot"
CERTS_PATH = "/service_accounts/v1/metadata/x509/chat@system.gserviceaccount.com"


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def certificate(key: rsa.RSAPrivateKey) -> str:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CHAT_ISSUER)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def service_account(key: rsa.RSAPrivateKey, project: str = "agentd-test") -> dict[str, Any]:
    """A service account JSON key file's content, as the Cloud console downloads it."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return {"type": "service_account", "project_id": project, "private_key_id": uuid.uuid4().hex,
            "private_key": pem, "client_email": f"chat-bot@{project}.iam.gserviceaccount.com",
            "client_id": "1234567890", "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": "https://oauth2.googleapis.com/token"}


class FakeGoogleChat(FakeServer):
    def __init__(self, project_number: str, account: dict[str, Any], account_key: rsa.RSAPrivateKey) -> None:
        self.project_number, self.account, self.account_key = project_number, account, account_key
        self.chat_key, self.kid = new_key(), uuid.uuid4().hex
        self.issued: list[str] = []
        self.sent: list[dict[str, Any]] = []  # {space, text, thread, reply_option, name, at}
        self.throttle: list[int] = []
        self.media: dict[str, tuple[bytes, str]] = {}
        self.downloads: list[str] = []
        app = Flask("fake-google-chat")

        @app.get("/v1/media/<path:resource>")
        def download(resource: str):
            if not self.issued or request.headers.get("Authorization") != f"Bearer {self.issued[-1]}":
                return jsonify({"error": {"code": 401, "status": "UNAUTHENTICATED"}}), 401
            if request.args.get("alt") != "media":  # without it, the Media resource's metadata
                return jsonify({"resourceName": resource})
            return serve_file(self.media, resource, self.downloads, {"error": {"code": 404, "status": "NOT_FOUND"}})

        @app.get(CERTS_PATH)
        def certs():
            return jsonify({self.kid: certificate(self.chat_key)})

        @app.post("/token")
        def token_endpoint():
            if request.form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
                return jsonify({"error": "unsupported_grant_type"}), 400
            try:
                claims = jwt.decode(request.form.get("assertion", ""), self.account_key.public_key(),
                                    algorithms=["RS256"], audience=f"{self.url}/token",
                                    issuer=self.account["client_email"], options={"require": ["exp", "iat"]})
            except jwt.PyJWTError as exc:
                return jsonify({"error": "invalid_grant", "error_description": str(exc)}), 400
            if SCOPE not in str(claims.get("scope", "")).split() or claims["exp"] - claims["iat"] > 3600:
                return jsonify({"error": "invalid_scope"}), 400
            self.issued.append("ya29." + uuid.uuid4().hex)
            return jsonify({"access_token": self.issued[-1], "expires_in": 3599, "token_type": "Bearer"})

        @app.post("/v1/spaces/<space>/messages")
        def create(space: str):
            if not self.issued or request.headers.get("Authorization") != f"Bearer {self.issued[-1]}":
                return jsonify({"error": {"code": 401, "status": "UNAUTHENTICATED"}}), 401
            if self.throttle:
                return jsonify({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}), 429, \
                    {"Retry-After": str(self.throttle.pop(0))}
            body = request.get_json(silent=True) or {}
            if not isinstance(body.get("text"), str) or len(body["text"]) > 4096:
                return jsonify({"error": {"code": 400, "status": "INVALID_ARGUMENT"}}), 400
            name = f"spaces/{space}/messages/{uuid.uuid4().hex[:11]}"
            thread = (body.get("thread") or {}).get("name") or f"spaces/{space}/threads/{uuid.uuid4().hex[:11]}"
            self.sent.append({"space": f"spaces/{space}", "text": body["text"], "thread": thread,
                              "reply_option": request.args.get("messageReplyOption"), "name": name,
                              "at": time.time()})
            return jsonify({"name": name, "text": body["text"], "thread": {"name": thread},
                            "space": {"name": f"spaces/{space}"}, "sender": {"name": "users/app", "type": "BOT"}})

        super().__init__(app)

    @property
    def certs_url(self) -> str:
        return self.url + CERTS_PATH

    def token(self, key: Any = None, kid: str = "", **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": CHAT_ISSUER, "aud": self.project_number, "iat": now, "exp": now + 3600, **claims}
        return jwt.encode(body, key if key is not None else self.chat_key, algorithm="RS256",
                          headers={"kid": kid or self.kid})

    def attachment(self, data: bytes, name: str, kind: str, space: str = "spaces/AAAAdm") -> dict[str, Any]:
        """An uploaded file as a MESSAGE event's `message.attachment[]` entry names it."""
        resource = "ClxDaGF0" + base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self.media[resource] = (data, kind)
        message = f"{space}/messages/{uuid.uuid4().hex[:11]}"
        return {"name": f"{message}/attachments/{uuid.uuid4().hex[:8]}", "contentName": name, "contentType": kind,
                "attachmentDataRef": {"resourceName": resource},
                "downloadUri": f"https://chat.google.com/api/get_attachment_url?url_type=DOWNLOAD_URL&{resource}",
                "thumbnailUri": f"https://chat.google.com/api/get_attachment_url?url_type=FIFE_URL&{resource}",
                "source": "UPLOADED_CONTENT"}

    @staticmethod
    def event(text: str, user: str, space: str = "spaces/AAAAdm", dm: bool = True, mention: bool = False,
              thread: str = "") -> dict[str, Any]:
        """A MESSAGE interaction event (the request body Chat POSTs to the app's URL)."""
        space_obj = {"name": space, "type": "DM" if dm else "ROOM",
                     "spaceType": "DIRECT_MESSAGE" if dm else "SPACE", "displayName": "" if dm else "Team"}
        sender = {"name": "users/" + user, "displayName": user.title(), "email": f"{user}@example.com",
                  "type": "HUMAN", "domainId": "d1"}
        message = {"name": f"{space}/messages/{uuid.uuid4().hex[:11]}", "sender": sender,
                   "createTime": "2026-11-23T12:00:00.000000Z",
                   "text": ("@HelperBot " if mention else "") + text,
                   "thread": {"name": thread or f"{space}/threads/{uuid.uuid4().hex[:11]}"},
                   "space": space_obj, "argumentText": (" " if mention else "") + text}
        return {"type": "MESSAGE", "eventTime": "2026-11-23T12:00:00.000000Z", "message": message,
                "user": sender, "space": space_obj, "configCompleteRedirectUrl": "https://chat.google.com/api/x"}


def dump(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()
