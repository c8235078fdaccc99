"""Flock bot adapter: Flock POSTs events to the app's event listener URL with an
`X-Flock-Event-Token` (a JWT, HS256 with the app secret, claims appId/userId/exp/iat/jti):
its signature, expiry and `appId` are checked before the body is parsed, then its
`userId` against the event's. `chat.receiveMessage` (`message.from`, `.to`, `.text`)
reaches the agent; `app.install` / `app.uninstall` are acknowledged and the installing
users recorded (ids only, never their tokens). Replies: `POST /v1/chat.sendMessage`
(form `token` = bot token, `to`, `text`).

Docs: https://docs.flock.com/display/flockos/Event+Tokens, .../chat.receiveMessage,
.../app.install, .../chat.sendMessage.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.webhook import Request, WebhookAdapter

API_URL = "https://api.flock.co/v1"
LEEWAY = 30.0  # seconds of clock skew allowed on `exp` (Flock's tokens live only seconds)


def _b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def event_token_claims(token: str, secret: str, app_id: str, now: float | None = None) -> dict[str, Any] | None:
    """The claims of a valid event token (HS256 signature, not expired, our appId), else None."""
    try:
        header_b64, payload_b64, signature_b64 = token.strip().split(".")
        header, claims = json.loads(_b64(header_b64)), json.loads(_b64(payload_b64))
        signature = _b64(signature_b64)
    except (ValueError, TypeError):
        return None
    expected = hmacs.digest(secret, f"{header_b64}.{payload_b64}")
    if not isinstance(header, dict) or header.get("alg") != "HS256" or not hmacs.same(signature, expected):
        return None  # "alg": "none" or any other algorithm is refused outright
    if not isinstance(claims, dict) or not isinstance(claims.get("exp"), (int, float)):
        return None
    if claims["exp"] + LEEWAY < (time.time() if now is None else now) or claims.get("appId") != app_id:
        return None
    return claims


class FlockAdapter(WebhookAdapter):
    max_message_len = 4000
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8456)

    def prepare(self) -> None:
        if not self.settings.get("app_id"):
            raise ChannelError("app_id is not set: event tokens are checked against the app's id")
        self.env("app_secret_env")
        self.env("bot_token_env")

    def claims(self, request: Request) -> dict[str, Any] | None:
        """The request's valid event-token claims (header, or `flockEventToken` query), else None."""
        secret = self.env("app_secret_env", required=False)
        token = request.headers.get("x-flock-event-token") or (request.query.get("flockEventToken") or [""])[0]
        if not (secret and token):
            return None
        return event_token_claims(token, secret, str(self.settings.get("app_id") or ""))

    def verify(self, request: Request) -> bool:
        return self.claims(request) is not None

    def _inbound(self, request: Request) -> tuple[int, Any]:
        event = request.json()
        if not isinstance(event, dict):
            raise ValueError("body must be a JSON object")
        user = str(event.get("userId") or "")
        if user != (self.claims(request) or {}).get("userId"):  # a valid token for another user's event
            return 401, {"error": "invalid signature"}
        name = event.get("name")
        if name in ("app.install", "app.uninstall"):
            state = self.ctx.load_state()
            users = [u for u in state.get("installed_by", []) if u != user]
            self.ctx.save_state({**state, "installed_by": users + ([user] if name == "app.install" else [])})
            self.ctx.audit(name.replace("app.", "app_"), user=user)
            return 200, {}
        message = event.get("message") if name == "chat.receiveMessage" else None
        if isinstance(message, dict) and isinstance(message.get("text"), str) and message["text"].strip():
            sender, to = str(message.get("from") or user), str(message.get("to") or "")
            group = to.startswith("g:")  # group chats are answered in the group, 1:1 chats to the user
            conversation = Conversation(self.name, to if group else sender, sender, direct=not group)
            self.ctx.deliver(Inbound(conversation, sender_id=sender, text=message["text"],
                                     message_id=str(message.get("uid") or message.get("id") or "")))
        return 200, {}

    def send(self, conversation: Conversation, text: str) -> str:
        url = (self.settings.get("api_url") or API_URL).rstrip("/") + "/chat.sendMessage"
        uid = ""
        for part in self.reply_texts(text):
            answer = self.http.json("POST", url, data={"token": self.env("bot_token_env"),
                                                       "to": conversation.chat_id, "text": part})
            uid = str(answer.get("uid") or "") if isinstance(answer, dict) else ""
        return uid

    def test_target(self, override: str = "") -> Conversation:
        if not override:
            raise ChannelError("pass chat_id (a Flock user id u:... or group id g:...) to send a test message")
        return Conversation(self.name, override, override, direct=override.startswith("u:"))

    def close(self) -> None:
        super().close()
        self.http.close()


ADAPTER = FlockAdapter
