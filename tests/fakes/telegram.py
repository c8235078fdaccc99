"""A fake Telegram Bot API (https://core.telegram.org/bots/api): getMe, getUpdates
(long poll with offset/timeout; earlier updates are confirmed and dropped; only the
`allowed_updates` kinds are delivered), sendMessage (with an inline keyboard in
`reply_markup`), sendChatAction, setMessageReaction (only the emoji of Telegram's
reaction list: REACTION_INVALID otherwise), answerCallbackQuery, editMessageText.
Users "write" with `user_says()`, change a message with `user_edits()` and press an
inline button with `user_presses()`."""

from __future__ import annotations

import threading
import time
from typing import Any

from flask import Flask, jsonify, request

from fakes.http import FakeServer


# Update ids of one bot only ever grow, whatever fake answers for it: a daemon shared by
# several tests keeps the bot's getUpdates offset (the adapter persists it, as it should),
# so a fake that started again at the same id would have its first updates dropped as
# already confirmed (a test then waits 30 s for a reply that never comes).
_last_update_id = [100]
_ids_lock = threading.Lock()
# The emoji a bot may react with (ReactionTypeEmoji in the Bot API).
REACTION_EMOJI = set("👍 👎 ❤ 🔥 🥰 👏 😁 🤔 🤯 😱 🤬 😢 🎉 🤩 🤮 💩 🙏 👌 🕊 🤡 🥱 🥴 😍 🐳 ❤‍🔥 🌚 🌭 💯 🤣 ⚡ 🍌 🏆 💔 "
                     "🤨 😐 🍓 🍾 💋 🖕 😈 😴 😭 🤓 👻 👨‍💻 👀 🎃 🙈 😇 😨 🤝 ✍ 🤗 🫡 🎅 🎄 ☃ 💅 🤪 🗿 🆒 💘 🙉 "
                     "🦄 😘 💊 🙊 😎 👾 🤷‍♂ 🤷 🤷‍♀ 😡".split())


class FakeTelegram(FakeServer):
    def __init__(self, token: str) -> None:
        self.token = token
        self.updates: list[dict[str, Any]] = []
        self.sent: list[dict[str, Any]] = []
        self.actions: list[dict[str, Any]] = []
        self.reactions: list[dict[str, Any]] = []     # setMessageReaction calls
        self.answers: list[dict[str, Any]] = []       # answerCallbackQuery calls
        self.edits: list[dict[str, Any]] = []         # editMessageText calls
        self.allowed = ["message", "edited_message", "channel_post", "edited_channel_post"]
        self.polls: list[dict[str, Any]] = []
        self.next_update = 100
        self.next_message = 1
        self.throttle: list[int] = []
        self.broken = False  # getUpdates answers 502 HTML while set  # Retry-After seconds for the next sendMessage calls
        self.cond = threading.Condition()
        app = Flask("fake-telegram")

        def params() -> dict[str, Any]:
            data = dict(request.args)
            data.update(request.get_json(silent=True) or {})
            return data

        @app.route("/bot<token>/<method>", methods=["GET", "POST"])
        def api(token: str, method: str):
            if token != self.token:
                return jsonify({"ok": False, "error_code": 401, "description": "Unauthorized"}), 401
            handler = {"getMe": self._get_me, "getUpdates": self._get_updates,
                       "sendMessage": self._send_message, "sendChatAction": self._chat_action,
                       "setMessageReaction": self._reaction, "answerCallbackQuery": self._answer_callback,
                       "editMessageText": self._edit_text}.get(method)
            if handler is None:
                return jsonify({"ok": False, "error_code": 404, "description": "Not Found"}), 404
            return handler(params())

        super().__init__(app)

    def _get_me(self, _p):
        return jsonify({"ok": True, "result": {"id": 999, "is_bot": True, "first_name": "Agent",
                                               "username": "agentd_bot"}})

    def _get_updates(self, p):
        if self.broken:
            return "<html>502 Bad Gateway</html>", 502
        offset, timeout = int(p.get("offset") or 0), float(p.get("timeout") or 0)
        self.polls.append({"offset": offset, "timeout": timeout, "at": time.time()})
        if p.get("allowed_updates") is not None:  # remembered until changed, as Telegram does
            self.allowed = list(p["allowed_updates"])
        deadline = time.monotonic() + timeout
        with self.cond:
            self.updates = [u for u in self.updates if u["update_id"] >= offset]  # confirmed
            while not self.updates and time.monotonic() < deadline:
                self.cond.wait(deadline - time.monotonic())
            result = [u for u in self.updates if any(k in self.allowed for k in u if k != "update_id")]
        return jsonify({"ok": True, "result": result})

    def _send_message(self, p):
        if self.throttle:
            wait = self.throttle.pop(0)
            response = jsonify({"ok": False, "error_code": 429, "parameters": {"retry_after": wait},
                                "description": f"Too Many Requests: retry after {wait}"})
            return response, 429  # Telegram says when in parameters.retry_after
        if "chat_id" not in p or not p.get("text"):
            return jsonify({"ok": False, "error_code": 400, "description": "Bad Request: message text is empty"}), 400
        self.next_message += 1
        message = {"message_id": self.next_message, "date": int(time.time()),
                   "chat": {"id": int(p["chat_id"])}, "text": p["text"]}
        if p.get("reply_to_message_id"):
            message["reply_to_message_id"] = p["reply_to_message_id"]
        if p.get("reply_markup"):
            message["reply_markup"] = p["reply_markup"]
        self.sent.append({**message, "at": time.time()})
        return jsonify({"ok": True, "result": message})

    def _reaction(self, p):
        reaction = p.get("reaction") or []
        if len(reaction) > 1 or any(r.get("type") != "emoji" or r.get("emoji") not in REACTION_EMOJI
                                    for r in reaction):
            return jsonify({"ok": False, "error_code": 400, "description": "Bad Request: REACTION_INVALID"}), 400
        self.reactions.append({"chat_id": p.get("chat_id"), "message_id": p.get("message_id"),
                               "emoji": [r["emoji"] for r in reaction]})
        return jsonify({"ok": True, "result": True})

    def _answer_callback(self, p):
        if not p.get("callback_query_id"):
            return jsonify({"ok": False, "error_code": 400, "description": "Bad Request: query is too old"}), 400
        self.answers.append(dict(p))
        return jsonify({"ok": True, "result": True})

    def _edit_text(self, p):
        message = next((m for m in self.sent if m["chat"]["id"] == int(p.get("chat_id") or 0)
                        and m["message_id"] == p.get("message_id")), None)
        if message is None:
            return jsonify({"ok": False, "error_code": 400,
                            "description": "Bad Request: message to edit not found"}), 400
        message["text"] = p["text"]
        if p.get("reply_markup"):
            message["reply_markup"] = p["reply_markup"]
        else:
            message.pop("reply_markup", None)  # no markup given: the inline keyboard is removed
        self.edits.append(dict(p))
        return jsonify({"ok": True, "result": {k: v for k, v in message.items() if k != "at"}})

    def _push(self, update: dict[str, Any]) -> None:
        with self.cond:
            with _ids_lock:
                _last_update_id[0] += 1
                self.next_update = _last_update_id[0]
            self.updates.append({"update_id": self.next_update, **update})
            self.cond.notify_all()

    def user_edits(self, user_id: int, message_id: int, text: str, chat_id: int | None = None,
                   chat_type: str = "private") -> None:
        """The user changes the text of their message `message_id` (an `edited_message`)."""
        self._push({"edited_message": {"message_id": message_id, "from": {"id": user_id, "is_bot": False,
                                                                          "first_name": str(user_id)},
                                       "chat": {"id": chat_id or user_id, "type": chat_type},
                                       "date": int(time.time()) - 5, "edit_date": int(time.time()),
                                       "text": text}})

    def user_presses(self, user_id: int, message: dict[str, Any], data: str, username: str = "") -> str:
        """The user presses the inline button with callback_data `data` under the bot's
        `message` (one of `sent`); returns the callback query's id."""
        query_id = f"cq{user_id}{len(self.answers)}{time.monotonic_ns()}"
        sender = {"id": user_id, "is_bot": False, "first_name": username or str(user_id),
                  **({"username": username} if username else {})}
        chat = message["chat"]
        self._push({"callback_query": {"id": query_id, "from": sender, "chat_instance": "ci1", "data": data,
                                       "message": {"message_id": message["message_id"], "date": message["date"],
                                                   "chat": {"id": chat["id"], "type": "private"
                                                            if chat["id"] > 0 else "group"},
                                                   "text": message["text"]}}})
        return query_id

    def _chat_action(self, p):
        self.actions.append(dict(p))
        return jsonify({"ok": True, "result": True})

    def user_says(self, user_id: int, text: str, username: str = "", chat_id: int | None = None,
                  chat_type: str = "private") -> int:
        """A user sends the bot a message; returns its message_id."""
        with self.cond:
            with _ids_lock:
                _last_update_id[0] += 1
                self.next_update = _last_update_id[0]
            self.next_message += 1
            sender = {"id": user_id, "is_bot": False, "first_name": username or str(user_id)}
            if username:
                sender["username"] = username
            chat = {"id": chat_id or user_id, "type": chat_type}
            self.updates.append({"update_id": self.next_update, "message": {
                "message_id": self.next_message, "from": sender, "chat": chat,
                "date": int(time.time()), "text": text}})
            self.cond.notify_all()
            return self.next_message

    def replies_to(self, chat_id: int) -> list[str]:
        return [m["text"] for m in self.sent if m["chat"]["id"] == chat_id]
