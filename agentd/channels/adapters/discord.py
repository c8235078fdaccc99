"""Discord: Gateway v10 over WebSocket for inbound messages, REST API v10 to answer.

Gateway (https://discord.com/developers/docs/topics/gateway): HELLO (op 10) gives the
heartbeat interval; heartbeats (op 1) carry the last sequence number and are answered
by op 11; IDENTIFY (op 2) with the intents, READY gives the session id, the bot user and
the resume URL; after a drop, op 7 (reconnect) or a resumable op 9, the adapter RESUMEs
(op 6) on the resume URL and Discord replays what was missed; op 9 false means identify
afresh. REST: `POST /channels/{id}/messages` (2000 characters each), `POST
/channels/{id}/typing`, `Authorization: Bot <token>`; 429s carry `retry_after` (seconds)
in the body and Retry-After, which the shared sender honours.

With `auto_thread = "true"` (or `overrides.threading = true`) a guild message the bot
answers gets a thread of its own (`POST /channels/{id}/messages/{message}/threads`, Start
Thread from Message: the thread takes the message's id); the answer and the rest of that
conversation go there, and messages in it need no mention. A thread is a conversation of
its own; the bot counts as mentioned when the message mentions it or replies to it.

Files: a message's `attachments` are fetched from their `url`, only from Discord's CDN
(cdn.discordapp.com, media.discordapp.net, or the host of `api_url`); files go out as a
multipart `POST /channels/{id}/messages` (`payload_json` and `files[0]`).

Approvals carry message components (an action row of two buttons); a click arrives as
INTERACTION_CREATE (type 3, `data.custom_id`) and is answered within Discord's 3 s at
`POST /interactions/{id}/{token}/callback`: type 7 replaces the request by its outcome
(buttons gone), type 4 with flag 64 (ephemeral) tells a refused clicker alone. Reactions:
`PUT`/`DELETE /channels/{id}/messages/{id}/reactions/{emoji}/@me`. An edited message
(MESSAGE_UPDATE with `edited_timestamp`) is answered as a new one.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any
from urllib.parse import quote

from agentd import __version__
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.gateway import GatewayAdapter
from agentd.channels.bases.websocket import Reconnect
from agentd.channels.conversation import threaded

API_URL = "https://discord.com/api/v10"
CDN_HOSTS = {"cdn.discordapp.com", "media.discordapp.net"}
INTENTS = (1 << 9) | (1 << 12) | (1 << 15)  # GUILD_MESSAGES, DIRECT_MESSAGES, MESSAGE_CONTENT
# Close codes after which Discord says not to reconnect, and those that end the session.
FATAL = {4004: "authentication failed", 4010: "invalid shard", 4011: "sharding required",
         4012: "invalid API version", 4013: "invalid intents", 4014: "disallowed intents (enable them in "
         "the Developer Portal: Message Content is privileged)"}
NEW_SESSION = {4007, 4009}  # invalid seq, session timed out: identify again


class DiscordAdapter(GatewayAdapter):
    max_message_len = 2000
    limit_unit = "utf16"  # at least as strict as counting characters
    text_format = "discord"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        # Threads this adapter started (thread channel id -> parent channel id): their
        # messages are answered without a mention, as one conversation with the first.
        self.threads: dict[str, str] = {}

    def prepare(self) -> None:
        self.api = str(self.settings.get("api_url") or API_URL).rstrip("/")
        self.token = self.env("bot_token_env")
        self.http.session.headers.update({"Authorization": f"Bot {self.token}",
                                          "User-Agent": f"DiscordBot (agentd, {__version__})"})
        # Who am I (and is the token good): a bad token fails the start, not a reconnect loop.
        self.bot_id = str(self.http.json("GET", f"{self.api}/users/@me", retries=1)["id"])
        self.gateway = str(self.settings.get("gateway_url") or "") or str(
            self.http.json("GET", f"{self.api}/gateway/bot", retries=1)["url"])
        self.session_id, self.resume_url, self.seq, self.ready = "", "", None, False

    def ws_url(self) -> str:
        base = self.resume_url if self.session_id else self.gateway
        return base.rstrip("/") + "/?v=10&encoding=json"

    def on_open(self) -> None:
        super().on_open()
        self.ready = False

    def heartbeat_payload(self) -> Any:
        return {"op": 1, "d": self.seq}

    def health(self) -> bool:
        return self.healthy and self.ready

    def on_close(self, code: int, reason: str) -> None:
        if code in FATAL:
            self.give_up(f"discord closed the gateway: {code} {FATAL[code]}")
        elif code in NEW_SESSION:
            self.session_id, self.seq = "", None

    def on_message(self, data: Any) -> None:
        if not isinstance(data, dict):
            return
        op, d = data.get("op"), data.get("d")
        if data.get("s") is not None:
            self.seq = data["s"]
        if op == 10:
            interval = float((d or {}).get("heartbeat_interval", 41250)) / 1000
            self.set_heartbeat(interval, first=interval * random.random())  # jitter, as documented
            if self.session_id:
                self.ws_send({"op": 6, "d": {"token": self.token, "session_id": self.session_id, "seq": self.seq}})
            else:
                self.ws_send({"op": 2, "d": {"token": self.token, "intents": int(self.settings.get("intents") or INTENTS),
                                             "properties": {"os": "linux", "browser": "agentd", "device": "agentd"}}})
        elif op == 11:
            self.heartbeat_ack()
        elif op == 1:
            self.beat_now()
        elif op == 7:
            raise Reconnect("gateway asked to reconnect (op 7)")
        elif op == 9:
            if not d:  # not resumable: identify again after 1-5 s, as the docs ask
                self.session_id, self.seq = "", None
                self.stopping.wait(random.uniform(1, 5))
            raise ChannelError("gateway invalidated the session (op 9)")
        elif op == 0 and isinstance(d, dict):
            self._dispatch(str(data.get("t")), d)

    def _dispatch(self, kind: str, d: dict[str, Any]) -> None:
        if kind == "READY":
            self.session_id = str(d.get("session_id") or "")
            self.resume_url = str(d.get("resume_gateway_url") or self.gateway)
            self.bot_id = str((d.get("user") or {}).get("id") or self.bot_id)
            self.ready = True
        elif kind == "RESUMED":
            self.ready = True
        elif kind == "MESSAGE_CREATE":
            self._message(d)
        elif kind == "MESSAGE_UPDATE" and d.get("edited_timestamp") and "content" in d:
            self._message(d, edited=True)
        elif kind == "INTERACTION_CREATE" and d.get("type") == 3:
            self._clicked(d)

    def _clicked(self, d: dict[str, Any]) -> None:
        verb, _, approval_id = str((d.get("data") or {}).get("custom_id") or "").partition(":")
        user = (d.get("member") or {}).get("user") or d.get("user") or {}
        guild, channel = str(d.get("guild_id") or ""), str(d.get("channel_id") or "")
        if verb not in ("approve", "reject") or not user.get("id") or not channel:
            return
        username = str(user.get("username") or "")
        parent = self.threads.get(channel, "")  # a click in a thread belongs to its conversation
        self.ctx.deliver(Inbound(Conversation(self.name, parent or channel, str(user["id"]), direct=not guild,
                                              thread_id=channel if parent else ""),
                                 sender_id=str(user["id"]), text=f"/{verb} {approval_id}",
                                 message_id=str((d.get("message") or {}).get("id") or ""),
                                 sender_name=username, sender_aliases=(username,) if username else (),
                                 chat_aliases=(guild,) if guild else (),
                                 interaction={"id": str(d.get("id")), "token": str(d.get("token"))}))

    def _message(self, d: dict[str, Any], edited: bool = False) -> None:
        author = d.get("author") or {}
        user = str(author.get("id") or "")
        if user == self.bot_id or ((author.get("bot") or d.get("webhook_id")) and self.settings.get("ignore_bots", True)):
            return
        guild, channel = str(d.get("guild_id") or ""), str(d.get("channel_id") or "")
        text = str(d.get("content") or "")
        mentioned = any(str(m.get("id")) == self.bot_id for m in d.get("mentions") or [] if isinstance(m, dict))
        mentioned = mentioned or str(((d.get("referenced_message") or {}).get("author") or {}).get("id")
                                     or "") == self.bot_id
        parent = self.threads.get(channel, "")
        # In a guild channel, addressed: a mention, a free-response channel or our thread.
        addressed = not guild or mentioned or bool(parent) \
            or channel in (self.settings.get("free_response_channels") or [])
        if guild:
            text = re.sub(rf"<@!?{re.escape(self.bot_id)}>", "", text).strip()
        files = [Attachment(str(a.get("filename") or a.get("id") or "file"), str(a.get("content_type") or ""),
                            int(a.get("size") or 0), str(a.get("url") or ""))
                 for a in d.get("attachments") or [] if isinstance(a, dict) and a.get("url")]
        if (not text and not files) or not channel:
            return
        message_id = str(d.get("id") or "")
        meta: dict[str, Any] = {"reply_to": "" if not guild or parent else message_id}
        thread = channel if parent else ""
        if guild and not parent and threaded(self.settings, default=self.settings.get("auto_thread") == "true"):
            # A thread started from a message takes the message's id (Start Thread from Message).
            meta.update(start_thread=True, thread_name=" ".join(text.split())[:80] or "conversation")
            thread = message_id
        conversation = Conversation(self.name, parent or channel, user, direct=not guild, meta=meta,
                                    thread_id=thread)
        username = str(author.get("username") or "")
        self.ctx.deliver(Inbound(conversation, sender_id=user, text=text, message_id=message_id,
                                 sender_name=username, sender_aliases=(username,) if username else (),
                                 chat_aliases=(guild,) if guild else (), mentioned=mentioned, addressed=addressed,
                                 attachments=files, edited=edited))

    def file_hosts(self) -> set[str]:
        api = str(self.settings.get("api_url") or "")
        return CDN_HOSTS | ({host_of(api)} if api else set())

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "api"):
            self.prepare()
        payload: dict[str, Any] = {"attachments": [{"id": 0, "filename": filename}], "allowed_mentions": {"parse": []}}
        if conversation.meta.get("reply_to"):
            payload["message_reference"] = {"message_id": conversation.meta["reply_to"], "fail_if_not_exists": False}
        answer = self.http.json("POST", f"{self.api}/channels/{self._channel_now(conversation)}/messages",
                                data={"payload_json": json.dumps(payload)},
                                files={"files[0]": (filename, data, content_type)})
        return str(answer.get("id", ""))

    @staticmethod
    def _channel_now(conversation: Conversation) -> str:
        """Where a message other than the reply goes: the conversation's thread once it exists
        (the text reply starts a new one)."""
        return conversation.chat_id if conversation.meta.get("start_thread") else \
            conversation.thread_id or conversation.chat_id

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "api"):
            self.prepare()
        ids = []
        target = conversation.thread_id or conversation.chat_id
        if conversation.meta.pop("start_thread", False):
            try:
                created = self.http.json("POST", f"{self.api}/channels/{conversation.chat_id}/messages/"
                                         f"{conversation.meta['reply_to']}/threads",
                                         json={"name": conversation.meta.get("thread_name") or "conversation",
                                               "auto_archive_duration": 1440})
            except ChannelError as exc:  # no permission to create threads: answer in the channel
                self.ctx.log.info("discord: could not start a thread (%s); answering in the channel", exc)
                target = conversation.chat_id
            else:
                target = str(created.get("id") or target)
                self.threads[target] = conversation.chat_id
                conversation.meta["reply_to"] = ""
        for index, part in enumerate(self.reply_texts(text)):
            body: dict[str, Any] = {"content": part, "allowed_mentions": {"parse": []}}  # agents never ping @everyone
            if index == 0 and conversation.meta.get("reply_to"):
                body["message_reference"] = {"message_id": conversation.meta["reply_to"], "fail_if_not_exists": False}
            answer = self.http.json("POST", f"{self.api}/channels/{target}/messages", json=body)
            ids.append(str(answer.get("id", "")))
        return ",".join(ids)

    def send_typing(self, conversation: Conversation) -> None:
        self.http.request("POST", f"{self.api}/channels/{conversation.thread_id or conversation.chat_id}/typing",
                          retries=0)

    def _reaction_url(self, conversation: Conversation, message_id: str, emoji: str) -> str:
        # A thread started from a message takes its id; that message stays in the channel.
        where = conversation.thread_id if conversation.thread_id not in ("", message_id) else conversation.chat_id
        return (f"{self.api}/channels/{where}/messages/{message_id}/reactions/"
                f"{quote(emoji, safe='')}/@me")

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.http.request("PUT", self._reaction_url(conversation, message_id, emoji), retries=0)

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.http.request("DELETE", self._reaction_url(conversation, message_id, emoji), retries=0)

    def send_approval(self, conversation: Conversation, approval_id: str, text: str) -> str:
        if not hasattr(self, "api"):
            self.prepare()
        buttons = [{"type": 2, "style": style, "label": label, "custom_id": f"{verb}:{approval_id}"}
                   for verb, label, style in (("approve", "Approve", 3), ("reject", "Reject", 4))]
        body: dict[str, Any] = {"content": text[:self.max_message_len], "allowed_mentions": {"parse": []},
                                "components": [{"type": 1, "components": buttons}]}
        answer = self.http.json("POST", f"{self.api}/channels/{self._channel_now(conversation)}/messages", json=body)
        return str(answer.get("id", ""))

    def settle_approval(self, conversation: Conversation, request_id: str, text: str) -> None:
        self.http.request("PATCH", f"{self.api}/channels/{self._channel_now(conversation)}/messages/{request_id}",
                          json={"content": text, "components": []})

    def answer_interaction(self, msg: Inbound, text: str, final: bool) -> bool:
        click = msg.interaction
        answer = ({"type": 7, "data": {"content": text, "components": []}} if final
                  else {"type": 4, "data": {"content": text, "flags": 64}})
        self.http.request("POST", f"{self.api}/interactions/{click['id']}/{click['token']}/callback",
                          json=answer, retries=0)
        return True

    def test_target(self, override: str = "") -> Conversation:
        target = override or str(self.settings.get("default_channel_id") or "")
        if not target:
            raise ChannelError("no test target: set default_channel_id or pass chat_id (a channel id)")
        return Conversation(self.name, target)


ADAPTER = DiscordAdapter
