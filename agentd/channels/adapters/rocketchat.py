"""Rocket.Chat REST API (`X-Auth-Token` + `X-User-Id`): polls the history of the
channels the bot has joined (`channels.list.joined` + `channels.history`) and of its
direct rooms (`im.list` + `im.history`) from a persisted timestamp per room, replies
with `chat.postMessage` (in the thread when the message was in one). Channel messages
are answered when they mention the bot (all of them under `overrides.group_policy` respond /
shared); direct messages always. Reactions: `chat.react`
(`:name:`, `shouldReact` false takes one back).

Files: a message's `attachments` (`title`, `title_link` `/file-upload/{id}/{name}`, the
image's type and size) are fetched from the server (`server_url`'s host only) with the same
`X-User-Id` / `X-Auth-Token`. Files go out with `rooms.media/{rid}` (multipart `file`) and
`rooms.mediaConfirm/{rid}/{fileId}` (in the thread when the message was in one), which
replaced the deprecated `rooms.upload`; an image is shown as one."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any
from urllib.parse import urljoin

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.polling import PollingAdapter
from agentd.channels.conversation import reply_thread, without_mention
from agentd.channels.lifecycle import emoji_name


class RocketChatAdapter(PollingAdapter):
    max_message_len = 5000

    def prepare(self) -> None:
        self.base = str(self.settings.get("server_url") or "").rstrip("/")
        user_id = str(self.settings.get("user_id") or "")
        if not self.base or not user_id:
            raise ChannelError("server_url and user_id must be set")
        self.auth = {"X-Auth-Token": self.env("token_env"), "X-User-Id": user_id}
        self.http.session.headers.update(self.auth)
        self.poll_interval = float(self.settings.get("poll_interval_secs") or 2)
        self.me = ""

    def api(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        data = self.http.json(method, f"{self.base}/api/v1/{path}", **kwargs)
        if not data.get("success", False):
            raise ChannelError(f"{path}: {data.get('error') or data}")
        return data

    def poll_once(self) -> None:
        if not self.me:
            self.me = str(self.api("GET", "me", retries=0)["username"])
        rooms = [("channels", r["_id"], "#" + r["name"]) for r in self.api(
            "GET", "channels.list.joined", retries=0).get("channels", [])]
        rooms += [("im", r["_id"], r["_id"]) for r in self.api("GET", "im.list", retries=0).get("ims", [])]
        cursors = dict(self.state.get("rooms") or {})
        for kind, room_id, chat in rooms:
            oldest = cursors.get(room_id)
            params = {"roomId": room_id, "count": 100, **({"oldest": oldest} if oldest else {})}
            messages = sorted(self.api("GET", f"{kind}.history", params=params, retries=0).get("messages", []),
                              key=lambda m: m["ts"])
            if oldest is None:  # a room seen for the first time: its history is not answered
                cursors[room_id] = messages[-1]["ts"] if messages else _now(lag=1.0)
                continue
            for message in (m for m in messages if m["ts"] > oldest):
                cursors[room_id] = message["ts"]
                self.save_cursor(rooms=cursors)
                self._handle(message, chat, direct=kind == "im")
        self.save_cursor(rooms=cursors)

    def _handle(self, message: dict[str, Any], chat: str, direct: bool) -> None:
        user = message.get("u") or {}
        text = str(message.get("msg") or "")
        files = self._files(message)
        if user.get("username") == self.me or message.get("t") or not (text or files):
            return  # our own messages and system messages (joins, topic changes...)
        mention = f"@{self.me}"
        mentioned = any(m.get("username") == self.me for m in message.get("mentions") or []) or mention in text
        text = without_mention(text, rf"(?<!\S){re.escape(mention)}(?!\S)")
        thread = reply_thread(self.settings, str(message.get("tmid") or ""), str(message["_id"]), direct,
                              default=True)
        # A thread (tmid) is a conversation of its own.
        conversation = Conversation(self.name, chat, str(user.get("_id")), direct=direct,
                                    meta={"tmid": thread, "room_id": message.get("rid")}, thread_id=thread)
        self.ctx.deliver(Inbound(conversation, sender_id=str(user.get("username")), text=text,
                                 message_id=str(message["_id"]), sender_name=str(user.get("name") or ""),
                                 sender_aliases=(str(user.get("_id")),), mentioned=mentioned,
                                 addressed=direct or mentioned, attachments=files))

    def _files(self, message: dict[str, Any]) -> list[Attachment]:
        declared = {str(f.get("name")): f for f in message.get("files") or [] if isinstance(f, dict)}
        found = []
        for item in message.get("attachments") or []:
            if not isinstance(item, dict) or not item.get("title_link"):
                continue  # quotes and link previews carry no file
            name = str(item.get("title") or "file")
            known = declared.get(name, {})
            kind = item.get("image_type") or item.get("audio_type") or item.get("video_type") or known.get("type")
            size = item.get("image_size") or item.get("audio_size") or item.get("video_size") or item.get("size") \
                or known.get("size") or 0
            found.append(Attachment(name, str(kind or ""), int(size) if str(size).isdigit() else 0,
                                    urljoin(self.base + "/", str(item["title_link"])), headers=dict(self.auth)))
        return found

    def file_hosts(self) -> set[str]:
        return {host_of(str(self.settings.get("server_url") or ""))}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        room = self._room_id(str(conversation.meta.get("room_id") or conversation.chat_id))
        uploaded = self.api("POST", f"rooms.media/{room}", files={"file": (filename, data, content_type)})
        body = {"msg": ""}
        if conversation.meta.get("tmid"):
            body["tmid"] = conversation.meta["tmid"]
        confirmed = self.api("POST", f"rooms.mediaConfirm/{room}/{uploaded['file']['_id']}", json=body)
        return str(confirmed.get("message", {}).get("_id", ""))

    def _room_id(self, target: str) -> str:
        """rooms.media takes a room id: a `#channel` or `@user` target is looked up first."""
        if target.startswith("#"):
            room = self.api("GET", "rooms.info", params={"roomName": target[1:]}).get("room") or {}
        elif target.startswith("@"):
            room = self.api("POST", "im.create", json={"username": target[1:]}).get("room") or {}
        else:
            return target
        found = str(room.get("rid") or room.get("_id") or "")
        if not found:
            raise ChannelError(f"no room {target}")
        return found

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        ids = []
        target = conversation.meta.get("room_id") or conversation.chat_id
        for part in self.reply_texts(text):
            body = {"roomId" if not target.startswith(("#", "@")) else "channel": target, "text": part}
            if conversation.meta.get("tmid"):
                body["tmid"] = conversation.meta["tmid"]
            ids.append(str(self.api("POST", "chat.postMessage", json=body).get("message", {}).get("_id", "")))
        return ",".join(ids)

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.api("POST", "chat.react", retries=0,
                 json={"messageId": message_id, "emoji": f":{emoji_name(emoji)}:", "shouldReact": True})

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.api("POST", "chat.react", retries=0,
                 json={"messageId": message_id, "emoji": f":{emoji_name(emoji)}:", "shouldReact": False})

    def test_target(self, override: str = "") -> Conversation:
        target = override or next(iter(self.settings.get("allowed_channels") or []), "")
        if not target:
            raise ChannelError("no test target: set allowed_channels or pass chat_id (#channel, @user or a room id)")
        return Conversation(self.name, target)


def _now(lag: float = 0.0) -> str:
    return (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=lag)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


ADAPTER = RocketChatAdapter
