"""Revolt (now also published as Stoat; same protocol): Bonfire WebSocket for inbound
messages, the REST API (delta) to answer.

Bonfire (https://developers.revolt.chat, docs/stack/bonfire): connect to `ws_url
?version=1&format=json`, send `Authenticate` with the bot token, get `Authenticated` and
`Ready` (users, servers, channels); `Ping` every `ping_secs` (the docs ask for 10-30 s),
answered by `Pong`; `Message` events carry the Message object; `Bulk` wraps several.
REST: `POST /channels/{target}/messages` with `x-bot-token` (2000 characters, `replies`
to thread the answer); a 429 says when to retry in MILLISECONDS (`retry_after` in the
body, `X-RateLimit-Reset-After`), not in a Retry-After header. Typing: `BeginTyping` on the
socket; reactions: `PUT`/`DELETE /channels/{target}/messages/{id}/reactions/{emoji}`.

Files live on Autumn, the file server the API root names (`GET /` -> `features.autumn.url`):
a message's `attachments[]` (File objects: `_id`, `tag`, `filename`, `content_type`,
`size`) are fetched from `{autumn}/{tag}/{_id}` only; files go out with
`POST {autumn}/attachments` (multipart part `file`, `x-bot-token`) answering `{"id"}`, then a
message with `attachments: [id]`.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import requests

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.gateway import GatewayAdapter
from agentd.channels.bases.sender import HttpSender


class RevoltSender(HttpSender):
    """Revolt's rate limiter answers in milliseconds."""

    def retry_wait(self, response: requests.Response) -> float | None:
        try:
            body = response.json()
            millis = body.get("retry_after") if isinstance(body, dict) else None
        except ValueError:
            millis = None
        if not isinstance(millis, (int, float)):
            try:
                millis = float(response.headers.get("X-RateLimit-Reset-After", ""))
            except ValueError:
                return super().retry_wait(response)
        return max(0.0, float(millis) / 1000)


AUTUMN = "https://autumn.revolt.chat"


class RevoltAdapter(GatewayAdapter):
    max_message_len = 2000

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = RevoltSender(stop=self.stopping)
        self.kinds: dict[str, tuple[str, str]] = {}  # channel id -> (channel_type, server id)
        self.users: dict[str, dict[str, Any]] = {}
        self.ready = False

    def prepare(self) -> None:
        self.api = str(self.settings.get("api_url") or "https://api.revolt.chat").rstrip("/")
        self.token = self.env("bot_token_env")
        self.http.session.headers["x-bot-token"] = self.token
        self.bot_id = str(self.http.json("GET", f"{self.api}/users/@me", retries=1)["_id"])
        self.autumn = AUTUMN
        try:  # a self-hosted instance names its own file server
            root = self.http.json("GET", f"{self.api}/", retries=1)
            autumn = ((root.get("features") or {}).get("autumn") or {}) if isinstance(root, dict) else {}
            if autumn.get("url"):
                self.autumn = str(autumn["url"]).rstrip("/")
        except ChannelError as exc:
            self.ctx.log.info("the API root did not name its file server (%s): using %s", exc, AUTUMN)

    def ws_url(self) -> str:
        url = str(self.settings.get("ws_url") or "wss://ws.revolt.chat")
        return url + ("&" if "?" in url else "?") + "version=1&format=json"

    def on_open(self) -> None:
        super().on_open()
        self.ready = False
        self.ws_send({"type": "Authenticate", "token": self.token})
        self.set_heartbeat(float(self.settings.get("ping_secs") or 20))

    def heartbeat_payload(self) -> Any:
        return {"type": "Ping", "data": int(time.time() * 1000)}

    def health(self) -> bool:
        return self.healthy and self.ready

    def on_message(self, data: Any) -> None:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind == "Bulk":
            for item in data.get("v") or []:
                self.on_message(item)
        elif kind == "Pong":
            self.heartbeat_ack()
        elif kind == "Error":
            if data.get("error") in ("InvalidSession", "OnboardingNotFinished"):  # retrying cannot help
                self.give_up(f"revolt refused the bot: {data.get('error')}")
            raise ChannelError(f"revolt refused the connection: {data.get('error')}")
        elif kind == "Ready":
            self.users.update({str(u.get("_id")): u for u in data.get("users") or [] if isinstance(u, dict)})
            for channel in data.get("channels") or []:
                self._learn(channel)
            self.ready = True
        elif kind == "ChannelCreate":
            self._learn(data)
        elif kind == "Message":
            self._message(data)

    def _learn(self, channel: Any) -> None:
        if isinstance(channel, dict) and channel.get("_id"):
            self.kinds[str(channel["_id"])] = (str(channel.get("channel_type") or ""), str(channel.get("server") or ""))

    def _kind(self, channel: str) -> tuple[str, str]:
        if channel not in self.kinds:  # a channel Ready did not list: ask once
            try:
                self._learn(self.http.json("GET", f"{self.api}/channels/{channel}", retries=1))
            except ChannelError as exc:  # unknown: treated as a shared channel (mentions only)
                self.ctx.log.info("channel %s: %s", channel, exc)
        return self.kinds.get(channel, ("", ""))

    def _message(self, d: dict[str, Any]) -> None:
        author, text = str(d.get("author") or ""), str(d.get("content") or "")
        files = [self._attachment(f) for f in d.get("attachments") or [] if isinstance(f, dict) and f.get("_id")]
        if author == self.bot_id or d.get("system") or self.users.get(author, {}).get("bot") \
                or not (text.strip() or files):
            return
        channel = str(d.get("channel") or "")
        channel_type, server = self._kind(channel)
        direct = channel_type == "DirectMessage"
        mentioned = self.bot_id in (d.get("mentions") or []) or f"<@{self.bot_id}>" in text
        if not direct:
            text = text.replace(f"<@{self.bot_id}>", "").strip()
        username = str(self.users.get(author, {}).get("username") or "")
        conversation = Conversation(self.name, channel, author, direct=direct,
                                    meta={"reply_to": "" if direct else str(d.get("_id") or "")})
        self.ctx.deliver(Inbound(conversation, sender_id=author, text=text, message_id=str(d.get("_id") or ""),
                                 sender_name=username, sender_aliases=(username,) if username else (),
                                 chat_aliases=(server,) if server else (), mentioned=mentioned,
                                 addressed=direct or mentioned, attachments=files))

    def _attachment(self, f: dict[str, Any]) -> Attachment:
        tag = quote(str(f.get("tag") or "attachments"), safe="")
        return Attachment(str(f.get("filename") or f["_id"]), str(f.get("content_type") or ""),
                          int(f.get("size") or 0), f"{self.autumn}/{tag}/{quote(str(f['_id']), safe='')}")

    def file_hosts(self) -> set[str]:
        if not hasattr(self, "autumn"):
            self.prepare()
        return {host_of(self.autumn), host_of(self.api)}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "api"):
            self.prepare()
        uploaded = self.http.json("POST", f"{self.autumn}/attachments", files={"file": (filename, data, content_type)})
        body: dict[str, Any] = {"attachments": [str(uploaded["id"])]}
        if conversation.meta.get("reply_to"):
            body["replies"] = [{"id": conversation.meta["reply_to"], "mention": False}]
        answer = self.http.json("POST", f"{self.api}/channels/{conversation.chat_id}/messages", json=body)
        return str(answer.get("_id", ""))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "api"):
            self.prepare()
        ids = []
        for index, part in enumerate(self.reply_texts(text)):
            body: dict[str, Any] = {"content": part}
            if index == 0 and conversation.meta.get("reply_to"):
                body["replies"] = [{"id": conversation.meta["reply_to"], "mention": False}]
            answer = self.http.json("POST", f"{self.api}/channels/{conversation.chat_id}/messages", json=body)
            ids.append(str(answer.get("_id", "")))
        return ",".join(ids)

    def send_typing(self, conversation: Conversation) -> None:
        self.ws_send({"type": "BeginTyping", "channel": conversation.chat_id})

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.http.request("PUT", f"{self.api}/channels/{conversation.chat_id}/messages/{message_id}/reactions/"
                          f"{quote(emoji, safe='')}", retries=0)

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.http.request("DELETE", f"{self.api}/channels/{conversation.chat_id}/messages/{message_id}/reactions/"
                          f"{quote(emoji, safe='')}", retries=0)

    def test_target(self, override: str = "") -> Conversation:
        target = override or next(iter(self.settings.get("allowed_channels") or []), "")
        if not target:
            raise ChannelError("no test target: pass chat_id (a Revolt channel id) or set allowed_channels")
        return Conversation(self.name, target)


ADAPTER = RevoltAdapter
