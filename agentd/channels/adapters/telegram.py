"""Telegram Bot API: long-polling `getUpdates` (offset persisted), replies with
`sendMessage`, typing with `sendChatAction`. `api_url` overrides api.telegram.org."""

from __future__ import annotations

from typing import Any

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.polling import PollingAdapter


class TelegramAdapter(PollingAdapter):
    max_message_len = 4096  # after entity parsing, in UTF-16 units: the HTML is at least as long
    limit_unit = "utf16"
    text_format = "telegram_html"

    def prepare(self) -> None:
        self.token = self.env("bot_token_env")
        base = (self.settings.get("api_url") or "https://api.telegram.org").rstrip("/")
        self.base = f"{base}/bot{self.token}"
        self.long_poll = int(self.settings.get("long_poll_secs") or 25)
        # A pause between getUpdates calls (0: none, the long poll already waits for updates).
        self.poll_interval = float(self.settings.get("poll_interval_secs") or 0)

    def call(self, method: str, timeout: float | None = None, retries: int | None = None,
             **params: Any) -> Any:
        data = self.http.json("POST", f"{self.base}/{method}", json=params, timeout=timeout, retries=retries)
        if not isinstance(data, dict) or not data.get("ok"):
            raise ChannelError(f"{method}: {data.get('description') if isinstance(data, dict) else data}")
        return data["result"]

    def poll_once(self) -> None:
        if not getattr(self, "me", None):
            self.me = self.call("getMe", retries=0)
        # `timeout` is Telegram's long-poll wait; the HTTP timeout allows for it.
        params = {"offset": self.state.get("offset", 0), "timeout": self.long_poll,
                  "allowed_updates": ["message"]}
        updates = self.http.json("POST", f"{self.base}/getUpdates", json=params,
                                 timeout=self.long_poll + 10, retries=0)
        if not isinstance(updates, dict) or not updates.get("ok"):
            raise ChannelError(f"getUpdates: {updates}")
        updates = updates["result"]
        for update in updates:
            # Persist first: a crash mid-batch must not answer an update twice.
            self.save_cursor(offset=int(update["update_id"]) + 1)
            self._handle(update.get("message") or {})

    def _handle(self, message: dict[str, Any]) -> None:
        text, chat, sender = message.get("text"), message.get("chat") or {}, message.get("from") or {}
        if not isinstance(text, str) or not sender or sender.get("is_bot"):
            return
        direct = chat.get("type") == "private"
        user_id = str(sender.get("id"))
        conversation = Conversation(self.name, str(chat.get("id")), user_id, direct=direct,
                                    meta={"reply_to": message.get("message_id")})
        aliases = tuple(a for a in (sender.get("username"), f"@{sender.get('username')}") if sender.get("username"))
        self.ctx.deliver(Inbound(conversation, sender_id=user_id, text=text,
                                 message_id=str(message.get("message_id")),
                                 sender_name=sender.get("first_name") or sender.get("username") or user_id,
                                 sender_aliases=aliases))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        sent = []
        for part in self.format_reply(text):
            params: dict[str, Any] = {"chat_id": _chat_id(conversation.chat_id), "text": part.text}
            if part.format == "telegram_html":
                params["parse_mode"] = "HTML"
            if conversation.meta.get("reply_to") and not conversation.direct:
                params["reply_to_message_id"] = conversation.meta["reply_to"]
            sent.append(str(self.call("sendMessage", **params).get("message_id")))
        return ",".join(sent)

    def send_typing(self, conversation: Conversation) -> None:
        self.call("sendChatAction", retries=0, chat_id=_chat_id(conversation.chat_id), action="typing")

    def test_target(self, override: str = "") -> Conversation:
        chat = override or str(self.settings.get("default_chat_id") or "")
        if not chat:
            raise ChannelError("no test target: set default_chat_id or pass chat_id")
        return Conversation(self.name, chat, direct=True)


def _chat_id(value: str) -> int | str:
    """Numeric chat ids go out as integers, @channelusername as a string (Bot API)."""
    return int(value) if value.lstrip("-").isdigit() else value


ADAPTER = TelegramAdapter
