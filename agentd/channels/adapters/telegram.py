"""Telegram Bot API: long-polling `getUpdates` (offset persisted), replies with
`sendMessage`, typing with `sendChatAction`, reactions with `setMessageReaction`.
Approvals carry an inline keyboard; a press arrives as a `callback_query`, answered with
`answerCallbackQuery` and, once decided, `editMessageText` (which drops the buttons). An
`edited_message` is answered as a new message. `api_url` overrides api.telegram.org."""

from __future__ import annotations

from typing import Any

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.polling import PollingAdapter
from agentd.channels.bases.sender import split_text


class TelegramAdapter(PollingAdapter):
    max_message_len = 4096

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
                  "allowed_updates": ["message", "edited_message", "callback_query"]}
        updates = self.http.json("POST", f"{self.base}/getUpdates", json=params,
                                 timeout=self.long_poll + 10, retries=0)
        if not isinstance(updates, dict) or not updates.get("ok"):
            raise ChannelError(f"getUpdates: {updates}")
        updates = updates["result"]
        for update in updates:
            # Persist first: a crash mid-batch must not answer an update twice.
            self.save_cursor(offset=int(update["update_id"]) + 1)
            if update.get("callback_query"):
                self._pressed(update["callback_query"])
            else:
                self._handle(update.get("message") or update.get("edited_message") or {},
                             edited="edited_message" in update)

    def _pressed(self, query: dict[str, Any]) -> None:
        verb, _, approval_id = str(query.get("data") or "").partition(":")
        sender, message = query.get("from") or {}, query.get("message") or {}
        chat = message.get("chat") or {}
        if verb not in ("approve", "reject") or not sender or not chat:
            return
        user_id = str(sender.get("id"))
        conversation = Conversation(self.name, str(chat.get("id")), user_id, direct=chat.get("type") == "private")
        aliases = tuple(a for a in (sender.get("username"), f"@{sender.get('username')}") if sender.get("username"))
        self.ctx.deliver(Inbound(conversation, sender_id=user_id, text=f"/{verb} {approval_id}",
                                 message_id=str(query.get("id")), sender_aliases=aliases,
                                 sender_name=sender.get("first_name") or sender.get("username") or user_id,
                                 interaction={"callback_query_id": query.get("id"), "chat_id": chat.get("id"),
                                              "message_id": message.get("message_id")}))

    def _handle(self, message: dict[str, Any], edited: bool = False) -> None:
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
                                 sender_aliases=aliases, edited=edited))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        sent = []
        for part in split_text(text, self.max_message_len):
            params: dict[str, Any] = {"chat_id": _chat_id(conversation.chat_id), "text": part}
            if conversation.meta.get("reply_to") and not conversation.direct:
                params["reply_to_message_id"] = conversation.meta["reply_to"]
            sent.append(str(self.call("sendMessage", **params).get("message_id")))
        return ",".join(sent)

    def send_typing(self, conversation: Conversation) -> None:
        self.call("sendChatAction", retries=0, chat_id=_chat_id(conversation.chat_id), action="typing")

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        # A bot has one reaction per message: each call replaces the previous one.
        self.call("setMessageReaction", retries=0, chat_id=_chat_id(conversation.chat_id),
                  message_id=int(message_id), reaction=[{"type": "emoji", "emoji": emoji}])

    def send_approval(self, conversation: Conversation, approval_id: str, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        keyboard = [[{"text": "✅ Approve", "callback_data": f"approve:{approval_id}"},
                     {"text": "❌ Reject", "callback_data": f"reject:{approval_id}"}]]
        sent = self.call("sendMessage", chat_id=_chat_id(conversation.chat_id), text=text[:self.max_message_len],
                         reply_markup={"inline_keyboard": keyboard})
        return str(sent.get("message_id"))

    def settle_approval(self, conversation: Conversation, request_id: str, text: str) -> None:
        self.call("editMessageText", chat_id=_chat_id(conversation.chat_id), message_id=int(request_id), text=text)

    def answer_interaction(self, msg: Inbound, text: str, final: bool) -> bool:
        press = msg.interaction
        # The presser sees the answer as an alert (a refusal is for them alone).
        self.call("answerCallbackQuery", callback_query_id=press["callback_query_id"], text=text[:200],
                  show_alert=not final)
        if final:  # the request becomes its outcome, without buttons
            self.call("editMessageText", chat_id=press["chat_id"], message_id=press["message_id"], text=text)
        return True

    def test_target(self, override: str = "") -> Conversation:
        chat = override or str(self.settings.get("default_chat_id") or "")
        if not chat:
            raise ChannelError("no test target: set default_chat_id or pass chat_id")
        return Conversation(self.name, chat, direct=True)


def _chat_id(value: str) -> int | str:
    """Numeric chat ids go out as integers, @channelusername as a string (Bot API)."""
    return int(value) if value.lstrip("-").isdigit() else value


ADAPTER = TelegramAdapter
