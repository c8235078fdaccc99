"""A fake Threema Gateway message API (https://gateway.threema.ch/en/developer/api):
GET /credits and /pubkey/{id} (?from=&secret=; credits left / hex public key, text/plain), POST /send_simple
(`from, to, text, secret`) and POST /send_e2e (`from, to, nonce, box, secret`), each
form-encoded, answering the new message id as text/plain; 401 on a wrong ID/secret, 404
for an unknown recipient, 413 for a text over 3500 bytes, 429 with Retry-After while
`throttle` holds seconds. Like the real Gateway it knows every ID's public key: it opens
E2E boxes with the recipient's (simulated user's) private key and records the text.

`callback()` builds an incoming-message callback the way the Gateway sends one: the
user's text in a Threema message container (type 0x01 + PKCS#7 random padding),
encrypted with crypto_box (user's private key, Gateway ID's public key), and `mac` =
hex HMAC-SHA256(from||to||messageId||date||nonce||box, API secret).

Files: `POST /upload_blob` (?from=&secret=, multipart `blob`) answers a 16-byte blob id in
hex; a file message (type 0x17, JSON `b`, `k`, `m`, `n`, `s`, `j`) sent with /send_e2e is
opened like the recipient's app would: the blob decrypted with `k` and the nonce 0...01."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from typing import Any
from urllib.parse import urlencode

from flask import Flask, request
from nacl.public import Box, PrivateKey, PublicKey
from nacl.secret import SecretBox

from fakes.http import FakeServer


def mac(secret: str, form: dict[str, str]) -> str:
    joined = "".join(form[k] for k in ("from", "to", "messageId", "date", "nonce", "box"))
    return hmac.new(secret.encode(), joined.encode(), hashlib.sha256).hexdigest()


def container(text: str, kind: int = 0x01) -> bytes:
    """Type byte + data + PKCS#7-style padding (random length 1..255, 32 bytes at least)."""
    data = bytes([kind]) + text.encode()
    length = max(secrets.randbelow(255) + 1, 32 - len(data))
    return data + bytes([length]) * length


class FakeThreema(FakeServer):
    def __init__(self, identity: str, secret: str, gateway_public_key: bytes) -> None:
        self.identity, self.secret = identity, secret
        self.gateway_key = PublicKey(gateway_public_key)
        self.users: dict[str, PrivateKey] = {}
        self.sent: list[dict[str, Any]] = []  # {mode: simple|e2e, to, text, id, at}
        self.lookups: list[str] = []
        self.throttle: list[int] = []
        self.blobs: dict[str, bytes] = {}
        self.downloads: list[str] = []
        app = Flask("fake-threema")

        def authorised(values) -> bool:  # type: ignore[no-untyped-def]
            return values.get("from") == self.identity and values.get("secret") == self.secret

        @app.get("/credits")
        def credits():
            if not authorised(request.args):
                return "", 401
            return "100", 200, {"Content-Type": "text/plain"}

        @app.get("/pubkey/<identity>")
        def pubkey(identity: str):
            if not authorised(request.args):
                return "", 401
            self.lookups.append(identity)
            if identity == self.identity:
                return self.gateway_key.encode().hex(), 200, {"Content-Type": "text/plain"}
            user = self.users.get(identity)
            if user is None:
                return "", 404
            return user.public_key.encode().hex(), 200, {"Content-Type": "text/plain"}

        @app.post("/upload_blob")
        def upload_blob():
            if not authorised(request.args):
                return "", 401
            blob = request.files.get("blob")
            if blob is None:
                return "", 400
            blob_id = os.urandom(16).hex()
            self.blobs[blob_id] = blob.read()
            return blob_id, 200, {"Content-Type": "text/plain"}

        @app.get("/blobs/<blob_id>")
        def blob(blob_id: str):
            if not authorised(request.args):
                return "", 401
            self.downloads.append(blob_id)
            if blob_id not in self.blobs:
                return "", 404
            return self.blobs[blob_id], 200, {"Content-Type": "application/octet-stream"}

        @app.post("/send_<mode>")
        def send(mode: str):
            form = request.form
            if mode not in ("simple", "e2e"):
                return "", 404
            if not authorised(form):
                return "", 401
            if self.throttle:
                return "", 429, {"Retry-After": str(self.throttle.pop(0))}
            user = self.users.get(form.get("to", ""))
            if user is None:
                return "", 400  # invalid recipient
            if mode == "simple":
                text = form.get("text", "")
            else:
                try:
                    plain = Box(user, self.gateway_key).decrypt(bytes.fromhex(form["box"]), bytes.fromhex(form["nonce"]))
                except Exception:  # noqa: BLE001 - a box the recipient cannot open
                    return "", 400
                pad = plain[-1]
                if plain[0] not in (0x01, 0x17) or not 1 <= pad <= 255 or len(plain) < 32 \
                        or plain[-pad:] != bytes([pad]) * pad:
                    return "", 400
                if plain[0] == 0x17:
                    return self._file(form["to"], json.loads(plain[1:-pad]))
                text = plain[1:-pad].decode()
            if len(text.encode()) > 3500:
                return "", 413
            message_id = os.urandom(8).hex()
            self.sent.append({"mode": mode, "to": form["to"], "text": text, "id": message_id, "at": time.time()})
            return message_id, 200, {"Content-Type": "text/plain"}

        super().__init__(app)

    def _file(self, to: str, descriptor: dict[str, Any]):  # type: ignore[no-untyped-def]
        sealed = self.blobs.get(str(descriptor.get("b")))
        if sealed is None:
            return "", 400
        data = SecretBox(bytes.fromhex(descriptor["k"])).decrypt(sealed, bytes(23) + b"\x01")
        if len(data) != descriptor.get("s"):
            return "", 400
        message_id = os.urandom(8).hex()
        self.sent.append({"mode": "e2e", "to": to, "file": {**descriptor, "data": data}, "id": message_id,
                          "at": time.time()})
        return message_id, 200, {"Content-Type": "text/plain"}

    def file_callback(self, sender: str, data: bytes, name: str, mime: str, caption: str = "") -> bytes:
        """A user's file message: the bytes sealed into a blob on the Gateway, then a 0x17 message."""
        key = os.urandom(32)
        blob_id = os.urandom(16).hex()
        self.blobs[blob_id] = SecretBox(key).encrypt(data, bytes(23) + b"\x01").ciphertext
        descriptor = {"b": blob_id, "k": key.hex(), "m": mime, "n": name, "s": len(data), "j": 0, "i": 0}
        if caption:
            descriptor["d"] = caption
        return self.callback(sender, json.dumps(descriptor), kind=0x17)

    def files(self, to: str) -> list[dict[str, Any]]:
        """The files sent to `to`: the file message's fields and the decrypted bytes."""
        return [s["file"] for s in self.sent if s["to"] == to and "file" in s]

    def user(self, identity: str) -> PrivateKey:
        """A Threema user (8-character ID) with its own key pair."""
        return self.users.setdefault(identity, PrivateKey.generate())

    def callback(self, sender: str, text: str, kind: int = 0x01, secret: str | None = None,
                 to: str | None = None) -> bytes:
        """A form-encoded incoming-message callback from `sender` (signed with `secret`)."""
        nonce = os.urandom(24)
        box = Box(self.user(sender), self.gateway_key).encrypt(container(text, kind), nonce).ciphertext
        form = {"from": sender, "to": to or self.identity, "messageId": os.urandom(8).hex(),
                "date": str(int(time.time())), "nonce": nonce.hex(), "box": box.hex()}
        form["mac"] = mac(self.secret if secret is None else secret, form)
        form["nickname"] = sender.title()
        return urlencode(form).encode()

    def replies(self, to: str) -> list[str]:
        return [s["text"] for s in self.sent if s["to"] == to and "file" not in s]
