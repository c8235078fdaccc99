"""Mumble text chat over the control channel (TLS to the server's TCP port): Version +
Authenticate, a Ping every `ping_secs`, the users and channels the server announces, and
TextMessage in and out. Direct messages to the bot are answered privately; messages in
its channel are answered when they start with its name ("agentd: ..."). It moves into
`channel` (by name) after login. Voice is ignored. The protocol's few messages are
encoded by hand (mumble_wire.py) because no maintained Python client fits: pymumble
pins protobuf 3.x, needs libopus and uses the removed ssl.wrap_socket.

Images: Mumble has no file transfer; clients put an image in a text message as
`<img src="data:image/...;base64,...">`, which the server passes up to its image message
length (ServerConfig `image_message_length`; murmur's `imagemessagelength`, 131072 by
default). Such images come in as files carried in the message (an `<img>` naming any other
URL is not fetched), and an image the agent makes goes out the same way."""

from __future__ import annotations

import base64
import binascii
import hashlib
import html
import mimetypes
import re
import socket
import ssl
import time

from agentd.channels.adapter import Adapter, ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment
from agentd.channels.adapters import mumble_wire as wire
from agentd.channels.bases.backoff import Reconnects
from agentd.channels.bases.duplex import DuplexSocket
from agentd.retry import Backoff

REJECTS = {1: "wrong version", 2: "invalid username", 3: "wrong user password", 4: "wrong server password",
           5: "username in use", 6: "server full", 7: "certificate required", 8: "authenticator failed"}
INLINE_IMAGE = re.compile(r"""<img\b[^>]*?\bsrc\s*=\s*["']data:(image/[\w.+-]+);base64,([A-Za-z0-9+/=\s]*)["'][^>]*>""",
                          re.IGNORECASE)
IMAGE_MESSAGE_LENGTH = 131072  # murmur's default, until the server's ServerConfig says otherwise


class MumbleAdapter(Adapter):
    max_message_len = 5000  # the server's default textmessagelength
    text_format = "html"  # Mumble draws messages as HTML

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.username = str(settings.get("username") or "agentd")
        self.backoff = Backoff(initial=0.5, maximum=30.0)
        self.sock: DuplexSocket | None = None
        self.session = -1
        self.users: dict[int, str] = {}
        self.channels: dict[int, str] = {}
        self.my_channel = 0
        self.image_limit = IMAGE_MESSAGE_LENGTH

    def start(self) -> None:
        if not self.settings.get("host"):
            raise ChannelError("host is not set")
        self.password = self.env("password_env", required=False) if self.settings.get("password_env") else ""
        self.spawn(self._loop, "reader")
        self.spawn(self._pinger, "ping")

    def _connect(self) -> DuplexSocket:
        context = ssl.create_default_context()
        if not self.settings.get("tls_verify"):  # most servers use a self-signed certificate
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        host = str(self.settings["host"])
        raw = socket.create_connection((host, int(self.settings.get("port") or 64738)), timeout=15)
        # The reader, the pinger and the senders share this one TLS connection.
        return DuplexSocket(context.wrap_socket(raw, server_hostname=host))

    def _loop(self) -> None:
        link = Reconnects(self.ctx, self.backoff, "mumble: %s")
        while not self.stopping.is_set():
            try:
                self.sock = self._connect()
                self.session, self.users, self.channels = -1, {}, {}
                self._send(wire.VERSION, [(1, wire.CLIENT_VERSION), (2, "agentd"), (3, "agentd"), (4, "")])
                self._send(wire.AUTHENTICATE, [(1, self.username), (2, self.password), (5, True)])
                while not self.stopping.is_set():
                    kind, fields = wire.read_frame(self._recv_exact)
                    self._dispatch(kind, fields)
                    if link.failing and self.session >= 0:
                        link.up()
            except Exception as exc:  # noqa: BLE001 - any failure: back off, connect again
                self.session = -1
                if self.stopping.is_set():
                    break
                link.down(exc)
                self._drop()
                self.backoff.wait(self.stopping)
        self._drop()

    def _recv_exact(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data)) if self.sock else b""
            if not chunk:
                raise ConnectionError("server closed the connection")
            data += chunk
        return data

    def _dispatch(self, kind: int, fields: dict) -> None:  # type: ignore[type-arg]
        first = lambda n, default=None: fields.get(n, [default])[0]  # noqa: E731
        if kind == wire.REJECT:
            reason = first(2, b"").decode("utf-8", "replace")
            raise ChannelError(f"login rejected: {REJECTS.get(first(1, 0), 'refused')} {reason}".strip())
        if kind == wire.CHANNEL_STATE:
            self.channels[first(1, 0)] = first(3, b"").decode() or self.channels.get(first(1, 0), "")
        elif kind == wire.USER_STATE:
            session = first(1)
            if first(3) is not None:
                self.users[session] = first(3).decode()
            if session == self.session and first(5) is not None:
                self.my_channel = first(5)
        elif kind == wire.USER_REMOVE:
            self.users.pop(first(1), None)
        elif kind == wire.SERVER_SYNC:
            self.session = first(1)
            wanted = str(self.settings.get("channel") or "")
            target = next((cid for cid, name in self.channels.items() if name == wanted), None)
            if wanted and target is None:
                self.ctx.log.warning("mumble: channel %r not found; staying in the root channel", wanted)
            elif target is not None:
                self._send(wire.USER_STATE, [(1, self.session), (5, target)])
                self.my_channel = target
        elif kind == wire.SERVER_CONFIG:
            self.image_limit = first(5, self.image_limit)  # 0: no limit
        elif kind == wire.TEXT_MESSAGE:
            self._text(fields)

    def _text(self, fields: dict) -> None:  # type: ignore[type-arg]
        actor = fields.get(1, [None])[0]
        name = self.users.get(actor, "")
        raw = re.sub(r"<br\s*/?>", "\n", fields.get(5, [b""])[0].decode("utf-8", "replace"))
        images = [image for image in map(self._image, INLINE_IMAGE.finditer(raw)) if image]
        text = html.unescape(re.sub(r"<[^>]+>", "", INLINE_IMAGE.sub("", raw))).strip()  # Mumble text is HTML
        if actor is None or actor == self.session or not name or not (text or images):
            return
        addressed = True
        if self.session in fields.get(2, []):
            conversation = Conversation(self.name, name, name, direct=True)
        else:  # a channel message is addressed when it starts with our name ("agentd: ...")
            prefix = re.match(rf"{re.escape(self.username)}\s*(?:[:,]\s*|$)", text, re.IGNORECASE)
            addressed = bool(prefix)
            text = text[prefix.end():] if prefix else text
            channel = self.channels.get(fields.get(3, [self.my_channel])[0], "")
            conversation = Conversation(self.name, channel, name, meta={"addressee": name})
        self.ctx.deliver(Inbound(conversation, sender_id=name, text=text, sender_name=name,
                                 message_id=f"{actor}:{time.time_ns()}", attachments=images, addressed=addressed))

    @staticmethod
    def _image(match: re.Match[str]) -> Attachment | None:
        try:
            data = base64.b64decode(re.sub(r"\s+", "", match.group(2)), validate=True)
        except (binascii.Error, ValueError):
            return None
        kind = match.group(1).lower()
        # The message names no file: the bytes do (the same picture keeps its name).
        name = f"image-{hashlib.sha256(data).hexdigest()[:8]}{mimetypes.guess_extension(kind) or '.img'}"
        return Attachment(name, kind, len(data), data=data) if data else None

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not content_type.startswith("image/"):
            raise ChannelError(f"mumble: {filename} is not an image; Mumble has no file transfer, "
                               "only images inline in a message")
        tag = f'<img src="data:{content_type};base64,{base64.b64encode(data).decode()}" alt="{html.escape(filename)}"/>'
        if self.image_limit and len(tag) > self.image_limit:
            raise ChannelError(f"mumble: {filename} is {len(tag)} characters inline; "
                               f"the server takes image messages up to {self.image_limit}")
        return self._post(conversation, tag)

    def send(self, conversation: Conversation, text: str) -> str:
        prefix = f"{conversation.meta['addressee']}: " if conversation.meta.get("addressee") else ""
        head = html.escape(prefix)
        ids = [self._post(conversation, head + (part.text if part.format == "html" else
                                                 html.escape(part.text).replace("\n", "<br>")))
               # Mumble draws every message as HTML: text in another format is escaped for it.
               for part in self.format_reply(text, self.max_message_len - len(head))]
        return ids[-1] if ids else f"{conversation.chat_id}:{time.time_ns()}"

    def _post(self, conversation: Conversation, body: str) -> str:
        if self.session < 0:
            raise ChannelError("not connected to the Mumble server")
        if conversation.direct:
            target = next((s for s, n in list(self.users.items()) if n == conversation.chat_id), None)
            if target is None:
                raise ChannelError(f"user {conversation.chat_id} is not on the server")
            where = (2, target)
        else:
            cid = next((c for c, n in list(self.channels.items()) if n == conversation.chat_id), self.my_channel)
            where = (3, cid)
        self._send(wire.TEXT_MESSAGE, [where, (5, body)])
        return f"{conversation.chat_id}:{time.time_ns()}"

    def _send(self, kind: int, fields: list) -> None:  # type: ignore[type-arg]
        sock = self.sock
        if sock is None:
            raise ChannelError("not connected to the Mumble server")
        sock.sendall(wire.frame(kind, fields))

    def _pinger(self) -> None:
        interval = float(self.settings.get("ping_secs") or 15)  # the server drops clients silent for 30 s
        while not self.stopping.wait(interval):
            if self.session >= 0:
                try:
                    self._send(wire.PING, [(1, int(time.time()))])
                except (OSError, ChannelError) as exc:
                    self.ctx.log.debug("mumble ping failed: %s", exc)

    def _drop(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def close(self) -> None:
        sock = self.sock
        if sock is not None:
            sock.shutdown()  # wakes the reader

    def health(self) -> bool:
        return self.session >= 0 and self.sock is not None

    def test_target(self, override: str = "") -> Conversation:
        if override:
            return Conversation(self.name, override, override, direct=override not in self.channels.values())
        return Conversation(self.name, str(self.settings.get("channel") or "Root"))


ADAPTER = MumbleAdapter
