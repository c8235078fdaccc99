"""Matrix client-server API: `/sync` long-polling with a persisted `since` token,
replies with `PUT /rooms/{room}/send/m.room.message/{txn}`, typing notifications,
reactions as `m.reaction` annotations (taken back by redacting them). An edit (an
`m.replace` relation) is answered as a new message with the `m.new_content` text. The
first sync (no token yet) only records the position: history is not answered."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.polling import PollingAdapter
from agentd.channels.bases.sender import split_text


class MatrixAdapter(PollingAdapter):
    max_message_len = 30_000

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.reaction_events: dict[tuple[str, str, str], str] = {}  # (room, event, emoji) -> reaction

    def prepare(self) -> None:
        token = self.env("access_token_env")
        self.http.session.headers["Authorization"] = f"Bearer {token}"
        self.base = (self.settings.get("homeserver_url") or "https://matrix.org").rstrip("/") + "/_matrix/client/v3"
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
        if (event.get("type") != "m.room.message" or event.get("sender") == self.user_id
                or content.get("msgtype") not in ("m.text", "m.notice") or not content.get("body")):
            return
        sender = str(event.get("sender"))
        relation = content.get("m.relates_to") or {}
        edited = relation.get("rel_type") == "m.replace" and isinstance(content.get("m.new_content"), dict)
        text = str(content["m.new_content"].get("body") or "") if edited else str(content["body"])
        if not text:
            return
        conversation = Conversation(self.name, room_id, sender)
        self.ctx.deliver(Inbound(conversation, sender_id=sender, text=text, edited=edited,
                                 message_id=str(relation.get("event_id") if edited else event.get("event_id", "")),
                                 sender_name=sender))

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

    def test_target(self, override: str = "") -> Conversation:
        room = override or next(iter(self.settings.get("allowed_rooms") or []), "")
        if not room:
            raise ChannelError("no test target: set allowed_rooms or pass chat_id (a room id)")
        return Conversation(self.name, room)


ADAPTER = MatrixAdapter
