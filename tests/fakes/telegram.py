"""A fake Telegram Bot API (https://core.telegram.org/bots/api): getMe, getUpdates
(long poll with offset/timeout; earlier updates are confirmed and dropped),
sendMessage, sendChatAction. Users "write" with `user_says()`.

As on Telegram: an `@username` in the text comes with a `mention` entity (offsets in UTF-16
code units); a reply carries the replied-to message as `reply_to_message`; in a forum
supergroup a message of a topic carries `message_thread_id` and `is_topic_message`, and
`sendMessage` with `message_thread_id` posts into that topic (400 "message thread not
found" for a topic the chat does not have)."""

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


class FakeTelegram(FakeServer):
    def __init__(self, token: str) -> None:
        self.token = token
        self.updates: list[dict[str, Any]] = []
        self.sent: list[dict[str, Any]] = []
        self.actions: list[dict[str, Any]] = []
        self.polls: list[dict[str, Any]] = []
        self.next_update = 100
        self.next_message = 1
        self.throttle: list[int] = []
        self.messages: dict[int, dict[str, Any]] = {}   # message_id -> message (users' and the bot's)
        self.topics: dict[int, set[int]] = {}           # forum chat id -> its topics' message_thread_id
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
                       "sendMessage": self._send_message, "sendChatAction": self._chat_action}.get(method)
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
        deadline = time.monotonic() + timeout
        with self.cond:
            self.updates = [u for u in self.updates if u["update_id"] >= offset]  # confirmed
            while not self.updates and time.monotonic() < deadline:
                self.cond.wait(deadline - time.monotonic())
            result = list(self.updates)
        return jsonify({"ok": True, "result": result})

    def _send_message(self, p):
        if self.throttle:
            wait = self.throttle.pop(0)
            response = jsonify({"ok": False, "error_code": 429, "parameters": {"retry_after": wait},
                                "description": f"Too Many Requests: retry after {wait}"})
            return response, 429  # Telegram says when in parameters.retry_after
        if "chat_id" not in p or not p.get("text"):
            return jsonify({"ok": False, "error_code": 400, "description": "Bad Request: message text is empty"}), 400
        chat_id, topic = int(p["chat_id"]), p.get("message_thread_id")
        if topic is not None and int(topic) not in self.topics.get(chat_id, set()):
            return jsonify({"ok": False, "error_code": 400, "description": "Bad Request: message thread not found"}), 400
        self.next_message += 1
        message = {"message_id": self.next_message, "date": int(time.time()),
                   "from": {"id": 999, "is_bot": True, "first_name": "Agent", "username": "agentd_bot"},
                   "chat": {"id": chat_id}, "text": p["text"]}
        if topic is not None:
            message.update(message_thread_id=int(topic), is_topic_message=True)
        self.messages[message["message_id"]] = message
        if p.get("reply_to_message_id"):
            message = {**message, "reply_to_message_id": p["reply_to_message_id"]}
        self.sent.append({**message, "at": time.time()})
        return jsonify({"ok": True, "result": message})

    def _chat_action(self, p):
        self.actions.append(dict(p))
        return jsonify({"ok": True, "result": True})

    def user_says(self, user_id: int, text: str, username: str = "", chat_id: int | None = None,
                  chat_type: str = "private", reply_to: int = 0, topic: int = 0) -> int:
        """A user sends the bot a message (replying to message `reply_to`, in forum topic
        `topic`); returns its message_id."""
        with self.cond:
            with _ids_lock:
                _last_update_id[0] += 1
                self.next_update = _last_update_id[0]
            self.next_message += 1
            sender = {"id": user_id, "is_bot": False, "first_name": username or str(user_id)}
            if username:
                sender["username"] = username
            chat = {"id": chat_id or user_id, "type": chat_type}
            message: dict[str, Any] = {"message_id": self.next_message, "from": sender, "chat": chat,
                                       "date": int(time.time()), "text": text}
            entities, offset = [], 0
            for word in text.split(" "):
                if word.startswith("@") and len(word) > 1:
                    entities.append({"type": "mention", "offset": offset,
                                     "length": len(word.encode("utf-16-le")) // 2})
                offset += len((word + " ").encode("utf-16-le")) // 2
            if entities:
                message["entities"] = entities
            if topic:
                chat["is_forum"] = True
                self.topics.setdefault(chat["id"], set()).add(topic)
                message.update(message_thread_id=topic, is_topic_message=True)
            if reply_to:
                message["reply_to_message"] = self.messages[reply_to]
            self.messages[message["message_id"]] = message
            self.updates.append({"update_id": self.next_update, "message": message})
            self.cond.notify_all()
            return self.next_message

    def replies_to(self, chat_id: int) -> list[str]:
        return [m["text"] for m in self.sent if m["chat"]["id"] == chat_id]
