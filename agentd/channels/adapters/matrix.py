"""Matrix client-server API: `/sync` long-polling with a persisted `since` token,
replies with `PUT /rooms/{room}/send/m.room.message/{txn}`, typing notifications.
The first sync (no token yet) only records the position: history is not answered.

Files: `m.image`, `m.file`, `m.audio` and `m.video` messages carry an `mxc://` URI, fetched
through the homeserver's authenticated media API (`GET /_matrix/client/v1/media/download/
{server}/{media}` with the access token), never from anywhere else; files go out with
`POST /_matrix/media/v3/upload` and an `m.image` or `m.file` message naming the new URI."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote, urlsplit

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.polling import PollingAdapter
from agentd.channels.bases.sender import split_text


FILE_TYPES = ("m.image", "m.file", "m.audio", "m.video")


class MatrixAdapter(PollingAdapter):
    max_message_len = 30_000

    def prepare(self) -> None:
        token = self.env("access_token_env")
        self.http.session.headers["Authorization"] = f"Bearer {token}"
        self.homeserver = (self.settings.get("homeserver_url") or "https://matrix.org").rstrip("/")
        self.base = self.homeserver + "/_matrix/client/v3"
        self.long_poll = int(self.settings.get("long_poll_secs") or 25)
        self.user_id = str(self.settings.get("user_id") or "")

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
        files = [self._attachment(content)] if kind in FILE_TYPES and content.get("url") else []
        if kind in FILE_TYPES and not files:
            return
        # A file's body is its name unless `filename` is set, then the body is a caption.
        text = str(content["body"]) if not files or content.get("filename") not in (None, content["body"]) else ""
        sender = str(event.get("sender"))
        conversation = Conversation(self.name, room_id, sender)
        self.ctx.deliver(Inbound(conversation, sender_id=sender, text=text,
                                 message_id=str(event.get("event_id", "")), sender_name=sender, attachments=files))

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
        answer = self.http.json("PUT", f"{self.base}/rooms/{quote(conversation.chat_id, safe='')}/send/"
                                f"m.room.message/{uuid.uuid4().hex}", json=body)
        return str(answer.get("event_id", ""))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        ids = []
        room = quote(conversation.chat_id, safe="")
        for part in split_text(text, self.max_message_len):
            txn = uuid.uuid4().hex  # idempotent retries: the same txn id is not sent twice
            answer = self.http.json("PUT", f"{self.base}/rooms/{room}/send/m.room.message/{txn}",
                                    json={"msgtype": "m.text", "body": part})
            ids.append(str(answer.get("event_id", "")))
        return ",".join(ids)

    def send_typing(self, conversation: Conversation) -> None:
        if self.user_id:
            self.http.request("PUT", f"{self.base}/rooms/{quote(conversation.chat_id, safe='')}/typing/"
                              f"{quote(self.user_id, safe='')}", json={"typing": True, "timeout": 10000},
                              retries=0)

    def test_target(self, override: str = "") -> Conversation:
        room = override or next(iter(self.settings.get("allowed_rooms") or []), "")
        if not room:
            raise ChannelError("no test target: set allowed_rooms or pass chat_id (a room id)")
        return Conversation(self.name, room)


ADAPTER = MatrixAdapter
