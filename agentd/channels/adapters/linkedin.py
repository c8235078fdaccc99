"""LinkedIn organization messaging over LinkedIn's versioned REST API (Rest.li 2.0,
OAuth2 Bearer, `LinkedIn-Version` header): polls
`GET /rest/messages?q=organization&organization=urn:li:organization:<id>&createdAfter=<ms>`
for messages people sent to the organization, and answers in the same thread with
`POST /rest/messages` {author, recipients, thread, body.text} (the new message's id
comes back in `x-restli-id`). LinkedIn grants organization messaging to approved
partners only; the wire shapes follow LinkedIn's Rest.li conventions."""

from __future__ import annotations

import time
from typing import Any

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.polling import PollingAdapter

API_VERSION = "202405"


class LinkedInAdapter(PollingAdapter):
    max_message_len = 8000
    text_format = "plain"

    def prepare(self) -> None:
        self.base = str(self.settings.get("api_url") or "https://api.linkedin.com").rstrip("/") + "/rest"
        org = str(self.settings.get("organization_id") or "")
        if not org:
            raise ChannelError("organization_id is not set")
        self.org = org if org.startswith("urn:li:organization:") else f"urn:li:organization:{org}"
        self.http.session.headers.update({"Authorization": f"Bearer {self.env('access_token_env')}",
                                          "LinkedIn-Version": API_VERSION, "X-Restli-Protocol-Version": "2.0.0"})
        self.poll_interval = float(self.settings.get("poll_interval_secs") or 15)

    def poll_once(self) -> None:
        since = self.state.get("since")
        if since is None:  # first start: only messages from now on
            self.save_cursor(since=int(time.time() * 1000) - 1000, seen=[])  # a second of slack
            return
        page = self.http.json("GET", f"{self.base}/messages", retries=0,
                              params={"q": "organization", "organization": self.org, "createdAfter": since})
        seen = list(self.state.get("seen") or [])
        for message in sorted(page.get("elements") or [], key=lambda m: m["createdAt"]):
            urn = str(message.get("entityUrn") or message.get("id"))
            if urn in seen:
                continue
            # Same-millisecond messages: keep the cursor at their time, remember their ids.
            seen = (seen + [urn])[-300:]
            self.save_cursor(since=max(int(since), int(message["createdAt"]) - 1), seen=seen)
            self._handle(message, urn)

    def _handle(self, message: dict[str, Any], urn: str) -> None:
        author = str(message.get("author") or "")
        text = str((message.get("body") or {}).get("text") or "")
        if not author or author == self.org or not text:
            return
        conversation = Conversation(self.name, str(message["thread"]), author, direct=True,
                                    meta={"thread": message["thread"]})
        self.ctx.deliver(Inbound(conversation, sender_id=author, text=text, message_id=urn,
                                 sender_name=str(message.get("authorName") or author),
                                 sender_aliases=(author.rsplit(":", 1)[-1],)))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        ids = []
        for part in self.reply_texts(text):
            body: dict[str, Any] = {"author": self.org, "recipients": [conversation.user_id or conversation.chat_id],
                                    "body": {"text": part}}
            if conversation.meta.get("thread"):
                body["thread"] = conversation.meta["thread"]
            response = self.http.request("POST", f"{self.base}/messages", json=body)
            ids.append(response.headers.get("x-restli-id", ""))
        return ",".join(ids)

    def test_target(self, override: str = "") -> Conversation:
        if not override.startswith("urn:li:person:"):
            raise ChannelError("no test target: pass chat_id, the member URN (urn:li:person:...) to message")
        return Conversation(self.name, override, override, direct=True)


ADAPTER = LinkedInAdapter
