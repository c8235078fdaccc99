"""DingTalk robot: outgoing-robot callbacks on the adapter's own listener, verified by the
`timestamp` + `sign` headers (base64 HMAC-SHA256 keyed with the robot's secret over
"<timestamp>\\n<secret>", the timestamp within one hour) before parsing. Replies go to the
callback's `sessionWebhook` while it is valid, else to the custom robot webhook
`/robot/send?access_token=..&timestamp=..&sign=..` (signed the same way).

Docs: https://open.dingtalk.com/document/orgapp/receive-message (callbacks) and
https://open.dingtalk.com/document/robots/custom-robot-access (custom robot, signing).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.webhook import Request, WebhookAdapter

API_URL = "https://oapi.dingtalk.com"
WINDOW_MS = 3600 * 1000  # DingTalk refuses callbacks older than an hour; so do we
SESSION_MARGIN_MS = 30 * 1000  # don't start a send on a session webhook about to expire


def dingtalk_sign(secret: str, timestamp: str) -> str:
    """base64(HMAC-SHA256(secret, "<timestamp>\\n<secret>")), as both directions use it."""
    return hmacs.b64_digest(secret, f"{timestamp}\n{secret}")


class DingTalkAdapter(WebhookAdapter):
    max_message_len = 5000
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)

    def base(self) -> str:
        return (self.settings.get("api_url") or API_URL).rstrip("/")

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8457)

    def prepare(self) -> None:
        self.env("secret_env")
        self.env("access_token_env")

    def verify(self, request: Request) -> bool:
        secret = self.env("secret_env", required=False)
        timestamp, given = request.headers.get("timestamp") or "", request.headers.get("sign") or ""
        if not (secret and timestamp.isdigit() and given):
            return False
        if abs(time.time() * 1000 - int(timestamp)) > WINDOW_MS:
            return False
        return hmacs.check(secret, f"{timestamp}\n{secret}", given, encoding="base64")

    def _inbound(self, request: Request) -> tuple[int, Any]:
        data = request.json()
        if not isinstance(data, dict):
            raise ValueError("body must be a JSON object")
        text = (data.get("text") or {}).get("content") if data.get("msgtype") == "text" else None
        if isinstance(text, str) and text.strip():
            user = str(data.get("senderStaffId") or data.get("senderId") or "")
            aliases = tuple(str(v) for v in (data.get("senderId"), data.get("senderNick")) if v)
            meta = {"session_webhook": self._trusted(data.get("sessionWebhook")),
                    "session_expires": int(data.get("sessionWebhookExpiredTime") or 0), "staff_id": user}
            conversation = Conversation(self.name, str(data.get("conversationId") or user), user,
                                        direct=str(data.get("conversationType")) == "1", meta=meta)
            self.ctx.deliver(Inbound(conversation, sender_id=user, text=text.strip(),
                                     message_id=str(data.get("msgId") or ""),
                                     sender_name=str(data.get("senderNick") or ""), sender_aliases=aliases))
        return 200, {}  # the answer follows through the session webhook

    def _trusted(self, url: Any) -> str:
        # The signature covers only the timestamp, not the body: never post to a host
        # other than DingTalk's own API (or the configured api_url), whatever a body says.
        if not isinstance(url, str):
            return ""
        ours, theirs = urlsplit(self.base()), urlsplit(url)
        return url if (theirs.scheme, theirs.netloc) == (ours.scheme, ours.netloc) else ""

    def send(self, conversation: Conversation, text: str) -> str:
        for part in self.reply_texts(text):
            payload: dict[str, Any] = {"msgtype": "text", "text": {"content": part}}
            session = conversation.meta.get("session_webhook") or ""
            expires = int(conversation.meta.get("session_expires") or 0)
            if session and time.time() * 1000 < expires - SESSION_MARGIN_MS:
                if not conversation.direct and conversation.meta.get("staff_id"):
                    payload["at"] = {"atUserIds": [conversation.meta["staff_id"]]}
                self._post(session, payload)
            else:  # the session expired: the custom robot webhook of the robot's group
                timestamp = str(int(time.time() * 1000))
                secret = self.env("secret_env")
                self._post(self.base() + "/robot/send", payload, params={
                    "access_token": self.env("access_token_env"), "timestamp": timestamp,
                    "sign": dingtalk_sign(secret, timestamp)})
        return ""  # DingTalk's robot answers carry no message id

    def _post(self, url: str, payload: dict[str, Any], params: dict[str, str] | None = None) -> None:
        answer = self.http.json("POST", url, json=payload, params=params)
        if not isinstance(answer, dict) or answer.get("errcode") not in (0, None):
            message = answer.get("errmsg") if isinstance(answer, dict) else "not JSON"
            raise ChannelError(f"dingtalk send: errcode {answer.get('errcode') if isinstance(answer, dict) else '?'}"
                               f" {message}")

    def test_target(self, override: str = "") -> Conversation:
        # The custom robot webhook posts to the group the robot belongs to.
        return Conversation(self.name, override or "robot-webhook", "", direct=False)

    def close(self) -> None:
        super().close()
        self.http.close()


ADAPTER = DingTalkAdapter
