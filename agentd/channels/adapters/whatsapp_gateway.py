"""WhatsApp personal account through a WhatsApp Web (Baileys) gateway, after the QR login
of /api/channels/whatsapp/qr/*: the same gateway protocol the original system ships.

The gateway forwards each WhatsApp message as `POST {OPENFANG_URL}/api/agents/{agent}/message`
with `{message, metadata: {channel, sender: "+<phone>", sender_name}}` and sends back
whatever `response` it gets. agentd points the gateway at this adapter's own listener, with a
secret first path segment: `OPENFANG_URL=http://127.0.0.1:<webhook_port>/<token>` (the token
in `gateway_token_env`), so only the gateway can post; the request is checked before
parsing. The message then runs like every channel message (allow-lists, the sender's own
session); the answer is `{"response": ""}` at once (the gateway sends nothing for it) and the
agent's reply goes out through the gateway's `POST /send {to, text}`. `active` follows the
gateway's `GET /health` (`connected`), checked every few seconds.

Files: none either way; the gateway's protocol carries text only (`message` in, `/send`'s
`text` out), so the adapter keeps the base's refusal to send files (audited).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.webhook import Request, WebhookAdapter

HEALTH_EVERY = 5.0  # seconds between gateway health checks
MAX_TEXT = 4096


class _Redact(logging.Filter):
    """Keeps the path token out of the listener's request log lines."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if self.secret in text:
            record.msg, record.args = text.replace(self.secret, "***"), ()
        return True


class WhatsAppGatewayAdapter(WebhookAdapter):
    max_message_len = MAX_TEXT
    text_format = "whatsapp"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping, retries=1, timeout=10.0)
        self.connected = False

    def gateway(self) -> str:
        var = self.settings.get("gateway_url_env") or "WHATSAPP_WEB_GATEWAY_URL"
        url = os.environ.get(var, "").strip().rstrip("/")
        if not url:
            raise ChannelError(f"environment variable {var} is not set (the WhatsApp Web gateway URL)")
        return url

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8443)

    def prepare(self) -> None:
        self.gateway()
        self._redact = _Redact(self.env("gateway_token_env"))
        self.ctx.log.addFilter(self._redact)

    def start(self) -> None:
        super().start()
        self.check_health()
        self.spawn(self._monitor, "health")

    def check_health(self) -> None:
        """Ask the gateway whether its WhatsApp session is connected (after the QR scan)."""
        try:
            data = self.http.json("GET", self.gateway() + "/health", retries=0)
            now = bool(isinstance(data, dict) and data.get("connected"))
        except ChannelError as exc:
            if self.connected:
                self.ctx.audit("connection_error", error=str(exc)[:200])
            now = False
        if now and not self.connected:
            self.ctx.audit("reconnected")
        self.connected = now

    def _monitor(self) -> None:
        while not self.stopping.wait(HEALTH_EVERY):
            self.check_health()

    def health(self) -> bool:
        return super().health() and self.connected

    def verify(self, request: Request) -> bool:
        token = self.env("gateway_token_env", required=False)
        parts = request.path.split("/")  # "", token, "api", "agents", name, "message"
        if not token or len(parts) != 6 or parts[2:4] != ["api", "agents"] or parts[5] != "message":
            return False
        return hmacs.same(parts[1], token)

    def _inbound(self, request: Request) -> tuple[int, Any]:
        data = request.json()
        if not isinstance(data, dict) or not isinstance(data.get("message"), str):
            raise ValueError("message must be a string")
        meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        phone = str(meta.get("sender") or "")
        if not phone.lstrip("+").isdigit():
            raise ValueError("metadata.sender must be the sender's phone number")
        conversation = Conversation(self.name, phone, phone, direct=True)
        self.ctx.deliver(Inbound(conversation, sender_id=phone, text=data["message"],
                                 sender_name=str(meta.get("sender_name") or ""),
                                 sender_aliases=(phone.lstrip("+"),)))
        return 200, {"response": ""}  # the reply follows through /send

    def send(self, conversation: Conversation, text: str) -> str:
        for part in self.reply_texts(text):
            self.http.json("POST", self.gateway() + "/send", json={"to": conversation.chat_id, "text": part})
        return ""  # the gateway's /send answers no message id

    def test_target(self, override: str = "") -> Conversation:
        if not override:
            raise ChannelError("pass chat_id (the recipient's phone number, +<digits>) to send a test message")
        return Conversation(self.name, override, override, direct=True)

    def close(self) -> None:
        super().close()
        self.http.close()
        if getattr(self, "_redact", None) is not None:
            self.ctx.log.removeFilter(self._redact)
