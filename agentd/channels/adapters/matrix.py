"""Matrix client-server API: `/sync` long-polling with a persisted `since` token,
replies with `PUT /rooms/{room}/send/m.room.message/{txn}`, typing notifications,
reactions as `m.reaction` annotations (taken back by redacting them). An edit (an
`m.replace` relation) is answered as a new message with the `m.new_content` text. The
first sync (no token yet) only records the position: history is not answered.

A thread (`m.relates_to` with `rel_type` `m.thread`) is a conversation of its own and is
answered in the thread; with `overrides.threading = true` a message of the main timeline
is answered in a new thread under it. The bot counts as mentioned when `m.mentions`
names it, a pill or the body names its user id, or the message replies to one of its events.

Files: `m.image`, `m.file`, `m.audio` and `m.video` messages carry an `mxc://` URI, fetched
through the homeserver's authenticated media API (`GET /_matrix/client/v1/media/download/
{server}/{media}` with the access token), never from anywhere else; files go out with
`POST /_matrix/media/v3/upload` and an `m.image` or `m.file` message naming the new URI.

With `refresh_token_env`, an expired access token (401 `M_UNKNOWN_TOKEN`, `soft_logout`) is
traded at `POST /_matrix/client/v3/refresh` and the call repeated (matrix_auth.py); the new
pair replaces the old one in `secrets.env`."""

from __future__ import annotations

import collections
import html
import os
import uuid
from typing import Any
from urllib.parse import quote, urlsplit

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.adapters.matrix_auth import RefreshingToken
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.polling import PollingAdapter
from agentd.channels.conversation import reply_thread


FILE_TYPES = ("m.image", "m.file", "m.audio", "m.video")


class MatrixAdapter(PollingAdapter):
    # An event is at most 65,536 bytes of JSON; body and formatted_body share it, and JSON
    # escapes can triple a character's size.
    max_message_len = 20_000
    limit_unit = "bytes"
    text_format = "html"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.reaction_events: dict[tuple[str, str, str], str] = {}  # (room, event, emoji) -> reaction

    def prepare(self) -> None:
        token = self.env("access_token_env")
        self.client(token, self.settings.get("homeserver_url") or "https://matrix.org")
        self.user_id = str(self.settings.get("user_id") or "")
        if self.settings.get("refresh_token_env"):
            self.auth = RefreshingToken(self.homeserver, token, self.env("refresh_token_env"), self._save_tokens)
            self.http.session.auth = self.auth

    def _save_tokens(self, access: str, refresh: str) -> None:
        """Keep a refreshed pair: the homeserver spent the old refresh token, so a restart
        must start from the new one."""
        self.http.session.headers["Authorization"] = f"Bearer {access}"  # files fetched from now on
        values = {self.settings["access_token_env"]: access, self.settings["refresh_token_env"]: refresh}
        if self.ctx.store_secrets is None:
            os.environ.update(values)
            return
        try:
            self.ctx.store_secrets(values)
        except OSError as exc:
            self.ctx.log.warning("refreshed tokens kept in memory only, secrets.env not written: %s", exc)
            os.environ.update(values)

    def client(self, token: str, homeserver: str) -> None:
        """The client-server API of `homeserver`, as the token's user."""
        self.http.session.headers["Authorization"] = f"Bearer {token}"
        self.homeserver = homeserver.rstrip("/")
        self.base = self.homeserver + "/_matrix/client/v3"
        self.long_poll = int(self.settings.get("long_poll_secs") or 25)
        # Events this adapter sent: a reply to one of them addresses the bot.
        self.own_events: collections.deque[str] = collections.deque(maxlen=1000)

    def poll_once(self) -> None:
        if not self.user_id:
            self.user_id = self.http.json("GET", f"{self.base}/account/whoami", retries=0)["user_id"]
        params: dict[str, Any] = {"timeout": self.long_poll * 1000}
        since = self.state.get("since")
        if since:
            params["since"] = since
        else:
            params["timeout"] = 0
        data = self.http.json("GET", f"{self.base}/sync", params=params, timeout=self.long_poll + 10, retries=0)
        rooms = data.get("rooms") or {}
        if since:
            for room_id in (rooms.get("invite") or {}) if self.settings.get("auto_accept_invites") else ():
                self.http.request("POST", f"{self.base}/join/{quote(room_id, safe='')}", json={})
            for room_id, room in (rooms.get("join") or {}).items():
                for event in (room.get("timeline") or {}).get("events") or []:
                    self._handle(room_id, event)
        self.save_cursor(since=data["next_batch"])

    def _handle(self, room_id: str, event: dict[str, Any]) -> None:
        content = event.get("content") or {}
        kind = content.get("msgtype")
        if (event.get("type") != "m.room.message" or event.get("sender") == self.user_id
                or kind not in ("m.text", "m.notice", *FILE_TYPES) or not content.get("body")):
            return
        sender = str(event.get("sender"))
        relates = content.get("m.relates_to") if isinstance(content.get("m.relates_to"), dict) else {}
        # An edit (an `m.replace` relation) is answered as a new message: its new text, the
        # id of the message it changed.
        edited = relates.get("rel_type") == "m.replace" and isinstance(content.get("m.new_content"), dict)
        event_id = str(relates.get("event_id") or "") if edited else str(event.get("event_id", ""))
        raw = str(content["m.new_content"].get("body") or "") if edited else str(content["body"])
        if not raw:
            return
        existing = str(relates.get("event_id") or "") if relates.get("rel_type") == "m.thread" else ""
        thread = reply_thread(self.settings, existing, event_id, direct=False, default=False)
        replied = str((relates.get("m.in_reply_to") or {}).get("event_id") or "")
        named = ((content.get("m.mentions") or {}).get("user_ids") or []) if isinstance(
            content.get("m.mentions"), dict) else []
        mentioned = bool(self.user_id) and (
            self.user_id in named or self.user_id in str(content.get("formatted_body") or "")
            or self.user_id in raw or (replied in self.own_events and not relates.get("is_falling_back")))
        body = raw
        if self.user_id and body.startswith(self.user_id):
            body = body[len(self.user_id):].lstrip(":, ").strip() or body
        files = [self._attachment(content)] if kind in FILE_TYPES and content.get("url") else []
        if kind in FILE_TYPES and not files:
            return
        if files and content.get("filename") in (None, content["body"]):
            body = ""  # a file's body is its name unless `filename` is set, then the body is a caption
        conversation = Conversation(self.name, room_id, sender, thread_id=thread,
                                    meta={"thread_root": thread, "reply_to": event_id})
        self.ctx.deliver(Inbound(conversation, sender_id=sender, text=body, message_id=event_id,
                                 sender_name=sender, mentioned=mentioned, attachments=files, edited=edited))

    def _attachment(self, content: dict[str, Any]) -> Attachment:
        info = content.get("info") if isinstance(content.get("info"), dict) else {}
        uri = str(content["url"])
        parts = urlsplit(uri)
        # An mxc URI is served by our homeserver; anything else is left as is, to be refused.
        url = (f"{self.homeserver}/_matrix/client/v1/media/download/{quote(parts.netloc, safe='')}/"
               f"{quote(parts.path.lstrip('/'), safe='')}" if parts.scheme == "mxc" else uri)
        return Attachment(str(content.get("filename") or content["body"]), str(info.get("mimetype") or ""),
                          int(info.get("size") or 0), url,
                          headers={"Authorization": self.http.session.headers["Authorization"]})

    def file_hosts(self) -> set[str]:
        if not hasattr(self, "homeserver"):
            self.prepare()
        return {host_of(self.homeserver)}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        uploaded = self.http.json("POST", f"{self.homeserver}/_matrix/media/v3/upload", params={"filename": filename},
                                  data=data, headers={"Content-Type": content_type})
        kind = "m.image" if content_type.startswith("image/") else "m.audio" if content_type.startswith("audio/") \
            else "m.file"
        body = {"msgtype": kind, "body": filename, "filename": filename, "url": uploaded["content_uri"],
                "info": {"mimetype": content_type, "size": len(data)}}
        if conversation.meta.get("thread_root"):
            body["m.relates_to"] = {"rel_type": "m.thread", "event_id": conversation.meta["thread_root"]}
        answer = self.http.json("PUT", f"{self.base}/rooms/{quote(conversation.chat_id, safe='')}/send/"
                                f"m.room.message/{uuid.uuid4().hex}", json=body)
        return str(answer.get("event_id", ""))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        ids = []
        room = quote(conversation.chat_id, safe="")
        for part in self.format_reply(text, both=True):
            content: dict[str, Any] = {"msgtype": "m.text", "body": part.text}
            if part.format == "html":
                content["body"] = part.plain
                if part.text != html.escape(part.plain, quote=False):
                    # Only when there is formatting to show: a plain sentence goes as `body` alone.
                    content.update(format="org.matrix.custom.html", formatted_body=part.text)
            txn = uuid.uuid4().hex  # idempotent retries: the same txn id is not sent twice
            if conversation.meta.get("thread_root"):
                # A thread reply, with the reply fallback for clients without threads.
                content["m.relates_to"] = {"rel_type": "m.thread", "event_id": conversation.meta["thread_root"],
                                           "is_falling_back": True,
                                           "m.in_reply_to": {"event_id": conversation.meta.get("reply_to")
                                                             or conversation.meta["thread_root"]}}
            answer = self.http.json("PUT", f"{self.base}/rooms/{room}/send/m.room.message/{txn}", json=content)
            ids.append(str(answer.get("event_id", "")))
            if hasattr(self, "own_events"):
                self.own_events.append(ids[-1])
        return ",".join(ids)

    def send_typing(self, conversation: Conversation) -> None:
        if self.user_id:
            self.http.request("PUT", f"{self.base}/rooms/{quote(conversation.chat_id, safe='')}/typing/"
                              f"{quote(self.user_id, safe='')}", json={"typing": True, "timeout": 10000},
                              retries=0)

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        room = quote(conversation.chat_id, safe="")
        answer = self.http.json("PUT", f"{self.base}/rooms/{room}/send/m.reaction/{uuid.uuid4().hex}", retries=0,
                                json={"m.relates_to": {"rel_type": "m.annotation", "event_id": message_id,
                                                       "key": emoji}})
        self.reaction_events[(conversation.chat_id, message_id, emoji)] = str(answer.get("event_id", ""))

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        event = self.reaction_events.pop((conversation.chat_id, message_id, emoji), "")
        if event:
            self.http.request("PUT", f"{self.base}/rooms/{quote(conversation.chat_id, safe='')}/redact/"
                              f"{quote(event, safe='')}/{uuid.uuid4().hex}", json={}, retries=0)

    def close(self) -> None:
        super().close()
        if getattr(self, "auth", None) is not None:
            self.auth.close()

    def test_target(self, override: str = "") -> Conversation:
        room = override or next(iter(self.settings.get("allowed_rooms") or []), "")
        if not room:
            raise ChannelError("no test target: set allowed_rooms or pass chat_id (a room id)")
        return Conversation(self.name, room)


ADAPTER = MatrixAdapter
