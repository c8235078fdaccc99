"""A fake Slack, written from Slack's documentation (Web API methods apps.connections.open,
auth.test, chat.postMessage; "Using Socket Mode"; the Events API's event_callback and
url_verification; "Verifying requests from Slack").

Web API under `/api/<method>` (POST, `Authorization: Bearer`): errors are HTTP 200 with
`{"ok": false, "error": ...}` (invalid_auth, not_allowed_token_type, channel_not_found,
msg_too_long); a scripted 429 has Retry-After and `{"ok": false, "error": "ratelimited"}`.
`apps.connections.open` (app token, xapp-) returns a one-use `wss` URL with a ticket.

Socket Mode on `/link/`: `hello`, then `events_api` envelopes; acknowledgements
(`{"envelope_id": ...}`) are recorded and an envelope not acknowledged is delivered again
on the next connection (retry_attempt + 1); `disconnect()` sends a disconnect message.
When `webhook` is set, events go to that URL as signed Events API requests instead.
A channel message that mentions the bot arrives twice, as `message` and `app_mention`;
the bot's own posts come back as `message` events with its bot_id, as on Slack.

Interactivity ("Handling user interaction"): `chat.postMessage` keeps Block Kit `blocks`;
`user_clicks()` sends a `block_actions` payload (an `interactive` envelope over Socket
Mode, or a signed form-encoded `payload=` request in HTTP mode); `chat.update` replaces a
message (`updates`), `chat.postEphemeral` shows one user a message (`ephemeral`).
`reactions.add` / `reactions.remove` take an emoji name (`invalid_name` for one that is
not, `already_reacted`, `no_reaction`). `user_edits()` sends a `message_changed` event.

Files ("Working with files", files.getUploadURLExternal, files.completeUploadExternal): a
shared file arrives as a `file_share` message whose `files` carry `url_private_download`
on this server (`/files-pri/...`, served only with the bot token); uploads are form
fields, the bytes go to the one-use `upload_url`, and the completed files are recorded
in `shared` with their channel and thread.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import re
import time
import uuid
from typing import Any
from urllib.parse import urlencode

import requests
from flask import jsonify, request
from simple_websocket import ConnectionClosed

from fakes.gateway import FakeGateway

TEAM, APP, BOT_USER, BOT_ID = "T0FAKE", "A0FAKE", "U0BOT", "B0BOT"


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 signature, computed the way its docs describe (independently of agentd)."""
    return "v0=" + hmac.new(secret.encode(), f"v0:{timestamp}:".encode() + body, hashlib.sha256).hexdigest()


class FakeSlack(FakeGateway):
    text_key = "text"

    def __init__(self, app_token: str, bot_token: str, signing_secret: str = "") -> None:
        super().__init__("slack")
        self.app_token, self.bot_token, self.signing_secret = app_token, bot_token, signing_secret
        self.webhook = ""                          # Events API request URL (HTTP mode)
        self.envelopes: list[dict[str, Any]] = []
        self.said: list[dict[str, Any]] = []       # what users wrote (ts, channel, text...)
        self.acked: list[str] = []
        self.tickets: list[str] = []
        self.used: set[str] = set()
        self.deliveries: list[requests.Response] = []
        self.clock = itertools.count(1)
        self.updates: list[dict[str, Any]] = []     # chat.update calls
        self.ephemeral: list[dict[str, Any]] = []   # chat.postEphemeral calls
        self.reactions: dict[tuple[str, str], list[str]] = {}  # (channel, ts) -> the bot's reaction names
        self.hosted: dict[str, bytes] = {}          # file id -> bytes served under /files-pri/
        self.downloads: list[str] = []
        self.pending: dict[str, dict[str, Any]] = {}  # upload tickets: file id -> filename, length, bytes
        self.shared: list[dict[str, Any]] = []      # completed uploads
        app, sock = self.app, self.sock

        @app.get("/files-pri/<team>-<file_id>/download/<name>")
        def file_private(team: str, file_id: str, name: str):
            if token() != self.bot_token:  # Slack answers an HTML login page; the bytes never leak
                return "<html>sign in</html>", 302, {"Location": "https://slack.com/signin"}
            self.downloads.append(file_id)
            if file_id not in self.hosted:
                return "not found", 404
            return self.hosted[file_id], 200, {"Content-Type": "application/octet-stream"}

        @app.post("/api/files.getUploadURLExternal")
        def get_upload_url():
            if token() != self.bot_token:
                return jsonify({"ok": False, "error": "invalid_auth"})
            if request.is_json:
                return jsonify({"ok": False, "error": "invalid_arguments"})  # form fields only
            filename, length = request.form.get("filename") or "", request.form.get("length") or ""
            if not filename or not length.isdigit():
                return jsonify({"ok": False, "error": "invalid_arguments"})
            file_id = f"F{len(self.pending) + 1:08d}"
            self.pending[file_id] = {"filename": filename, "length": int(length), "data": None}
            return jsonify({"ok": True, "upload_url": f"{self.url}/upload/v1/{file_id}", "file_id": file_id})

        @app.post("/upload/v1/<file_id>")
        def upload(file_id: str):
            ticket = self.pending.get(file_id)
            if ticket is None or ticket["data"] is not None:
                return "invalid upload", 404
            sent = request.files.get("file")
            ticket["data"] = sent.read() if sent is not None else request.get_data()
            ticket["content_type"] = sent.mimetype if sent is not None else request.content_type
            return f"OK - {len(ticket['data'])}", 200

        @app.post("/api/files.completeUploadExternal")
        def complete_upload():
            if token() != self.bot_token:
                return jsonify({"ok": False, "error": "invalid_auth"})
            files = json.loads(request.form.get("files") or "[]")
            done = []
            for item in files:
                ticket = self.pending.get(item.get("id"))
                if ticket is None or ticket["data"] is None or len(ticket["data"]) != ticket["length"]:
                    return jsonify({"ok": False, "error": "file_upload_size_mismatch"})
                self.shared.append({"id": item["id"], "title": item.get("title"), "filename": ticket["filename"],
                                    "content_type": ticket["content_type"], "data": ticket["data"],
                                    "channel": request.form.get("channel_id"),
                                    "thread_ts": request.form.get("thread_ts")})
                done.append({"id": item["id"], "title": item.get("title")})
            return jsonify({"ok": True, "files": done})

        def token() -> str:
            return request.headers.get("Authorization", "").removeprefix("Bearer ")

        @app.post("/api/apps.connections.open")
        def connections_open():
            if token() != self.app_token:
                return jsonify({"ok": False, "error": "invalid_auth" if not token().startswith("xoxb-")
                                else "not_allowed_token_type"})
            ticket = f"ticket-{len(self.tickets) + 1}"
            self.tickets.append(ticket)
            self.polled()
            return jsonify({"ok": True, "url": self.url.replace("http", "ws", 1) + f"/link/?ticket={ticket}"
                            f"&app_id={APP}"})

        @app.post("/api/auth.test")
        def auth_test():
            if token() != self.bot_token:
                return jsonify({"ok": False, "error": "invalid_auth"})
            return jsonify({"ok": True, "url": "https://fake.slack.com/", "team": "Fake", "user": "agentbot",
                            "team_id": TEAM, "user_id": BOT_USER, "bot_id": BOT_ID, "is_enterprise_install": False})

        @app.post("/api/chat.postMessage")
        def post_message():
            limited = self.throttled({"ok": False, "error": "ratelimited"})
            if limited is not None:
                return limited
            if token() != self.bot_token:
                return jsonify({"ok": False, "error": "invalid_auth"})
            body = request.get_json()
            channel, text = body.get("channel") or "", body.get("text") or ""
            if not (channel.startswith("C") or channel.startswith("D")):
                return jsonify({"ok": False, "error": "channel_not_found"})
            if len(text) > 40000:
                return jsonify({"ok": False, "error": "msg_too_long"})
            ts = self.ts()
            message = {"type": "message", "text": text, "user": BOT_USER, "bot_id": BOT_ID, "ts": ts,
                       **({"thread_ts": body["thread_ts"]} if body.get("thread_ts") else {})}
            self.record(channel=channel, text=text, thread_ts=body.get("thread_ts"),
                        unfurl_links=body.get("unfurl_links"), ts=ts, mrkdwn=body.get("mrkdwn", True),
                        **({"blocks": body["blocks"]} if body.get("blocks") else {}))
            self.event({**message, "channel": channel, "channel_type": "im" if channel.startswith("D") else "channel"})
            return jsonify({"ok": True, "channel": channel, "ts": ts, "message": message})

        @app.post("/api/chat.update")
        def chat_update():
            if token() != self.bot_token:
                return jsonify({"ok": False, "error": "invalid_auth"})
            body = request.get_json()
            message = next((m for m in self.sent if m["channel"] == body.get("channel") and m["ts"] == body.get("ts")),
                           None)
            if message is None:
                return jsonify({"ok": False, "error": "message_not_found"})
            message["text"] = body.get("text") or message["text"]
            if "blocks" in body:
                message["blocks"] = body["blocks"]
            self.updates.append(dict(body))
            return jsonify({"ok": True, "channel": body["channel"], "ts": body["ts"], "text": message["text"]})

        @app.post("/api/chat.postEphemeral")
        def post_ephemeral():
            if token() != self.bot_token:
                return jsonify({"ok": False, "error": "invalid_auth"})
            body = request.get_json()
            if not body.get("user"):
                return jsonify({"ok": False, "error": "user_not_in_channel"})
            self.ephemeral.append(dict(body))
            return jsonify({"ok": True, "message_ts": self.ts()})

        @app.post("/api/reactions.add")
        @app.post("/api/reactions.remove")
        def reactions():
            if token() != self.bot_token:
                return jsonify({"ok": False, "error": "invalid_auth"})
            body = request.get_json()
            name = str(body.get("name") or "")
            if not re.fullmatch(r"[a-z0-9_+'-]+", name):
                return jsonify({"ok": False, "error": "invalid_name"})
            mine = self.reactions.setdefault((body.get("channel"), body.get("timestamp")), [])
            if request.path.endswith("add"):
                if name in mine:
                    return jsonify({"ok": False, "error": "already_reacted"})
                mine.append(name)
            else:
                if name not in mine:
                    return jsonify({"ok": False, "error": "no_reaction"})
                mine.remove(name)
            return jsonify({"ok": True})

        @sock.route("/link/", endpoint="link")
        def link(ws):
            ticket = request.args.get("ticket", "")
            if ticket not in self.tickets or ticket in self.used:
                ws.close(1008, "invalid ticket")
                return
            self.used.add(ticket)
            self._serve(ws)

    def ts(self) -> str:
        return f"{int(time.time())}.{next(self.clock):06d}"

    def _serve(self, ws: Any) -> None:
        self.socks.append(ws)
        ws.send(json.dumps({"type": "hello", "num_connections": 1, "connection_info": {"app_id": APP},
                            "debug_info": {"host": "applink-fake", "build_number": 1,
                                           "approximate_connection_time": 18060}}))
        sent: set[str] = set()
        try:
            while True:
                raw = ws.receive(timeout=0.05)
                if raw is not None:
                    frame = json.loads(raw)
                    if frame.get("envelope_id"):
                        self.acked.append(frame["envelope_id"])
                for envelope in list(self.envelopes):
                    eid = envelope["envelope_id"]
                    if eid not in sent and eid not in self.acked:
                        if envelope.get("_delivered"):  # a redelivery of an unacknowledged envelope
                            envelope["retry_attempt"] += 1
                            envelope["retry_reason"] = "timeout"
                        envelope["_delivered"] = True
                        ws.send(json.dumps({k: v for k, v in envelope.items() if not k.startswith("_")}))
                        sent.add(eid)
        except (ConnectionClosed, OSError):
            return

    def event(self, event: dict[str, Any]) -> None:
        """Deliver one event: an envelope over Socket Mode, or a signed request (HTTP mode)."""
        callback = {"token": "legacy-verification-token", "team_id": TEAM, "api_app_id": APP,
                    "event": {**event, "event_ts": event.get("ts")}, "type": "event_callback",
                    "event_id": f"Ev{len(self.envelopes) + 1:08d}", "event_time": int(time.time()),
                    "authorizations": [{"team_id": TEAM, "user_id": BOT_USER, "is_bot": True}]}
        if self.webhook:
            self.deliveries.append(self.post_signed(json.dumps(callback).encode()))
            return
        with self.lock:
            self.envelopes.append({"envelope_id": f"env-{len(self.envelopes) + 1}", "payload": callback,
                                   "type": "events_api", "accepts_response_payload": False,
                                   "retry_attempt": 0, "retry_reason": ""})

    def post_signed(self, body: bytes, timestamp: str = "", signature: str | None = None) -> requests.Response:
        timestamp = timestamp or str(int(time.time()))
        headers = {"Content-Type": "application/json", "X-Slack-Request-Timestamp": timestamp,
                   "X-Slack-Signature": sign(self.signing_secret, timestamp, body) if signature is None else signature}
        return requests.post(self.webhook, data=body, headers=headers, timeout=5)

    def user_says(self, user: str, text: str, channel: str = "", mention: bool = False,
                  thread_ts: str = "") -> str:
        """User `user` (a Slack user id) writes in their DM with the bot unless `channel`;
        returns the channel."""
        channel = channel or f"D{user}"
        ts = self.ts()
        base = {"user": user, "ts": ts, "channel": channel, "team": TEAM,
                **({"thread_ts": thread_ts} if thread_ts else {})}
        body = f"<@{BOT_USER}> {text}" if mention else text
        self.said.append({**base, "text": body})
        direct = channel.startswith("D")
        self.event({"type": "message", "text": body, "channel_type": "im" if direct else "channel", **base})
        if mention and not direct:
            self.event({"type": "app_mention", "text": body, **base})
        return channel

    def user_clicks(self, user: str, message: dict[str, Any], action_id: str) -> None:
        """User `user` clicks the button `action_id` of the bot's `message` (one of `sent`)."""
        action = next(e for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]
                      if e["action_id"] == action_id)
        payload = {"type": "block_actions", "team": {"id": TEAM, "domain": "fake"},
                   "user": {"id": user, "username": user.lower(), "team_id": TEAM},
                   "api_app_id": APP, "token": "legacy-verification-token", "trigger_id": f"trig.{self.ts()}",
                   "container": {"type": "message", "message_ts": message["ts"], "channel_id": message["channel"],
                                 "is_ephemeral": False},
                   "channel": {"id": message["channel"], "name": "channel"},
                   "message": {"type": "message", "user": BOT_USER, "bot_id": BOT_ID, "ts": message["ts"],
                               "text": message["text"], "blocks": message["blocks"],
                               **({"thread_ts": message["thread_ts"]} if message.get("thread_ts") else {})},
                   "response_url": f"{self.url}/actions/{message['ts']}",
                   "actions": [{"type": "button", "action_id": action_id, "block_id": next(
                       b["block_id"] for b in message["blocks"] if b["type"] == "actions"),
                       "value": action["value"], "text": action["text"], "style": action.get("style"),
                       "action_ts": self.ts()}]}
        if self.webhook:
            body = urlencode({"payload": json.dumps(payload)}).encode()
            timestamp = str(int(time.time()))
            self.deliveries.append(requests.post(self.webhook, data=body, timeout=5, headers={
                "Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": timestamp,
                "X-Slack-Signature": sign(self.signing_secret, timestamp, body)}))
            return
        with self.lock:
            self.envelopes.append({"envelope_id": f"env-{len(self.envelopes) + 1}", "payload": payload,
                                   "type": "interactive", "accepts_response_payload": True,
                                   "retry_attempt": 0, "retry_reason": ""})

    def user_edits(self, user: str, channel: str, ts: str, text: str) -> None:
        """User `user` changes their message `ts` in their DM `channel` (a `message_changed` event)."""
        old = next((m for m in self.said if m["ts"] == ts), {})
        edited_ts = self.ts()
        self.event({"type": "message", "subtype": "message_changed", "hidden": True, "channel": channel,
                    "channel_type": "im", "ts": edited_ts,
                    "message": {"type": "message", "user": user, "text": text, "ts": ts, "team": TEAM,
                                "edited": {"user": user, "ts": edited_ts}},
                    "previous_message": {"type": "message", "user": user, "text": old.get("text", ""), "ts": ts}})

    def user_shares_file(self, user: str, data: bytes, name: str, mimetype: str, text: str = "",
                         url: str = "", size: int | None = None) -> str:
        """User `user` shares a file in their DM with the bot (`url`: where the event says it is)."""
        file_id = f"F{uuid.uuid4().hex[:10].upper()}"
        self.hosted[file_id] = data
        channel, ts = f"D{user}", self.ts()
        item = {"id": file_id, "name": name, "title": name, "mimetype": mimetype, "filetype": name.rpartition(".")[2],
                "size": len(data) if size is None else size,
                "url_private": url or f"{self.url}/files-pri/{TEAM}-{file_id}/{name}",
                "url_private_download": url or f"{self.url}/files-pri/{TEAM}-{file_id}/download/{name}"}
        self.event({"type": "message", "subtype": "file_share", "text": text, "user": user, "ts": ts,
                    "channel": channel, "channel_type": "im", "team": TEAM, "files": [item]})
        return channel

    def disconnect(self, reason: str = "refresh_requested") -> None:
        self.to_every_socket({"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-fake"}})

