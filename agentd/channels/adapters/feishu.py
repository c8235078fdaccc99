"""Feishu / Lark: event subscription v2 callbacks on the adapter's own listener
(`webhook_path`). Checked before the event is used: `X-Lark-Request-Timestamp`
within 5 minutes of now (required on signed callbacks), `X-Lark-Signature` =
hex sha256(timestamp + nonce + encrypt_key + raw body) when an encrypt key is set, and
the verification token carried in the (decrypted) body when one is set. Encrypted bodies
(`{"encrypt": base64(iv + AES-256-CBC(sha256(encrypt_key)))}`) are decrypted; the
`url_verification` challenge is echoed; `im.message.receive_v1` text messages reach the
agent (direct chats always, groups when the bot is mentioned), once per event id.
Replies: a cached tenant_access_token, then `/open-apis/im/v1/messages/{id}/reply`
(or `/open-apis/im/v1/messages?receive_id_type=chat_id`).

Files: `image`, `file` and `audio` messages (and the images of a `post`) are fetched with
GET /open-apis/im/v1/messages/{message_id}/resources/{key}?type=image|file and the tenant
token, from the Open API host only. Files go out uploaded first, an image with
POST /open-apis/im/v1/images (`image_type` message) and anything else with
POST /open-apis/im/v1/files (`file_type` pdf, doc, xls, ppt or stream), then as a message
of `msg_type` image (`image_key`) or file (`file_key`), in reply to the asking message.

Reactions (`lifecycle_reactions`): POST /open-apis/im/v1/messages/{message_id}/reactions with
one of Feishu's own emoji types (👀 is GLANCE, ✅ DONE, ⚠️ CRY; a name such as THUMBSUP
passes through), taken off again with DELETE .../reactions/{reaction_id}.

Docs: https://open.feishu.cn/document/server-docs/event-subscription-guide/ (callbacks,
encryption, signature), .../im-v1/message/create and .../reply, .../auth-v3/tenant_access_token_internal
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections import OrderedDict
from typing import Any

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from agentd import hmacs, jsonsafe
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of, with_bearer
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.tokens import CachedToken
from agentd.channels.bases.webhook import Request, WebhookAdapter, within_window

REGIONS = {"cn": "https://open.feishu.cn", "intl": "https://open.larksuite.com"}
MENTION = re.compile(r"@_user_\d+\s*")
# What /open-apis/im/v1/images takes (the rest goes out as a file); file_type by extension.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp", "image/tiff", "image/bmp")
FILE_TYPES = {"pdf": "pdf", "doc": "doc", "docx": "doc", "xls": "xls", "xlsx": "xls", "ppt": "ppt", "pptx": "ppt"}
MESSAGE_FILES = ("image", "file", "audio", "post")
# Feishu reacts with its own emoji types, not Unicode emoji: the lifecycle's and a few common ones.
EMOJI_TYPES = {"👀": "GLANCE", "✅": "DONE", "⚠️": "CRY", "⚠": "CRY", "😢": "CRY", "👍": "THUMBSUP",
               "👌": "OK", "😄": "SMILE", "🙂": "SMILE", "❤️": "HEART", "🎉": "PARTY", "🔥": "Fire",
               "🤔": "THINKING"}
REACTIONS_KEPT = 1000  # reaction ids remembered to take a reaction off again
SAFE_KEY = re.compile(r"[\w-]+")  # message ids and resource keys go into a URL path


def decrypt(encrypt_key: str, data: str) -> bytes:
    """Feishu's event encryption: base64(16-byte IV + AES-256-CBC, key sha256(encrypt_key), PKCS#7)."""
    raw = base64.b64decode(data, validate=True)
    if len(raw) < 32 or len(raw) % 16:
        raise ValueError("encrypted payload has a bad length")
    decryptor = Cipher(algorithms.AES(hashlib.sha256(encrypt_key.encode()).digest()), modes.CBC(raw[:16])).decryptor()
    padded = decryptor.update(raw[16:]) + decryptor.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    return unpadder.update(padded) + unpadder.finalize()


class FeishuAdapter(WebhookAdapter):
    max_message_len = 10000
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)
        self.token = CachedToken(self._fetch_token)
        self.seen: OrderedDict[str, None] = OrderedDict()  # event ids: Feishu redelivers until it gets 200
        # (message id, emoji type) -> reaction id: Feishu takes a reaction off by its id.
        self.reaction_ids: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    def base(self) -> str:
        return (self.settings.get("api_url") or REGIONS.get(str(self.settings.get("region") or "cn"), "")).rstrip("/")

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8453)

    def prepare(self) -> None:
        if (self.settings.get("mode") or "webhook") != "webhook":
            raise ChannelError('mode "websocket" (Feishu long connection) is not implemented: set mode = "webhook" '
                               "and subscribe the events to this listener's public URL")
        if not self.base():
            raise ChannelError("region must be cn or intl (or set api_url)")
        if not self.settings.get("app_id"):
            raise ChannelError("app_id is not set")
        self.env("app_secret_env")
        if not (self._encrypt_key() or self._verification_token()):
            raise ChannelError("set encrypt_key_env or verification_token(_env): without either, "
                               "callbacks cannot be verified")

    def _encrypt_key(self) -> str:
        return self.env("encrypt_key_env", required=False)

    def _verification_token(self) -> str:
        return self.env("verification_token_env", required=False) or str(self.settings.get("verification_token") or "")

    def routes(self):  # type: ignore[no-untyped-def]
        return {("POST", self.settings.get("webhook_path") or "/feishu/webhook"): self._inbound}

    def payload(self, body: bytes) -> dict[str, Any]:
        """The callback's JSON, decrypted when it is encrypted."""
        data = jsonsafe.loads(body.decode("utf-8"))
        if isinstance(data, dict) and "encrypt" in data:
            key = self._encrypt_key()
            if not key or not isinstance(data["encrypt"], str):
                raise ValueError("encrypted callback but no encrypt key configured")
            data = jsonsafe.loads(decrypt(key, data["encrypt"]).decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("body must be a JSON object")
        return data

    def verify(self, request: Request) -> bool:
        key, token = self._encrypt_key(), self._verification_token()
        h = request.headers
        stamp = h.get("x-lark-request-timestamp")
        if stamp is not None and not within_window(stamp, 300):
            return False  # a replayed or badly clocked callback, refused before its body is read
        if key and h.get("x-lark-signature"):
            if not stamp:
                return False  # the signature covers the timestamp: without one it proves nothing fresh
            base = ((h.get("x-lark-request-timestamp") or "") + (h.get("x-lark-request-nonce") or "")
                    + key).encode("utf-8") + request.body
            if not hmacs.same(h["x-lark-signature"].strip(), hashlib.sha256(base).hexdigest()):
                return False
            if not token:
                return True
        elif not token:  # unsigned, and no token to vouch for it: only the harmless handshake
            try:
                return bool(key) and self.payload(request.body).get("type") == "url_verification"
            except ValueError:
                return False
        try:  # the verification token, inside the (decrypted) body
            raw, data = jsonsafe.loads(request.body), self.payload(request.body)
        except ValueError:  # bad JSON, base64, padding or UTF-8
            return False
        if key and not (isinstance(raw, dict) and "encrypt" in raw):
            return False  # with an encrypt key, Feishu encrypts every callback
        header = data.get("header") if isinstance(data.get("header"), dict) else {}
        given = header.get("token") or data.get("token")
        return isinstance(given, str) and hmacs.same(given, token)

    def _inbound(self, request: Request) -> tuple[int, Any]:
        data = self.payload(request.body)
        if data.get("type") == "url_verification":
            return 200, {"challenge": str(data.get("challenge") or "")}
        header, event = data.get("header") or {}, data.get("event") or {}
        if data.get("schema") != "2.0" or header.get("event_type") != "im.message.receive_v1":
            return 200, {}
        event_id = str(header.get("event_id") or "")
        if event_id in self.seen:
            return 200, {}
        self.seen[event_id] = None
        while len(self.seen) > 1000:
            self.seen.popitem(last=False)
        message, sender = event.get("message") or {}, event.get("sender") or {}
        kind = message.get("message_type")
        if kind not in ("text", *MESSAGE_FILES) or sender.get("sender_type") not in (None, "user"):
            return 200, {}
        content = json.loads(message.get("content") or "{}")
        content = content if isinstance(content, dict) else {}
        files = self._attachments(str(message.get("message_id") or ""), kind, content)
        text = content.get("text") if kind == "text" else _post_text(content) if kind == "post" else ""
        direct = message.get("chat_type") == "p2p"
        mentions = [m for m in message.get("mentions") or [] if isinstance(m, dict)]
        names = {n.lower() for n in self.settings.get("bot_names") or []}
        if not isinstance(text, str) or not (text or files):
            return 200, {}
        # A group message is addressed when it mentions the bot (one of `bot_names`, when set).
        mentioned = any(not names or str(m.get("name") or "").lower() in names for m in mentions)
        ids = sender.get("sender_id") or {}
        user = str(ids.get("open_id") or "")
        conversation = Conversation(self.name, str(message.get("chat_id") or user), user, direct=direct,
                                    meta={"message_id": str(message.get("message_id") or "")})
        self.ctx.deliver(Inbound(conversation, sender_id=user, text=MENTION.sub("", text).strip(),
                                 message_id=conversation.meta["message_id"], attachments=files,
                                 addressed=direct or mentioned,
                                 sender_aliases=tuple(str(ids[k]) for k in ("user_id", "union_id") if ids.get(k))))
        return 200, {}

    def _attachments(self, message_id: str, kind: str, content: dict[str, Any]) -> list[Attachment]:
        found: list[tuple[str, str, str]] = []  # (key, resource type, name)
        if kind == "image" and content.get("image_key"):
            found.append((str(content["image_key"]), "image", str(content["image_key"])))
        elif kind in ("file", "audio") and content.get("file_key"):
            default = f"{content['file_key']}.opus" if kind == "audio" else str(content["file_key"])
            found.append((str(content["file_key"]), "file", str(content.get("file_name") or default)))
        elif kind == "post":
            for line in _post_lines(content):
                for item in line:
                    if isinstance(item, dict) and item.get("tag") == "img" and item.get("image_key"):
                        found.append((str(item["image_key"]), "image", str(item["image_key"])))
        return [with_bearer(Attachment(
            name, "", 0, f"{self.base()}/open-apis/im/v1/messages/{message_id}/resources/{key}?type={resource}"), self.token.get)
            for key, resource, name in found if SAFE_KEY.fullmatch(message_id) and SAFE_KEY.fullmatch(key)]

    def file_hosts(self) -> set[str]:
        return {host_of(self.base())}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if content_type in IMAGE_TYPES:
            uploaded = self._upload("/open-apis/im/v1/images", {"image_type": "message"},
                                    {"image": (filename, data, content_type)})
            msg_type, content = "image", {"image_key": str(uploaded.get("image_key") or "")}
        else:
            ext = filename.rpartition(".")[2].lower()
            fields = {"file_type": FILE_TYPES.get(ext, "stream"), "file_name": filename}
            uploaded = self._upload("/open-apis/im/v1/files", fields, {"file": (filename, data, content_type)})
            msg_type, content = "file", {"file_key": str(uploaded.get("file_key") or "")}
        body = {"msg_type": msg_type, "content": json.dumps(content)}
        reply_to = conversation.meta.get("message_id") or ""
        if reply_to:
            sent = self.call(f"/open-apis/im/v1/messages/{reply_to}/reply", body)
        else:
            sent = self.call("/open-apis/im/v1/messages", {"receive_id": conversation.chat_id, **body},
                              params={"receive_id_type": "chat_id"})
        return str(sent.get("message_id") or "")

    def _upload(self, path: str, fields: dict[str, str], files: dict[str, Any]) -> dict[str, Any]:
        answer = self.http.json("POST", self.base() + path, data=fields, files=files,
                                headers={"Authorization": "Bearer " + self.token.get()})
        if not isinstance(answer, dict) or answer.get("code") != 0:
            raise ChannelError(f"feishu {path}: {answer.get('msg') if isinstance(answer, dict) else 'not JSON'}")
        return answer.get("data") or {}

    def _fetch_token(self) -> tuple[str, float]:
        answer = self.http.json("POST", self.base() + "/open-apis/auth/v3/tenant_access_token/internal",
                                json={"app_id": self.settings.get("app_id"), "app_secret": self.env("app_secret_env")})
        if not isinstance(answer, dict) or answer.get("code") != 0 or not answer.get("tenant_access_token"):
            raise ChannelError(f"feishu tenant_access_token: {answer.get('msg') if isinstance(answer, dict) else answer}")
        return str(answer["tenant_access_token"]), float(answer.get("expire") or 7200)

    def call(self, path: str, payload: dict[str, Any], params: dict[str, str] | None = None) -> dict[str, Any]:
        """POST an Open API call with the tenant token; `data` of a `code` 0 answer."""
        answer = self.http.json("POST", self.base() + path, json=payload, params=params,
                                headers={"Authorization": "Bearer " + self.token.get()})
        if not isinstance(answer, dict) or answer.get("code") != 0:
            raise ChannelError(f"feishu {path}: {answer.get('msg') if isinstance(answer, dict) else 'not JSON'}")
        return answer.get("data") or {}

    def send(self, conversation: Conversation, text: str) -> str:
        message_id = ""
        reply_to = conversation.meta.get("message_id") or ""
        for part in self.reply_texts(text):
            content = json.dumps({"text": part}, ensure_ascii=False)
            if reply_to:
                data = self.call(f"/open-apis/im/v1/messages/{reply_to}/reply", {"msg_type": "text", "content": content})
            else:
                data = self.call("/open-apis/im/v1/messages", {"receive_id": conversation.chat_id, "msg_type": "text",
                                                               "content": content}, params={"receive_id_type": "chat_id"})
            message_id = str(data.get("message_id") or "")
        return message_id

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        emoji_type = EMOJI_TYPES.get(emoji, emoji)
        if not SAFE_KEY.fullmatch(message_id):
            raise ChannelError(f"feishu: not a message id: {message_id[:40]!r}")
        data = self._reaction_call("POST", f"/open-apis/im/v1/messages/{message_id}/reactions",
                                   {"reaction_type": {"emoji_type": emoji_type}})
        with self._lock:
            self.reaction_ids[(message_id, emoji_type)] = str(data.get("reaction_id") or "")
            while len(self.reaction_ids) > REACTIONS_KEPT:
                self.reaction_ids.popitem(last=False)

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        with self._lock:
            reaction_id = self.reaction_ids.pop((message_id, EMOJI_TYPES.get(emoji, emoji)), "")
        if reaction_id and SAFE_KEY.fullmatch(message_id) and SAFE_KEY.fullmatch(reaction_id):
            self._reaction_call("DELETE", f"/open-apis/im/v1/messages/{message_id}/reactions/{reaction_id}")

    def _reaction_call(self, method: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """A reaction is cosmetic: one attempt, its failure the caller's to log."""
        answer = self.http.json(method, self.base() + path, json=payload, retries=0,
                                headers={"Authorization": "Bearer " + self.token.get()})
        if not isinstance(answer, dict) or answer.get("code") != 0:
            raise ChannelError(f"feishu {path}: {answer.get('msg') if isinstance(answer, dict) else 'not JSON'}")
        return answer.get("data") or {}

    def test_target(self, override: str = "") -> Conversation:
        if not override:
            raise ChannelError("pass chat_id (a Feishu chat_id, oc_...) to send a test message")
        return Conversation(self.name, override, "", direct=False)

    def close(self) -> None:
        super().close()
        self.http.close()


def _post_lines(content: dict[str, Any]) -> list[Any]:
    """The paragraphs of a `post` (rich text) message: its `content`, in the event's own
    shape or under a language key (zh_cn, en_us...)."""
    body = content if "content" in content else next((v for v in content.values() if isinstance(v, dict)), {})
    lines = body.get("content") if isinstance(body, dict) else None
    return [line for line in lines if isinstance(line, list)] if isinstance(lines, list) else []


def _post_text(content: dict[str, Any]) -> str:
    """A `post` message's words: its title and the text of its paragraphs."""
    body = content if "content" in content else next((v for v in content.values() if isinstance(v, dict)), {})
    title = str(body.get("title") or "") if isinstance(body, dict) else ""
    lines = ["".join(str(i.get("text") or "") for i in line if isinstance(i, dict) and i.get("tag") in ("text", "a"))
             for line in _post_lines(content)]
    return "\n".join(p for p in (title, *lines) if p.strip())


ADAPTER = FeishuAdapter
