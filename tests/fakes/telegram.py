"""A fake Telegram Bot API (https://core.telegram.org/bots/api): getMe, getUpdates
(long poll with offset/timeout; earlier updates are confirmed and dropped; only the
`allowed_updates` kinds are delivered), sendMessage (with an inline keyboard in
`reply_markup`), sendChatAction, setMessageReaction (only the emoji of Telegram's
reaction list: REACTION_INVALID otherwise), answerCallbackQuery, editMessageText.
Users "write" with `user_says()`, change a message with `user_edits()` and press an
inline button with `user_presses()`.

As on Telegram: an `@username` in the text comes with a `mention` entity (offsets in UTF-16
code units); a reply carries the replied-to message as `reply_to_message`; in a forum
supergroup a message of a topic carries `message_thread_id` and `is_topic_message`, and
`sendMessage` with `message_thread_id` posts into that topic (400 "message thread not
found" for a topic the chat does not have).

Files: getFile and `GET /file/bot<token>/<file_path>`, sendPhoto and sendDocument
(multipart/form-data); users send files with `user_sends_file()`.

sendMessage with `parse_mode: HTML` parses the text as the Bot API does ("Formatting
options", HTML style): only its tags, `<`, `>` and `&` escaped outside them, only the
named entities &lt; &gt; &amp; &quot;; anything else is 400 "can't parse entities". The
message keeps the text without tags and the entities (offsets in UTF-16 units), and text
longer than 4096 UTF-16 units after parsing is 400 "message is too long"."""

from __future__ import annotations

import threading
import uuid
import time
from html.parser import HTMLParser
from typing import Any

from flask import Flask, jsonify, redirect, request

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


ENTITY_TAGS = {"b": "bold", "strong": "bold", "i": "italic", "em": "italic", "u": "underline",
               "ins": "underline", "s": "strikethrough", "strike": "strikethrough", "del": "strikethrough",
               "code": "code", "pre": "pre", "a": "text_link", "blockquote": "blockquote",
               "tg-spoiler": "spoiler", "span": "spoiler"}
NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
MAX_TEXT = 4096


class CannotParse(Exception):
    pass


def units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class BotHtml(HTMLParser):
    """parse_mode HTML: the message text and its entities, or CannotParse."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.text = ""
        self.open: list[tuple[str, dict[str, Any], int]] = []
        self.entities: list[dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in ENTITY_TAGS:
            raise CannotParse(f'unsupported start tag "{tag}"')
        self.open.append((tag, dict(attrs), units(self.text)))

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open[-1][0] != tag:
            raise CannotParse(f'unmatched end tag "{tag}"')
        tag, attrs, start = self.open.pop()
        entity = {"type": ENTITY_TAGS[tag], "offset": start, "length": units(self.text) - start}
        if tag == "a":
            entity["url"] = attrs.get("href") or ""
        language = (attrs.get("class") or "").removeprefix("language-")
        if tag == "code" and self.open and self.open[-1][0] == "pre" and language:
            self.open[-1][1]["language"] = language  # <pre><code class="language-x">: one pre entity
            return
        if tag == "pre" and attrs.get("language"):
            entity["language"] = attrs["language"]
        self.entities.append(entity)

    def handle_data(self, data: str) -> None:
        if any(c in data for c in "<>&"):
            raise CannotParse("unescaped <, > or & outside a tag")
        self.text += data

    def handle_entityref(self, name: str) -> None:
        if name not in NAMED:
            raise CannotParse(f'unsupported entity "&{name};"')
        self.text += NAMED[name]

    def handle_charref(self, name: str) -> None:
        self.text += chr(int(name[1:], 16) if name[:1] in "xX" else int(name))

    def parse(self, html: str) -> tuple[str, list[dict[str, Any]]]:
        self.feed(html)
        self.close()
        if self.open:
            raise CannotParse(f'unclosed start tag "{self.open[-1][0]}"')
        return self.text, sorted(self.entities, key=lambda e: (e["offset"], -e["length"]))


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
        self.messages: dict[int, dict[str, Any]] = {}   # message_id -> message (users' and the bot's)
        self.topics: dict[int, set[int]] = {}           # forum chat id -> its topics' message_thread_id
        self.broken = False  # getUpdates answers 502 HTML while set  # Retry-After seconds for the next sendMessage calls
        self.cond = threading.Condition()
        self.files: dict[str, tuple[str, bytes]] = {}  # file_id -> (file_path, bytes)
        self.downloads: list[str] = []  # file_paths fetched
        self.redirect_files = ""  # a URL file downloads are redirected to, while set
        self.uploaded: list[dict[str, Any]] = []  # sendPhoto / sendDocument calls
        app = Flask("fake-telegram")

        @app.get("/file/bot<token>/<path:file_path>")
        def download(token: str, file_path: str):
            if token != self.token:
                return jsonify({"ok": False, "error_code": 401, "description": "Unauthorized"}), 401
            self.downloads.append(file_path)
            if self.redirect_files:
                return redirect(self.redirect_files, 302)
            data = next((d for path, d in self.files.values() if path == file_path), None)
            if data is None:
                return jsonify({"ok": False, "error_code": 404, "description": "Not Found"}), 404
            return data, 200, {"Content-Type": "application/octet-stream"}

        def params() -> dict[str, Any]:
            data = dict(request.args)
            data.update(request.form.to_dict())
            data.update(request.get_json(silent=True) or {})
            return data

        @app.route("/bot<token>/<method>", methods=["GET", "POST"])
        def api(token: str, method: str):
            if token != self.token:
                return jsonify({"ok": False, "error_code": 401, "description": "Unauthorized"}), 401
            handler = {"getMe": self._get_me, "getUpdates": self._get_updates,
                       "sendMessage": self._send_message, "sendChatAction": self._chat_action,
                       "setMessageReaction": self._reaction, "answerCallbackQuery": self._answer_callback,
                       "editMessageText": self._edit_text,
                       "getFile": self._get_file, "sendPhoto": self._send_upload,
                       "sendDocument": self._send_upload}.get(method)
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
        chat_id, topic = int(p["chat_id"]), p.get("message_thread_id")
        if topic is not None and int(topic) not in self.topics.get(chat_id, set()):
            return jsonify({"ok": False, "error_code": 400, "description": "Bad Request: message thread not found"}), 400
        text, entities = p["text"], []
        if p.get("parse_mode") == "HTML":
            try:
                text, entities = BotHtml().parse(p["text"])
            except CannotParse as exc:
                return jsonify({"ok": False, "error_code": 400,
                                "description": f"Bad Request: can't parse entities: {exc}"}), 400
        elif p.get("parse_mode"):
            return jsonify({"ok": False, "error_code": 400, "description": "Bad Request: unsupported parse_mode"}), 400
        if units(text) > MAX_TEXT:
            return jsonify({"ok": False, "error_code": 400, "description": "Bad Request: message is too long"}), 400
        self.next_message += 1
        message = {"message_id": self.next_message, "date": int(time.time()),
                   "from": {"id": 999, "is_bot": True, "first_name": "Agent", "username": "agentd_bot"},
                   "chat": {"id": chat_id}, "text": text}
        if entities:
            message["entities"] = entities
        if topic is not None:
            message.update(message_thread_id=int(topic), is_topic_message=True)
        self.messages[message["message_id"]] = message
        if p.get("reply_to_message_id"):
            message = {**message, "reply_to_message_id": p["reply_to_message_id"]}
        if p.get("reply_markup"):
            message = {**message, "reply_markup": p["reply_markup"]}
        self.sent.append({**message, "at": time.time(), "raw": p["text"], "parse_mode": p.get("parse_mode")})
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
                                                   "text": message["text"],
                                                   **{k: message[k] for k in ("message_thread_id",
                                                                              "is_topic_message") if k in message}}}})
        return query_id

    def _get_file(self, p):
        known = self.files.get(str(p.get("file_id") or ""))
        if known is None:
            return jsonify({"ok": False, "error_code": 400, "description": "Bad Request: invalid file_id"}), 400
        path, data = known
        return jsonify({"ok": True, "result": {"file_id": p["file_id"], "file_unique_id": p["file_id"][-6:],
                                               "file_size": len(data), "file_path": path}})

    def _send_upload(self, p):
        field = "photo" if request.path.endswith("/sendPhoto") else "document"
        sent = request.files.get(field)
        if "chat_id" not in p or sent is None:
            return jsonify({"ok": False, "error_code": 400,
                            "description": f"Bad Request: there is no {field} in the request"}), 400
        self.next_message += 1
        data = sent.read()
        self.uploaded.append({"method": request.path.rsplit("/", 1)[1], "chat_id": int(p["chat_id"]),
                              "filename": sent.filename, "content_type": sent.mimetype, "data": data,
                              "message_id": self.next_message})
        return jsonify({"ok": True, "result": {"message_id": self.next_message, "date": int(time.time()),
                                               "chat": {"id": int(p["chat_id"])}}})

    def user_sends_file(self, user_id: int, data: bytes, kind: str = "document", filename: str = "",
                        mime_type: str = "", caption: str = "", file_size: int | None = None) -> int:
        """A user sends a photo or document (`kind`); the bytes are served through getFile."""
        file_id = f"AgAC{uuid.uuid4().hex}"
        self.files[file_id] = (f"{'photos' if kind == 'photo' else 'documents'}/file_{len(self.files)}"
                               f"{'.jpg' if kind == 'photo' else ''}", data)
        size = len(data) if file_size is None else file_size
        if kind == "photo":
            item: Any = [{"file_id": file_id + "s", "file_unique_id": "s", "width": 90, "height": 90,
                          "file_size": 10},
                         {"file_id": file_id, "file_unique_id": file_id[-6:], "width": 800, "height": 800,
                          "file_size": size}]
        else:
            item = {"file_id": file_id, "file_unique_id": file_id[-6:], "file_name": filename,
                    "mime_type": mime_type, "file_size": size}
        with self.cond:
            with _ids_lock:
                _last_update_id[0] += 1
                self.next_update = _last_update_id[0]
            self.next_message += 1
            message = {"message_id": self.next_message, "date": int(time.time()),
                       "from": {"id": user_id, "is_bot": False, "first_name": str(user_id)},
                       "chat": {"id": user_id, "type": "private"}, kind: item}
            if caption:
                message["caption"] = caption
            self.updates.append({"update_id": self.next_update, "message": message})
            self.cond.notify_all()
            return self.next_message

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
