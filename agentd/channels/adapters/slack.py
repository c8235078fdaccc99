"""Slack: Events API events over Socket Mode (`mode = "socket"`, the default) or over HTTP
(`mode = "events"`: the daemon's `/channels/slack/webhook`; `webhook_port` set also opens
an own listener and implies `events`), answered with the Web API's `chat.postMessage`.

Socket Mode (https://docs.slack.dev/apis/events-api/using-socket-mode/): `POST
apps.connections.open` with the app-level token (xapp-) gives a one-use WebSocket URL;
Slack says `hello`, then sends envelopes that must be acknowledged with their
`envelope_id`; a `disconnect` message (refresh_requested, warning...) means: open a new
URL and reconnect. Events API over HTTP: every request is signed (`X-Slack-Signature`,
v0 HMAC-SHA256 of `v0:{timestamp}:{body}` with the signing secret, timestamp within
5 minutes), checked before parsing; `url_verification` echoes the challenge.

Events: `message` in direct messages (channel_type im) and `app_mention` in channels
(answered in the message's thread while `auto_thread_reply`, or as `overrides.threading`
says); other channel `message` events are delivered as not addressed to the bot, answered
under `overrides.group_policy` respond / shared. A thread the bot answered in is followed
for `thread_ttl_hours` after its last message there: its later `message` events are
answered without a mention (while `auto_thread_reply`). Each thread is a conversation of
its own. An edited direct message (`message_changed`) is answered as a new one. Web API
calls answer HTTP 200 with `{"ok": false, "error": ...}` on failure, 429 + Retry-After
when rate limited.

Files: a message's `files` (subtype `file_share`) are fetched from `url_private_download`
with the bot token, only from files.slack.com (or the host of `api_url`); files go out
with `files.getUploadURLExternal`, a POST of the bytes to the upload URL and
`files.completeUploadExternal` into the conversation (and its thread).

Approvals are Block Kit messages with Approve/Reject buttons; a click arrives as a
`block_actions` interaction (an `interactive` envelope over Socket Mode, a signed
form-encoded `payload` at the request URL over HTTP, the daemon's
`/channels/slack/webhook` or the adapter's own listener); the request is then replaced by
its outcome (`chat.update`), a refusal goes to the clicker alone (`chat.postEphemeral`).
Reactions: `reactions.add` / `reactions.remove` (emoji by name). Slack has no typing
indicator for bots on the Web API (only the legacy RTM API had one).
"""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Any
from urllib.parse import parse_qs

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.conversation import reply_thread
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.sender import HttpSender
from agentd.channels.lifecycle import emoji_name
from agentd.channels.bases.webhook import Request, WebhookAdapter, within_window
from agentd.channels.bases.websocket import Reconnect, WebSocketAdapter


class SlackCommon:
    """What both inbound modes share: the bot's identity, events, chat.postMessage."""

    max_message_len = 4000  # Slack truncates at 40,000 and advises under 4,000
    text_format = "slack"
    settings: dict[str, Any]
    http: Any
    ctx: Any
    name: str
    env: Any

    def prepare_bot(self) -> None:
        self.api = str(self.settings.get("api_url") or "https://slack.com/api").rstrip("/")
        self.bot_token = self.env("bot_token_env")
        who = self.web("auth.test", self.bot_token, retries=1)
        self.bot_user, self.bot_id = str(who.get("user_id") or ""), str(who.get("bot_id") or "")
        self.seen: collections.deque[tuple[str, str]] = collections.deque(maxlen=500)
        # (channel, thread_ts) -> when the bot last answered there (monotonic seconds).
        self.followed: dict[tuple[str, str], float] = {}
        self.followed_lock = threading.Lock()

    def following(self, channel: str, thread: str) -> bool:
        """True while the bot answered in this thread within `thread_ttl_hours`."""
        ttl = float(self.settings.get("thread_ttl_hours") or 0) * 3600
        if not thread or not ttl or not self.settings.get("auto_thread_reply", True):
            return False
        now = time.monotonic()
        with self.followed_lock:
            for key in [k for k, at in self.followed.items() if now - at >= ttl]:
                del self.followed[key]
            return (channel, thread) in self.followed

    def follow(self, channel: str, thread: str) -> None:
        with self.followed_lock:
            self.followed[(channel, thread)] = time.monotonic()

    def web(self, method: str, token: str, retries: int | None = None, **body: Any) -> dict[str, Any]:
        """Call a Web API method; Slack reports errors as HTTP 200 with ok=false."""
        answer = self.http.json("POST", f"{self.api}/{method}", json=body, retries=retries,
                                headers={"Authorization": f"Bearer {token}"})
        if not isinstance(answer, dict) or not answer.get("ok"):
            error = answer.get("error") if isinstance(answer, dict) else "not a JSON object"
            raise ChannelError(f"slack {method}: {error}")
        return answer

    def handle_event(self, event: Any, team: str = "") -> None:
        if not isinstance(event, dict) or event.get("type") not in ("message", "app_mention"):
            return
        edited = event.get("subtype") == "message_changed" and event.get("channel_type") == "im"
        if edited:  # the new version of a direct message: its text, its author
            changed = event.get("message") or {}
            before = (event.get("previous_message") or {}).get("text")
            if not isinstance(changed, dict) or changed.get("text") == before:
                return  # an unfurl or other non-text change
            event = {**changed, "type": "message", "channel": event.get("channel"), "channel_type": "im",
                     "ts": f"{changed.get('ts')}:edit:{changed.get('edited', {}).get('ts', event.get('ts'))}"}
        user, channel, ts = str(event.get("user") or ""), str(event.get("channel") or ""), str(event.get("ts") or "")
        if event.get("subtype") not in (None, "", "file_share") or event.get("bot_id") or not user \
                or user == self.bot_user:
            return  # edits, joins, bots (ourselves included)
        direct = event.get("channel_type") == "im"
        existing = str(event.get("thread_ts") or "")
        if (channel, ts) in self.seen:
            return  # the same message as `message` and `app_mention`, or a retried delivery
        self.seen.append((channel, ts))
        raw = str(event.get("text") or "")
        mention = f"<@{self.bot_user}>"
        text = raw.replace(mention, "").strip()
        files = self._attachments(event.get("files"))
        if not text and not files:
            return
        first = ts.split(":edit:", 1)[0]  # an edit's id names the message it changed
        thread = reply_thread(self.settings, existing, first, direct,
                              default=bool(self.settings.get("auto_thread_reply", True)))
        conversation = Conversation(self.name, channel, user, direct=direct, meta={"thread_ts": thread},
                                    thread_id=thread)
        mentioned = event["type"] == "app_mention" or mention in raw
        self.ctx.deliver(Inbound(conversation, sender_id=user, text=text, message_id=first, edited=edited,
                                 chat_aliases=(team,) if team else (), mentioned=mentioned,
                                 addressed=direct or mentioned or self.following(channel, existing),
                                 attachments=files))

    def _attachments(self, files: Any) -> list[Attachment]:
        auth = {"Authorization": f"Bearer {self.bot_token}"}
        return [Attachment(str(f.get("name") or f.get("title") or f.get("id") or "file"), str(f.get("mimetype") or ""),
                           int(f.get("size") or 0), str(f.get("url_private_download") or f.get("url_private") or ""),
                           headers=auth)
                for f in files or [] if isinstance(f, dict) and (f.get("url_private_download") or f.get("url_private"))]

    def file_hosts(self) -> set[str]:
        hosts = {"files.slack.com"}
        if self.settings.get("api_url"):  # a Slack-compatible server hosts its own files
            hosts.add(host_of(str(self.settings["api_url"])))
        return hosts

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "api"):
            self.prepare_bot()
        auth = {"Authorization": f"Bearer {self.bot_token}"}
        # The files.* upload methods take form fields, not JSON.
        ticket = self._form("files.getUploadURLExternal", filename=filename, length=str(len(data)))
        self.http.request("POST", str(ticket["upload_url"]), files={"file": (filename, data, content_type)},
                          headers=auth)
        fields = {"files": json.dumps([{"id": ticket["file_id"], "title": filename}]),
                  "channel_id": conversation.chat_id}
        if conversation.meta.get("thread_ts"):
            fields["thread_ts"] = conversation.meta["thread_ts"]
        self._form("files.completeUploadExternal", **fields)
        return str(ticket["file_id"])

    def _form(self, method: str, **fields: str) -> dict[str, Any]:
        answer = self.http.json("POST", f"{self.api}/{method}", data=fields,
                                headers={"Authorization": f"Bearer {self.bot_token}"})
        if not isinstance(answer, dict) or not answer.get("ok"):
            raise ChannelError(f"slack {method}: {answer.get('error') if isinstance(answer, dict) else answer}")
        return answer

    def handle_interaction(self, payload: Any) -> None:
        """A click on an approval's button (`block_actions`)."""
        if not isinstance(payload, dict) or payload.get("type") != "block_actions":
            return
        action = next(iter(payload.get("actions") or []), {})
        user = str((payload.get("user") or {}).get("id") or "")
        channel = str((payload.get("channel") or {}).get("id") or (payload.get("container") or {}).get("channel_id")
                      or "")
        message = payload.get("message") or {}
        if action.get("action_id") not in ("approve", "reject") or not user or not channel:
            return
        thread = str(message.get("thread_ts") or "")
        conversation = Conversation(self.name, channel, user, direct=channel.startswith("D"),
                                    meta={"thread_ts": thread}, thread_id=thread)
        self.ctx.deliver(Inbound(conversation, sender_id=user, text=f"/{action['action_id']} {action.get('value')}",
                                 message_id=str(message.get("ts") or ""),
                                 sender_name=f"<@{user}>",  # Slack shows the person's name
                                 interaction={"channel": channel, "ts": str(message.get("ts") or ""), "user": user,
                                              "thread_ts": str(message.get("thread_ts") or "")}))

    def send_approval(self, conversation: Conversation, approval_id: str, text: str) -> str:
        if not hasattr(self, "api"):
            self.prepare_bot()
        buttons = [{"type": "button", "action_id": verb, "value": approval_id, "style": style,
                    "text": {"type": "plain_text", "text": label}}
                   for verb, label, style in (("approve", "Approve", "primary"), ("reject", "Reject", "danger"))]
        body: dict[str, Any] = {"channel": conversation.chat_id, "text": text[:3000],
                                "blocks": [{"type": "section", "text": {"type": "plain_text", "text": text[:3000]}},
                                           {"type": "actions", "block_id": f"approval-{approval_id}",
                                            "elements": buttons}]}
        if conversation.meta.get("thread_ts"):
            body["thread_ts"] = conversation.meta["thread_ts"]
        return str(self.web("chat.postMessage", self.bot_token, **body).get("ts", ""))

    def settle_approval(self, conversation: Conversation, request_id: str, text: str) -> None:
        self.web("chat.update", self.bot_token, channel=conversation.chat_id, ts=request_id, text=text, blocks=[])

    def answer_interaction(self, msg: Inbound, text: str, final: bool) -> bool:
        click = msg.interaction
        if final:  # the request becomes its outcome, its buttons gone
            self.web("chat.update", self.bot_token, channel=click["channel"], ts=click["ts"], text=text, blocks=[])
        else:
            body = {"channel": click["channel"], "user": click["user"], "text": text}
            if click.get("thread_ts"):
                body["thread_ts"] = click["thread_ts"]
            self.web("chat.postEphemeral", self.bot_token, **body)
        return True

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.web("reactions.add", self.bot_token, retries=0, channel=conversation.chat_id, timestamp=message_id,
                 name=emoji_name(emoji))

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        self.web("reactions.remove", self.bot_token, retries=0, channel=conversation.chat_id, timestamp=message_id,
                 name=emoji_name(emoji))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "api"):
            self.prepare_bot()
        ids = []
        for part in self.format_reply(text):
            body: dict[str, Any] = {"channel": conversation.chat_id, "text": part.text,
                                    "mrkdwn": part.format == "slack",
                                    "unfurl_links": bool(self.settings.get("unfurl_links", True))}
            if conversation.meta.get("thread_ts"):
                body["thread_ts"] = conversation.meta["thread_ts"]
            ids.append(str(self.web("chat.postMessage", self.bot_token, **body).get("ts", "")))
        if conversation.meta.get("thread_ts") and not conversation.direct:
            self.follow(conversation.chat_id, conversation.meta["thread_ts"])
        return ",".join(ids)

    def test_target(self, override: str = "") -> Conversation:
        target = override or next(iter(self.settings.get("allowed_channels") or []), "")
        if not target:
            raise ChannelError("no test target: pass chat_id (a Slack channel id) or set allowed_channels")
        return Conversation(self.name, target)


class SlackSocketAdapter(SlackCommon, WebSocketAdapter):
    def prepare(self) -> None:
        self.prepare_bot()
        self.app_token = self.env("app_token_env")
        self.ready = False
        # The first URL now: a bad app token fails the start instead of a reconnect loop.
        self.next_url = self.open_url()

    def open_url(self) -> str:
        return str(self.web("apps.connections.open", self.app_token, retries=1)["url"])

    def ws_url(self) -> str:
        # Each connection needs a fresh one-use URL.
        url, self.next_url = self.next_url, ""
        return url or self.open_url()

    def on_open(self) -> None:
        self.ready = False

    def health(self) -> bool:
        return self.healthy and self.ready

    def on_message(self, data: Any) -> None:
        if not isinstance(data, dict):
            return
        if data.get("envelope_id"):  # acknowledge first: Slack redelivers what is not acked
            self.ws_send({"envelope_id": data["envelope_id"]})
        kind = data.get("type")
        if kind == "hello":
            self.ready = True
        elif kind == "disconnect":
            raise Reconnect(f"slack asked to reconnect ({data.get('reason')})")
        elif kind == "events_api":
            payload = data.get("payload") or {}
            self.handle_event(payload.get("event"), str(payload.get("team_id") or ""))
        elif kind == "interactive":
            self.handle_interaction(data.get("payload"))


class SlackEventsAdapter(SlackCommon, WebhookAdapter):
    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)

    def listen_port(self) -> int:
        return int(self.settings["webhook_port"])

    def prepare(self) -> None:
        self.env("signing_secret_env")
        self.prepare_bot()

    def verify(self, request: Request) -> bool:
        secret = self.env("signing_secret_env", required=False)
        stamp = request.headers.get("x-slack-request-timestamp") or ""
        return within_window(stamp, 300) and hmacs.check(
            secret, b"v0:" + stamp.encode() + b":" + request.body, request.headers.get("x-slack-signature"),
            prefix="v0=")

    def _inbound(self, request: Request) -> tuple[int, Any]:
        if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            # Interactivity (a button click): the JSON is the form's `payload` field.
            form = parse_qs(request.body.decode("utf-8"))
            self.handle_interaction(json.loads((form.get("payload") or ["{}"])[0]))
            return 200, {}
        data = request.json()
        if not isinstance(data, dict):
            raise ValueError("body must be a JSON object")
        if data.get("type") == "url_verification":
            return 200, {"challenge": str(data.get("challenge") or "")}
        if data.get("type") == "event_callback":
            self.handle_event(data.get("event"), str(data.get("team_id") or ""))
        return 200, {}

    def close(self) -> None:
        super().close()
        self.http.close()


def ADAPTER(ctx, settings):  # type: ignore[no-untyped-def] # noqa: N802 - the registry's name
    """Socket Mode unless `mode = "events"` (or a `webhook_port`) asks for the Events API over HTTP."""
    events = settings.get("mode") == "events" or settings.get("webhook_port")
    return (SlackEventsAdapter if events else SlackSocketAdapter)(ctx, settings)
