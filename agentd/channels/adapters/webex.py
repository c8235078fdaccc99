"""Webex bots: inbound through a webhook the adapter registers itself (`POST /v1/webhooks`,
resource `messages`, event `created`, with a fresh random secret per start), each call
signed `X-Spark-Signature` (hex HMAC-SHA1 of the raw body with that secret, checked before
parsing). Webhook payloads carry no text, so the message is read with
`GET /v1/messages/{id}`; replies go out with `POST /v1/messages` (roomId + markdown).
The bot's own messages are recognised by its person id (`GET /v1/people/me`).

Files: a message's `files` (URLs of `/v1/contents/{id}`) are fetched with the bot token
from webexapis.com (or the host of `api_url`) only; their name, type and size come from a
`HEAD` of the same URL (`Content-Disposition`), asked only of those hosts. Files go out
with `POST /v1/messages` as multipart/form-data (`roomId`, one file in `files`), which
Webex shows inline when it is an image.

Docs: https://developer.webex.com/docs/api/guides/webhooks,
https://developer.webex.com/docs/api/v1/messages, https://developer.webex.com/docs/bots
"""

from __future__ import annotations

import secrets
from email.message import Message
from typing import Any
from urllib.parse import quote

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, allowed, host_of
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.webhook import Request, WebhookAdapter

API_URL = "https://webexapis.com"


class WebexAdapter(WebhookAdapter):
    # Webex caps a message at 7439 bytes; characters are counted here, so stay well below.
    max_message_len = 7000

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)
        self.secret = secrets.token_hex(32)  # known only to this run and to Webex
        self.me: dict[str, Any] = {}
        self.webhook_id = ""

    def api(self, path: str) -> str:
        return (self.settings.get("api_url") or API_URL).rstrip("/") + "/v1" + path

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.env('bot_token_env')}"}
        response = self.http.request(method, self.api(path), headers=headers, **kwargs)
        return response.json() if response.content else {}

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8458)

    def prepare(self) -> None:
        self.env("bot_token_env")
        if not self.settings.get("webhook_url"):
            raise ChannelError("webhook_url is not set: Webex needs the public URL of this listener")
        self.me = self.call("GET", "/people/me", retries=1)

    def start(self) -> None:
        super().start()  # the listener is up before Webex may call it
        try:
            target = str(self.settings["webhook_url"])
            # Webhooks of earlier runs point at the same URL with a secret we no longer know.
            for hook in self.call("GET", "/webhooks").get("items") or []:
                if hook.get("targetUrl") == target:
                    self.call("DELETE", f"/webhooks/{quote(str(hook['id']), safe='')}")
            hook = self.call("POST", "/webhooks", json={
                "name": f"agentd {self.name}", "targetUrl": target, "resource": "messages",
                "event": "created", "secret": self.secret})
            self.webhook_id = str(hook.get("id") or "")
        except ChannelError:
            self.stop()
            raise

    def verify(self, request: Request) -> bool:
        return hmacs.check(self.secret, request.body, request.headers.get("x-spark-signature"), algorithm="sha1")

    def _inbound(self, request: Request) -> tuple[int, Any]:
        event = request.json()
        if not isinstance(event, dict) or not isinstance(event.get("data"), dict):
            raise ValueError("body must be a webhook event object")
        data = event["data"]
        if event.get("resource") != "messages" or event.get("event") != "created" \
                or not data.get("id") or data.get("personId") == self.me.get("id") or self.stopping.is_set():
            return 200, {}  # other events, our own messages, or stopping: nothing to answer
        # Reading the text is a call back to Webex: done on a thread so the webhook is
        # answered at once (Webex wants a quick 2xx). Finished readers are forgotten.
        self._threads = [t for t in self._threads if t.is_alive()]
        self.spawn(lambda: self._read(str(data["id"])), "read")
        return 200, {}

    def _read(self, message_id: str) -> None:
        message = self.call("GET", f"/messages/{quote(message_id, safe='')}")
        text = str(message.get("text") or "").strip()
        name = str(self.me.get("displayName") or "")
        if message.get("roomType") == "group" and name:
            # In a space the bot only sees messages that mention it; the text starts with
            # the mention (its display name, or just the first name).
            for prefix in (name, name.split()[0]):
                if text.startswith(prefix):
                    text = text[len(prefix):].lstrip(" ,:")
                    break
        files = self._attachments(message)
        if not text and not files:
            return
        person, room = str(message.get("personId") or ""), str(message.get("roomId") or "")
        conversation = Conversation(self.name, room, person, direct=message.get("roomType") == "direct")
        self.ctx.deliver(Inbound(conversation, sender_id=person, text=text, message_id=message_id,
                                 sender_aliases=(str(message.get("personEmail") or ""),), attachments=files))

    def _attachments(self, message: dict[str, Any]) -> list[Attachment]:
        auth = {"Authorization": f"Bearer {self.env('bot_token_env')}"}
        hosts, found = self.file_hosts(), []
        for n, url in enumerate(message.get("files") or []):
            if not isinstance(url, str):
                continue
            name, kind, size = f"file-{n + 1}", "", 0
            if allowed(url, hosts):  # what the file is: asked of Webex only, never of another host
                try:
                    head = self.http.request("HEAD", url, headers=auth, retries=1, allow_redirects=False).headers
                    disposition = Message()
                    disposition["Content-Disposition"] = head.get("Content-Disposition") or ""
                    name = disposition.get_filename() or name
                    kind, length = head.get("Content-Type") or "", head.get("Content-Length") or ""
                    size = int(length) if length.isdigit() else 0
                except ChannelError:
                    pass  # the download says what went wrong
            found.append(Attachment(name, kind, size, url, headers=auth))
        return found

    def file_hosts(self) -> set[str]:
        return {host_of(API_URL), host_of(str(self.settings.get("api_url") or API_URL))}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        answer = self.call("POST", "/messages", data={"roomId": conversation.chat_id},
                           files={"files": (filename, data, content_type)})
        return str(answer.get("id") or "")

    def send(self, conversation: Conversation, text: str) -> str:
        ids = []
        for part in self.reply_texts(text):
            answer = self.call("POST", "/messages", json={"roomId": conversation.chat_id, "markdown": part})
            ids.append(str(answer.get("id") or ""))
        return ",".join(ids)

    def test_target(self, override: str = "") -> Conversation:
        room = override or next(iter(self.settings.get("allowed_rooms") or []), "")
        if not room:
            raise ChannelError("no test target: set allowed_rooms or pass chat_id (a Webex room id)")
        return Conversation(self.name, room)

    def close(self) -> None:
        hook, self.webhook_id = self.webhook_id, ""
        if hook:  # best effort: Webex would otherwise keep calling a closed listener
            try:
                self.http.request("DELETE", self.api(f"/webhooks/{quote(hook, safe='')}"), retries=0, timeout=3,
                                  headers={"Authorization": f"Bearer {self.env('bot_token_env')}"})
            except ChannelError:
                pass
        super().close()
        self.http.close()


ADAPTER = WebexAdapter
