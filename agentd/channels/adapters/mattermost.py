"""Mattermost API v4: `posted` events from the WebSocket (`/api/v4/websocket`,
authentication_challenge with the personal access token), replies with
`POST /api/v4/posts` (threaded under the post's root), typing over the socket, reactions
with `POST /api/v4/reactions` (emoji by name) and taken back with
`DELETE /api/v4/users/{user}/posts/{post}/reactions/{name}`.

A thread (a post's `root_id`) is a conversation of its own; a channel post starts a thread
under it unless `overrides.threading` is false. The bot counts as mentioned when the event's
`mentions` names it or the text has `@<bot username>` (removed from the text).

Files: a post's `metadata.files` are fetched with `GET /api/v4/files/{id}` from the
configured server only (with the token); files go out with `POST /api/v4/files`
(multipart, `channel_id` and `files`) and a post carrying the new `file_ids`.

Approvals: with `webhook_url` set (the public address of the daemon's
`/channels/mattermost/webhook`), the request carries interactive message buttons
(`props.attachments[].actions[]`, each with `integration.url` and `integration.context`).
Mattermost POSTs a press to that URL from its server, unsigned: the context carries an HMAC
of the approval under a key derived from the bot token, checked before anything is done
(Mattermost never shows an action's integration to clients). The press is answered with the
`update` that replaces the request by its outcome (`props` emptied: the buttons go), or an
`ephemeral_text` for the presser alone; a decision taken elsewhere patches the post
(`PUT /api/v4/posts/{id}/patch`). Without `webhook_url` the answer is typed (`!approve <id>`:
`/approve` is taken by Mattermost's own commands)."""

from __future__ import annotations

import json
import threading
from typing import Any

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.webhook import Request, WebhookAdapter
from agentd.channels.bases.websocket import WebSocketAdapter
from agentd.channels.lifecycle import emoji_name
from agentd.channels.conversation import reply_thread


# Seconds a press waits for its decision, to answer it in Mattermost's own response
# (Mattermost waits up to its OutgoingIntegrationRequestsTimeout, 30 s by default).
PRESS_WAIT = 10.0
# Whatever the key's use elsewhere, the button tokens are MACs under a key of their own.
BUTTON_KEY_LABEL = b"agentd mattermost approval buttons v1"
CONTEXT_FIELDS = ("action", "approval_id", "root_id")


class Press:
    """A button press waiting, in the webhook's request, for the answer to send back."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.expired = False
        self.text, self.final = "", False

    def give(self, text: str, final: bool) -> bool:
        """Hand the answer to the waiting request; False once it stopped waiting."""
        with self.lock:
            if self.expired:
                return False
            self.text, self.final = text, final
            self.done.set()
            return True

    def wait(self, timeout: float) -> bool:
        self.done.wait(timeout)
        with self.lock:
            self.expired = True
            return self.done.is_set()


class MattermostAdapter(WebSocketAdapter, WebhookAdapter):
    """Events from the WebSocket; approval button presses at `/channels/mattermost/webhook`
    (the webhook base's route only: no listener of its own)."""

    max_message_len = 16_383

    def prepare(self) -> None:
        self.base = str(self.settings.get("server_url") or "").rstrip("/")
        if not self.base:
            raise ChannelError("server_url is not set")
        self.token = self.env("token_env")
        self.http.session.headers["Authorization"] = f"Bearer {self.token}"
        me = self.http.json("GET", f"{self.base}/api/v4/users/me", retries=1)
        self.user_id, self.username = me["id"], me.get("username", "")
        self.seq = 0

    def ws_url(self) -> str:
        return self.base.replace("http", "ws", 1) + "/api/v4/websocket"

    def ws_headers(self) -> list[str]:
        return [f"Authorization: Bearer {self.token}"]

    def on_open(self) -> None:
        self.seq += 1
        self.ws_send({"seq": self.seq, "action": "authentication_challenge", "data": {"token": self.token}})

    def on_message(self, data: Any) -> None:
        if not isinstance(data, dict) or data.get("event") != "posted":
            return
        event = data.get("data") or {}
        try:
            post = json.loads(event.get("post") or "{}")
        except ValueError:
            return
        files = [Attachment(str(f.get("name") or f.get("id")), str(f.get("mime_type") or ""), int(f.get("size") or 0),
                            f"{self.base}/api/v4/files/{f['id']}", headers={"Authorization": f"Bearer {self.token}"})
                 for f in (post.get("metadata") or {}).get("files") or [] if isinstance(f, dict) and f.get("id")]
        if post.get("user_id") == self.user_id or not (post.get("message") or files) or post.get("type"):
            return  # our own posts and system messages
        direct = event.get("channel_type") == "D"
        user_id = str(post["user_id"])
        thread = reply_thread(self.settings, str(post.get("root_id") or ""), str(post.get("id") or ""),
                              direct, default=True)
        try:
            mentions = json.loads(event.get("mentions") or "[]")
        except ValueError:
            mentions = []
        text, handle = str(post["message"]), f"@{self.username}"
        mentioned = self.user_id in (mentions if isinstance(mentions, list) else []) or handle in text.split()
        if self.username:
            text = " ".join(w for w in text.split(" ") if w != handle).strip() or text
        conversation = Conversation(self.name, str(post["channel_id"]), user_id, direct=direct,
                                    meta={"root_id": thread}, thread_id=thread)
        sender_name = str(event.get("sender_name") or "").lstrip("@")
        self.ctx.deliver(Inbound(conversation, sender_id=user_id, text=text,
                                 message_id=str(post.get("id", "")), sender_name=sender_name,
                                 sender_aliases=(sender_name,) if sender_name else (), mentioned=mentioned, attachments=files))

    # -- approval buttons ---------------------------------------------------------------
    def button_token(self, context: dict[str, Any]) -> str:
        key = hmacs.digest(self.env("token_env"), BUTTON_KEY_LABEL)
        # Field by field, not the JSON as sent: Mattermost may reorder the context's keys.
        return hmacs.hex_digest(key, "\n".join(str(context.get(k) or "") for k in CONTEXT_FIELDS))

    def send_approval(self, conversation: Conversation, approval_id: str, text: str) -> str:
        url = str(self.settings.get("webhook_url") or "")
        if not url:  # nowhere for Mattermost to send a press: typed answers
            return super().send_approval(conversation, approval_id, text)
        if not hasattr(self, "base"):
            self.prepare()
        actions = []
        for verb, label, style in (("approve", "Approve", "success"), ("reject", "Reject", "danger")):
            context = {"action": verb, "approval_id": approval_id, "root_id": conversation.meta.get("root_id") or ""}
            context["token"] = self.button_token(context)
            # Action ids are letters and digits only: Mattermost's action route takes nothing else.
            actions.append({"id": verb, "type": "button", "name": label, "style": style,
                            "integration": {"url": url, "context": context}})
        body = {"channel_id": conversation.chat_id, "message": text[:self.max_message_len],
                "props": {"attachments": [{"fallback": f"Approve or reject approval {approval_id}",
                                           "actions": actions}]}}
        if conversation.meta.get("root_id"):
            body["root_id"] = conversation.meta["root_id"]
        return str(self.http.json("POST", f"{self.base}/api/v4/posts", json=body).get("id", ""))

    def settle_approval(self, conversation: Conversation, request_id: str, text: str) -> None:
        # The request becomes its outcome; empty props take the buttons away.
        self.http.request("PUT", f"{self.base}/api/v4/posts/{request_id}/patch",
                          json={"message": text, "props": {}})

    def answer_interaction(self, msg: Inbound, text: str, final: bool) -> bool:
        press = msg.interaction.get("press")
        if isinstance(press, Press) and press.give(text, final):
            return True  # said in the answer to Mattermost's request
        if final and msg.interaction.get("post_id"):
            self.settle_approval(msg.conversation, str(msg.interaction["post_id"]), text)
            return True
        return False

    def _inbound(self, request: Request) -> tuple[int, Any]:
        """A press of an approval's button, POSTed by the Mattermost server."""
        data = request.json()
        if not isinstance(data, dict):
            raise ValueError("body must be a JSON object")
        context = data.get("context") if isinstance(data.get("context"), dict) else {}
        verb, approval_id = str(context.get("action") or ""), str(context.get("approval_id") or "")
        if verb not in ("approve", "reject") or not approval_id or \
                not hmacs.same(str(context.get("token") or ""), self.button_token(context)):
            self.ctx.audit("refused", reason="approval button with a forged or stale context",
                           user=str(data.get("user_id") or "")[:64])
            return 401, {"error": "invalid approval button context"}
        user, channel = str(data.get("user_id") or ""), str(data.get("channel_id") or "")
        if not user or not channel:
            raise ValueError("user_id and channel_id are required")
        root = str(context.get("root_id") or "")
        press = Press()
        conversation = Conversation(self.name, channel, user, meta={"root_id": root}, thread_id=root)
        name = str(data.get("user_name") or "")
        self.ctx.deliver(Inbound(conversation, sender_id=user, text=f"/{verb} {approval_id}",
                                 message_id=str(data.get("post_id") or ""), sender_name=name or user,
                                 sender_aliases=(name,) if name else (),
                                 interaction={"press": press, "post_id": str(data.get("post_id") or "")}))
        if not press.wait(PRESS_WAIT):
            return 200, {}  # answered later through the REST API
        if press.final:
            return 200, {"update": {"message": press.text, "props": {}}}
        return 200, {"ephemeral_text": press.text}

    def file_hosts(self) -> set[str]:
        return {host_of(str(self.settings.get("server_url") or ""))}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        uploaded = self.http.json("POST", f"{self.base}/api/v4/files", data={"channel_id": conversation.chat_id},
                                  files={"files": (filename, data, content_type)})
        body = {"channel_id": conversation.chat_id, "message": "",
                "file_ids": [info["id"] for info in uploaded.get("file_infos") or []]}
        if conversation.meta.get("root_id"):
            body["root_id"] = conversation.meta["root_id"]
        return str(self.http.json("POST", f"{self.base}/api/v4/posts", json=body).get("id", ""))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        ids = []
        for part in self.reply_texts(text):
            body = {"channel_id": conversation.chat_id, "message": part}
            if conversation.meta.get("root_id"):
                body["root_id"] = conversation.meta["root_id"]
            ids.append(str(self.http.json("POST", f"{self.base}/api/v4/posts", json=body).get("id", "")))
        return ",".join(ids)

    def send_typing(self, conversation: Conversation) -> None:
        self.seq += 1
        self.ws_send({"seq": self.seq, "action": "user_typing", "data": {"channel_id": conversation.chat_id}})

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.http.request("POST", f"{self.base}/api/v4/reactions", retries=0, json={
            "user_id": self.user_id, "post_id": message_id, "emoji_name": emoji_name(emoji)})

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.http.request("DELETE", f"{self.base}/api/v4/users/{self.user_id}/posts/{message_id}/reactions/"
                          f"{emoji_name(emoji)}", retries=0)

    def test_target(self, override: str = "") -> Conversation:
        target = override or str(self.settings.get("default_channel_id") or "") or next(
            iter(self.settings.get("allowed_channels") or []), "")
        if not target:
            raise ChannelError("no test target: set default_channel_id or pass channel_id")
        return Conversation(self.name, target)


ADAPTER = MattermostAdapter
