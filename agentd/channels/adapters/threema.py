"""Threema Gateway: incoming-message callbacks (form-encoded `from, to, messageId, date,
nonce, box, mac`; `mac` = hex HMAC-SHA256 of from||to||messageId||date||nonce||box keyed
with the API secret, checked before anything else), NaCl-encrypted boxes opened with our
private key and the sender's public key (`GET /pubkey/{id}`); the ID and secret are checked
with `GET /credits` at start; replies end-to-end encrypted
via `POST /send_e2e`, or `POST /send_simple` (basic mode: no private key, send only, since
the Gateway delivers no incoming messages to basic IDs).

Docs: https://gateway.threema.ch/en/developer/api and /developer/e2e (message container:
type byte, PKCS#7-style random padding; type 0x01 = UTF-8 text).
Files (end-to-end mode only). In: a file message's blob, `GET /blobs/{id}` on the Gateway
API, opened with the message's key on the worker that takes the file. Out: the bytes encrypted with a fresh key (XSalsa20-Poly1305, the
blob nonce 0...01), `POST /upload_blob` (multipart `blob`), then a file message (type 0x17:
JSON `b` blob id, `k` key, `m` type, `n` name, `s` size, `j` 1 for an image shown as media).
"""

from __future__ import annotations

import json
import secrets
import threading
from typing import Any
from urllib.parse import urlencode

from nacl.exceptions import CryptoError
from nacl.public import Box, PrivateKey, PublicKey
from nacl.secret import SecretBox

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.sender import HttpSender
from agentd.channels.adapters.threema_box import callback_data, pad, parse_form, parse_key, unpad
from agentd.channels.bases.webhook import Request, WebhookAdapter

API_URL = "https://msgapi.threema.ch"
TEXT, FILE = 0x01, 0x17
BLOB_NONCE = bytes(23) + b"\x01"  # the file's own nonce (its thumbnail would take 0...02)
MEDIA = ("image/jpeg", "image/png", "image/gif", "image/webp")
MAX_TEXT_BYTES = 3500  # the Gateway's text limit, in UTF-8 bytes


class ThreemaAdapter(WebhookAdapter):
    max_message_len = MAX_TEXT_BYTES
    limit_unit = "bytes"
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)
        self._public_keys: dict[str, PublicKey] = {}  # looked-up keys; an ID's key never changes
        self._lock = threading.Lock()

    def api(self, path: str) -> str:
        return (self.settings.get("api_url") or API_URL).rstrip("/") + path

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8454)

    def private_key(self) -> PrivateKey | None:
        """Our end-to-end private key (E2E mode), or None in basic mode."""
        value = self.env("private_key_env", required=False)
        if not value:
            return None
        try:
            return PrivateKey(parse_key(value))
        except ValueError as exc:
            raise ChannelError(f"{self.settings.get('private_key_env')}: not a Threema private key ({exc})") from None

    def identity(self) -> str:
        identity = str(self.settings.get("threema_id") or "")
        if len(identity) != 8:
            raise ChannelError("threema_id must be the 8-character Gateway ID (e.g. *MYID001)")
        return identity

    def prepare(self) -> None:
        self.private_key()
        # GET /credits checks the ID and secret (401 when wrong) before the listener opens.
        self.http.request("GET", self.api("/credits"), params={"from": self.identity(), "secret": self.env("secret_env")})

    def verify(self, request: Request) -> bool:
        secret = self.env("secret_env", required=False)
        form = parse_form(request.body)
        return hmacs.check(secret, callback_data(form), form.get("mac"))

    def public_key(self, identity: str) -> PublicKey:
        with self._lock:
            known = self._public_keys.get(identity)
        if known is None:
            response = self.http.request("GET", self.api(f"/pubkey/{identity}"), params={
                "from": self.identity(), "secret": self.env("secret_env")})
            try:
                known = PublicKey(parse_key(response.text))
            except ValueError:
                raise ChannelError(f"threema pubkey/{identity}: not a public key") from None
            with self._lock:
                self._public_keys[identity] = known
        return known

    def _inbound(self, request: Request) -> tuple[int, Any]:
        form = parse_form(request.body)
        sender, key = form.get("from", ""), self.private_key()
        if form.get("to") != self.identity() or len(sender) != 8:
            raise ValueError("not addressed to this Gateway ID")
        if key is None:
            self.ctx.log.warning("threema: message from %s not readable in basic mode (set private_key_env)", sender)
            return 200, {}
        try:
            plain = Box(key, self.public_key(sender)).decrypt(bytes.fromhex(form.get("box", "")),
                                                              bytes.fromhex(form.get("nonce", "")))
            content = unpad(plain)
        except (CryptoError, ValueError, ChannelError) as exc:
            raise ValueError(f"cannot decrypt the message box: {exc}") from None
        text, files = "", []
        if content[:1] == bytes([TEXT]):  # receipts, groups... are not chat
            text = content[1:].decode("utf-8", "replace")
        elif content[:1] == bytes([FILE]):
            text, files = self._file(content[1:])
        if text or files:
            conversation = Conversation(self.name, sender, sender, direct=True)
            self.ctx.deliver(Inbound(conversation, sender_id=sender, text=text, attachments=files,
                                     message_id=form.get("messageId", ""), sender_name=form.get("nickname", "")))
        return 200, {}

    def _file(self, payload: bytes) -> tuple[str, list[Attachment]]:
        """(caption, [the file]) of a file message; its blob is fetched and opened later."""
        try:
            descriptor = json.loads(payload)
            blob, key = str(descriptor["b"]), SecretBox(bytes.fromhex(str(descriptor["k"])))
        except (ValueError, KeyError, TypeError):
            raise ValueError("a file message without its blob id and key") from None
        auth = urlencode({"from": self.identity(), "secret": self.env("secret_env")})
        # The URL carries the API secret: made when fetched, never kept on the attachment.
        locate = lambda: self.api(f"/blobs/{blob}?{auth}")  # noqa: E731
        return str(descriptor.get("d") or ""), [Attachment(
            str(descriptor.get("n") or "file"), str(descriptor.get("m") or ""), int(descriptor.get("s") or 0),
            locate=locate, open=lambda sealed: key.decrypt(sealed, BLOB_NONCE))]

    def file_hosts(self) -> set[str]:
        return {host_of(self.api(""))}

    def send(self, conversation: Conversation, text: str) -> str:
        key, message_id = self.private_key(), ""
        base = {"from": self.identity(), "to": conversation.chat_id, "secret": self.env("secret_env")}
        for part in self.reply_texts(text):
            if key is None:
                response = self.http.request("POST", self.api("/send_simple"), data={**base, "text": part})
            else:
                response = self._send_e2e(key, base, bytes([TEXT]) + part.encode("utf-8"))
            message_id = response.text.strip()
        return message_id

    def _send_e2e(self, key: PrivateKey, base: dict[str, str], content: bytes) -> Any:
        nonce = secrets.token_bytes(Box.NONCE_SIZE)
        box = Box(key, self.public_key(base["to"])).encrypt(pad(content), nonce).ciphertext
        return self.http.request("POST", self.api("/send_e2e"), data={**base, "nonce": nonce.hex(), "box": box.hex()})

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        key = self.private_key()
        if key is None:
            raise ChannelError("threema: files need end-to-end mode (private_key_env); basic mode sends text only")
        auth = {"from": self.identity(), "secret": self.env("secret_env")}
        blob_key = secrets.token_bytes(SecretBox.KEY_SIZE)
        sealed = SecretBox(blob_key).encrypt(data, BLOB_NONCE).ciphertext
        blob_id = self.http.request("POST", self.api("/upload_blob"), params=auth,
                                    files={"blob": ("blob", sealed, "application/octet-stream")}).text.strip()
        media = content_type in MEDIA
        descriptor = {"b": blob_id, "k": blob_key.hex(), "m": content_type, "n": filename, "s": len(data),
                      "j": 1 if media else 0, "i": 1 if media else 0}
        response = self._send_e2e(key, {**auth, "to": conversation.chat_id},
                                  bytes([FILE]) + json.dumps(descriptor).encode("utf-8"))
        return response.text.strip()

    def test_target(self, override: str = "") -> Conversation:
        if not override:
            raise ChannelError("pass chat_id (a recipient's 8-character Threema ID) to send a test message")
        return Conversation(self.name, override, override, direct=True)

    def close(self) -> None:
        super().close()
        self.http.close()


ADAPTER = ThreemaAdapter
