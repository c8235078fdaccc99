"""Telegram Bot API: long-polling `getUpdates` (offset persisted), replies with
`sendMessage`, typing with `sendChatAction`, reactions with `setMessageReaction`.
`api_url` overrides api.telegram.org.

A forum topic (`message_thread_id` of a topic message) is a conversation of its own, answered
in the topic and routed to the agent `thread_routes` names for it. The bot counts as
mentioned for an `@username` / text mention of it or a reply to one of its messages.
In groups the answer replies to the message unless `overrides.threading` is false.

Files: a message's `photo` (the largest size), `document`, `audio` and `voice` are fetched
with `getFile` and `GET {api}/file/bot<token>/<file_path>` (the caption is the text); files
go out with `sendPhoto` (PNG, JPEG, WebP) or `sendDocument`, multipart.

Approvals carry an inline keyboard; a press arrives as a `callback_query`, answered with
`answerCallbackQuery` and, once decided, `editMessageText` (which drops the buttons). An
`edited_message` is answered as a new message."""

from __future__ import annotations

from typing import Any

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.polling import PollingAdapter
from agentd.channels.conversation import threaded


class TelegramAdapter(PollingAdapter):
    max_message_len = 4096  # after entity parsing, in UTF-16 units: the HTML is at least as long
    limit_unit = "utf16"
    text_format = "telegram_html"

    def prepare(self) -> None:
        self.token = self.env("bot_token_env")
        base = (self.settings.get("api_url") or "https://api.telegram.org").rstrip("/")
        self.base = f"{base}/bot{self.token}"
        self.files_base = f"{base}/file/bot{self.token}"
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
        topic = str(message.get("message_thread_id") or "") if message.get("is_topic_message") else ""
        conversation = Conversation(self.name, str(chat.get("id")), user_id, direct=chat.get("type") == "private",
                                    meta={"message_thread_id": int(topic)} if topic else {}, thread_id=topic)
        aliases = tuple(a for a in (sender.get("username"), f"@{sender.get('username')}") if sender.get("username"))
        self.ctx.deliver(Inbound(conversation, sender_id=user_id, text=f"/{verb} {approval_id}",
                                 message_id=str(query.get("id")), sender_aliases=aliases,
                                 sender_name=sender.get("first_name") or sender.get("username") or user_id,
                                 interaction={"callback_query_id": query.get("id"), "chat_id": chat.get("id"),
                                              "message_id": message.get("message_id")}))

    def _handle(self, message: dict[str, Any], edited: bool = False) -> None:
        text, chat, sender = message.get("text"), message.get("chat") or {}, message.get("from") or {}
        files = self._attachments(message)
        if files:
            text = str(message.get("caption") or text or "")
        if not isinstance(text, str) or not sender or sender.get("is_bot"):
            return
        direct = chat.get("type") == "private"
        user_id = str(sender.get("id"))
        topic = str(message.get("message_thread_id") or "") if message.get("is_topic_message") else ""
        mentioned, text = self._mention(message, text)
        meta: dict[str, Any] = {"reply_to": message.get("message_id")}
        if topic:
            meta["message_thread_id"] = int(topic)
        if not direct and not threaded(self.settings, default=True):
            meta["reply_to"] = None
        conversation = Conversation(self.name, str(chat.get("id")), user_id, direct=direct, meta=meta,
                                    thread_id=topic)
        aliases = tuple(a for a in (sender.get("username"), f"@{sender.get('username')}") if sender.get("username"))
        self.ctx.deliver(Inbound(conversation, sender_id=user_id, text=text,
                                 message_id=str(message.get("message_id")),
                                 sender_name=sender.get("first_name") or sender.get("username") or user_id,
                                 sender_aliases=aliases, mentioned=mentioned, attachments=files, edited=edited,
                                 agent=str((self.settings.get("thread_routes") or {}).get(topic) or "")))

    def _mention(self, message: dict[str, Any], text: str) -> tuple[bool, str]:
        """Whether the message mentions or replies to the bot; the text without the @mention."""
        me = getattr(self, "me", None) or {}
        bot_id, username = me.get("id"), str(me.get("username") or "").lower()
        mentioned = False
        for entity in message.get("entities") or []:
            start, length = int(entity.get("offset") or 0), int(entity.get("length") or 0)
            # Offsets count UTF-16 code units.
            units = text.encode("utf-16-le")
            word = units[2 * start:2 * (start + length)].decode("utf-16-le", "replace")
            if (entity.get("type") == "mention" and username and word.lower() == "@" + username) or \
                    (entity.get("type") == "text_mention" and (entity.get("user") or {}).get("id") == bot_id):
                mentioned = True
        replied = ((message.get("reply_to_message") or {}).get("from") or {}).get("id")
        mentioned = mentioned or (bot_id is not None and replied == bot_id)
        if username:
            text = " ".join(w for w in text.split(" ") if w.lower() != "@" + username).strip() or text
        return mentioned, text

    def _attachments(self, message: dict[str, Any]) -> list[Attachment]:
        found = []
        photos = [p for p in message.get("photo") or [] if isinstance(p, dict) and p.get("file_id")]
        if photos:  # the sizes of one photo, smallest first
            best = photos[-1]
            found.append((best, f"photo-{best.get('file_unique_id') or message.get('message_id')}.jpg", "image/jpeg"))
        for key in ("document", "audio", "voice"):
            item = message.get(key)
            if isinstance(item, dict) and item.get("file_id"):
                found.append((item, str(item.get("file_name") or f"{key}-{message.get('message_id')}"),
                              str(item.get("mime_type") or "")))
        return [Attachment(name, mime, int(item.get("file_size") or 0),
                           locate=lambda file_id=str(item["file_id"]): self._file_url(file_id))
                for item, name, mime in found]

    def _file_url(self, file_id: str) -> str:
        path = str(self.call("getFile", file_id=file_id).get("file_path") or "")
        if not path:
            raise ChannelError("getFile: no file_path (the file may be over the Bot API's 20 MB)")
        return f"{self.files_base}/{path.lstrip('/')}"

    def file_hosts(self) -> set[str]:
        if not hasattr(self, "files_base"):
            self.prepare()
        return {host_of(self.files_base)}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        method, field = ("sendPhoto", "photo") if content_type in ("image/png", "image/jpeg", "image/webp") \
            else ("sendDocument", "document")
        fields = {"chat_id": conversation.chat_id}
        if conversation.meta.get("message_thread_id"):
            fields["message_thread_id"] = conversation.meta["message_thread_id"]
        answer = self.http.json("POST", f"{self.base}/{method}", data=fields,
                                files={field: (filename, data, content_type)})
        if not isinstance(answer, dict) or not answer.get("ok"):
            raise ChannelError(f"{method}: {answer.get('description') if isinstance(answer, dict) else answer}")
        return str((answer.get("result") or {}).get("message_id") or "")

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
            if conversation.meta.get("message_thread_id"):
                params["message_thread_id"] = conversation.meta["message_thread_id"]
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
        params: dict[str, Any] = {"chat_id": _chat_id(conversation.chat_id), "text": text[:self.max_message_len],
                                  "reply_markup": {"inline_keyboard": keyboard}}
        if conversation.meta.get("message_thread_id"):
            params["message_thread_id"] = conversation.meta["message_thread_id"]
        sent = self.call("sendMessage", **params)
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
