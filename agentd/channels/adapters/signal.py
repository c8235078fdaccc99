"""Signal through signal-cli-rest-api (bbernhard/signal-cli-rest-api, normal/native mode):
inbound by polling `GET /v1/receive/{number}` (each call hands over and removes the
queued envelopes), replies with `POST /v2/send`, typing with
`PUT /v1/typing-indicator/{number}`. Group messages go back to `group.<base64 id>`.

Files: a data message's `attachments` (id, contentType, filename, size) are fetched with
`GET /v1/attachments/{id}` from the configured `api_url` only; files go out with
`POST /v2/send` carrying `base64_attachments` (`data:<type>;filename=<name>;base64,<data>`)."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import quote

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.polling import PollingAdapter

DEFAULT_API_URL = "http://localhost:8080"


class SignalAdapter(PollingAdapter):
    max_message_len = 2000
    text_format = "plain"

    def prepare(self) -> None:
        self.base = str(self.settings.get("api_url") or DEFAULT_API_URL).rstrip("/")
        self.number = str(self.settings.get("phone_number") or "")
        if not self.number:
            raise ChannelError("phone_number (the bot's registered Signal number) is not set")
        self.receive_timeout = int(self.settings.get("receive_timeout_secs") or 1)
        self.poll_interval = float(self.settings.get("poll_interval_secs") or 1.0)

    def poll_once(self) -> None:
        # The REST API waits up to `timeout` seconds for envelopes before answering.
        envelopes = self.http.json("GET", f"{self.base}/v1/receive/{quote(self.number)}",
                                   params={"timeout": self.receive_timeout},
                                   timeout=self.receive_timeout + 15, retries=0)
        for item in envelopes if isinstance(envelopes, list) else []:
            self._handle((item or {}).get("envelope") or {})

    def _handle(self, envelope: dict[str, Any]) -> None:
        data = envelope.get("dataMessage") or {}
        text = data.get("message") or ""
        sender = str(envelope.get("sourceNumber") or envelope.get("source") or "")
        files = [Attachment(str(a.get("filename") or a["id"]), str(a.get("contentType") or ""),
                            int(a["size"]) if str(a.get("size")).isdigit() else 0,
                            f"{self.base}/v1/attachments/{quote(str(a['id']), safe='')}")
                 for a in data.get("attachments") or [] if isinstance(a, dict) and a.get("id")]
        if not isinstance(text, str) or not (text or files) or not sender or sender == self.number:
            return  # receipts, typing notices, reactions, our own sync messages
        group = (data.get("groupInfo") or {}).get("groupId")
        if group:  # the send API addresses groups as "group." + base64(internal id)
            chat = "group." + base64.b64encode(str(group).encode()).decode()
            conversation = Conversation(self.name, chat, sender)
        else:
            conversation = Conversation(self.name, sender, sender, direct=True)
        uuid = str(envelope.get("sourceUuid") or "")
        self.ctx.deliver(Inbound(conversation, sender_id=sender, text=text,
                                 message_id=str(data.get("timestamp") or envelope.get("timestamp") or ""),
                                 sender_name=str(envelope.get("sourceName") or sender),
                                 sender_aliases=(uuid,) if uuid else (), attachments=files))

    def file_hosts(self) -> set[str]:
        return {host_of(str(self.settings.get("api_url") or DEFAULT_API_URL))}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        # The data URI's parameters are split on ';', so a name must not carry one.
        name = filename.replace(";", "_").replace(",", "_")
        encoded = f"data:{content_type};filename={name};base64,{base64.b64encode(data).decode()}"
        answer = self.http.json("POST", f"{self.base}/v2/send", json={
            "message": "", "number": self.number, "recipients": [conversation.chat_id],
            "base64_attachments": [encoded]})
        return str((answer or {}).get("timestamp", ""))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        stamps = []
        for part in self.reply_texts(text):
            answer = self.http.json("POST", f"{self.base}/v2/send", json={
                "message": part, "number": self.number, "recipients": [conversation.chat_id]})
            stamps.append(str((answer or {}).get("timestamp", "")))
        return ",".join(stamps)

    def send_typing(self, conversation: Conversation) -> None:
        self.http.request("PUT", f"{self.base}/v1/typing-indicator/{quote(self.number)}",
                          json={"recipient": conversation.chat_id}, retries=0)

    def _reaction(self, method: str, conversation: Conversation, message_id: str, emoji: str) -> None:
        # A reaction names the message by its author and timestamp; a new one replaces the last.
        self.http.request(method, f"{self.base}/v1/reactions/{quote(self.number)}", retries=0, json={
            "reaction": emoji, "recipient": conversation.chat_id, "target_author": conversation.user_id,
            "timestamp": int(message_id)})

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self._reaction("POST", conversation, message_id, emoji)

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self._reaction("DELETE", conversation, message_id, emoji)

    def test_target(self, override: str = "") -> Conversation:
        target = override or next(iter(self.settings.get("allowed_users") or []), "")
        if not target:
            raise ChannelError("no test target: pass chat_id (a phone number or group.<id>)")
        return Conversation(self.name, target, target, direct=True)


ADAPTER = SignalAdapter
