"""Nextcloud Talk (OCS API v2, `OCS-APIRequest: true`, Bearer token): lists the bot's
conversations (`GET .../spreed/api/v4/room`), long-polls each room's chat with
`lookIntoFuture=1` from the last known message id (persisted; history before the first
start is not answered), replies with `POST .../spreed/api/v1/chat/{token}` {message,
replyTo}. Group conversations are answered when the bot is mentioned (every message under
`overrides.group_policy` respond / shared); one-to-one always.

Files: Talk shares a file to a conversation as a share of the sender's Nextcloud Files; the
message names it as a `file` rich object (`name`, `size`, `mimetype`, `path` in the
receiving account's own files), fetched over WebDAV, `GET /remote.php/dav/files/{user}/{path}`,
with the same token. A file goes out the way Talk's clients send one: `PUT` into the
account's `Talk/` folder over WebDAV, then a share to the conversation (`POST
/ocs/v2.php/apps/files_sharing/api/v1/shares`, `shareType=10`, `shareWith` = its token).
Docs: https://nextcloud-talk.readthedocs.io/en/latest/chat/#share-a-file-to-the-chat"""

from __future__ import annotations

import re
import uuid
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.polling import PollingAdapter
from agentd.channels.conversation import without_mention

ONE_TO_ONE = 1


class NextcloudAdapter(PollingAdapter):
    max_message_len = 32_000

    def prepare(self) -> None:
        self.base = str(self.settings.get("server_url") or "").rstrip("/")
        if not self.base:
            raise ChannelError("server_url is not set")
        self.http.session.headers.update({"Authorization": f"Bearer {self.env('token_env')}",
                                          "OCS-APIRequest": "true", "Accept": "application/json"})
        self.long_poll = int(self.settings.get("long_poll_secs") or 20)
        self.me = ""

    def ocs(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.http.json(method, f"{self.base}/ocs/v2.php/{path}", **kwargs)["ocs"]["data"]

    def poll_once(self) -> None:
        if not self.me:
            self.me = str(self.ocs("GET", "cloud/user", retries=0)["id"])
        allowed = set(self.settings.get("allowed_rooms") or [])
        rooms = [r for r in self.ocs("GET", "apps/spreed/api/v4/room", retries=0) if not allowed or r["token"] in allowed]
        # One room: wait server-side for news. Several: quick looks and a pause between rounds.
        wait = self.long_poll if len(rooms) == 1 else 0
        self.poll_interval = 0.0 if wait else float(self.settings.get("poll_interval_secs") or 2)
        cursors = dict(self.state.get("rooms") or {})
        for room in rooms:
            token = room["token"]
            if token not in cursors:  # first sight: start after its newest message
                cursors[token] = int((room.get("lastMessage") or {}).get("id") or 0)
                self.save_cursor(rooms=cursors)
            response = self.http.request("GET", f"{self.base}/ocs/v2.php/apps/spreed/api/v1/chat/{token}",
                                         params={"lookIntoFuture": 1, "lastKnownMessageId": cursors[token],
                                                 "timeout": wait, "limit": 100, "setReadMarker": 0},
                                         timeout=wait + 15, retries=0)
            if response.status_code == 304:  # nothing new within the timeout
                continue
            for message in response.json()["ocs"]["data"]:
                cursors[token] = max(cursors[token], int(message["id"]))
                self.save_cursor(rooms=cursors)
                self._handle(room, message)

    def _handle(self, room: dict[str, Any], message: dict[str, Any]) -> None:
        if message.get("messageType") != "comment" or message.get("actorType") != "users" \
                or message.get("actorId") == self.me:
            return  # system messages, bots, guests and ourselves
        text, mentioned, files = str(message.get("message") or ""), False, []
        for key, param in (message.get("messageParameters") or {}).items():
            if isinstance(param, dict) and param.get("type") == "user" and param.get("id") == self.me:
                mentioned, text = True, without_mention(text, re.escape("{" + key + "}"))
            elif isinstance(param, dict) and param.get("type") == "file" and param.get("path"):
                files.append(self._attachment(param))
                text = text.replace("{" + key + "}", "")
            elif isinstance(param, dict):
                text = text.replace("{" + key + "}", "@" + str(param.get("name") or param.get("id")))
        direct = room.get("type") == ONE_TO_ONE
        user = str(message["actorId"])
        conversation = Conversation(self.name, room["token"], user, direct=direct, meta={"reply_to": message["id"]})
        self.ctx.deliver(Inbound(conversation, sender_id=user, text=text.strip(),
                                 message_id=str(message["id"]), attachments=files,
                                 sender_name=str(message.get("actorDisplayName") or user), mentioned=mentioned,
                                 addressed=direct or mentioned))

    def dav(self, path: str) -> str:
        """The WebDAV URL of `path` in the account's own files."""
        return f"{self.base}/remote.php/dav/files/{quote(self.me, safe='')}/{quote(path.lstrip('/'))}"

    def _attachment(self, param: dict[str, Any]) -> Attachment:
        path = str(param["path"])
        return Attachment(str(param.get("name") or PurePosixPath(path).name), str(param.get("mimetype") or ""),
                          int(param.get("size") or 0), self.dav(path),
                          headers={"Authorization": self.http.session.headers["Authorization"]})

    def file_hosts(self) -> set[str]:
        if not hasattr(self, "base"):
            self.prepare()
        return {host_of(self.base)}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        if not self.me:
            self.me = str(self.ocs("GET", "cloud/user")["id"])
        # A name of its own in Talk/, as Talk's clients do: an earlier file of the same name stays.
        name = PurePosixPath(filename)
        path = f"Talk/{name.stem}-{uuid.uuid4().hex[:6]}{name.suffix}"
        # MKCOL answers 405 when the folder exists already: either way it is there afterwards.
        self.http.session.request("MKCOL", self.dav("Talk"), timeout=30)
        self.http.request("PUT", self.dav(path), data=data, headers={"Content-Type": content_type})
        share = self.ocs("POST", "apps/files_sharing/api/v1/shares",
                         json={"shareType": 10, "shareWith": conversation.chat_id, "path": "/" + path})
        return str(share.get("id", "")) if isinstance(share, dict) else ""

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        ids = []
        for part in self.reply_texts(text):
            body: dict[str, Any] = {"message": part}
            if conversation.meta.get("reply_to"):
                body["replyTo"] = conversation.meta["reply_to"]
            sent = self.ocs("POST", f"apps/spreed/api/v1/chat/{conversation.chat_id}", json=body)
            ids.append(str(sent.get("id", "")))
        return ",".join(ids)

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.ocs("POST", f"apps/spreed/api/v1/reaction/{conversation.chat_id}/{message_id}", retries=0,
                 json={"reaction": emoji})

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.ocs("DELETE", f"apps/spreed/api/v1/reaction/{conversation.chat_id}/{message_id}", retries=0,
                 json={"reaction": emoji})

    def test_target(self, override: str = "") -> Conversation:
        target = override or next(iter(self.settings.get("allowed_rooms") or []), "")
        if not target:
            raise ChannelError("no test target: set allowed_rooms or pass chat_id (a conversation token)")
        return Conversation(self.name, target)


ADAPTER = NextcloudAdapter
