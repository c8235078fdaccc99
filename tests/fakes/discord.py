"""A fake Discord (API v10 + Gateway v10), written from Discord's developer docs
(https://discord.com/developers/docs/topics/gateway, .../resources/message).

REST under `/api/v10`: `GET /users/@me`, `GET /gateway/bot` (the gateway URL),
`POST /channels/{id}/messages` (2000-character limit, 50035 on longer content),
`POST /channels/{id}/typing` (204), `POST /channels/{id}/messages/{message}/threads` (Start
Thread from Message: a public thread, type 11, whose id is the message's; 400 code 160004
when the message already has one; posts into it are messages of the thread channel); `Authorization: Bot <token>` or 401 `{"message":
"401: Unauthorized", "code": 0}`; scripted 429s with Retry-After and a body `retry_after`.

Gateway on `/` (and the resume URL `/resume`): HELLO (op 10), IDENTIFY (op 2: token,
intents) -> READY (session id, bot user, resume_gateway_url); heartbeats (op 1) answered
by op 11 unless `ack` is False; close 4004 for a wrong token, 4014 for privileged intents
the app may not use (`privileged_ok` False); RESUME (op 6) replays the session's events after the
client's sequence number, then RESUMED; op 9 for an unknown session. Every session keeps
its own numbered events, so a client that resumes gets what it missed. The bot's own
messages come back as MESSAGE_CREATE, as on Discord.

Files ("Uploading Files"): a message with files is multipart/form-data, `payload_json`
plus `files[n]` parts named by `attachments[].id`; users' attachments are served from the
fake's CDN path `/attachments/{channel}/{id}/{filename}` (no token, as on the CDN).

Message components (.../interactions/message-components): a message's `components` are
kept; `user_clicks()` dispatches INTERACTION_CREATE (type 3) with a one-use token, answered
at `POST /interactions/{id}/{token}/callback` (no bot token needed; once only, 40060
"Interaction has already been acknowledged" after) and kept in `callbacks`; type 7 updates
the clicked message. Reactions: `PUT`/`DELETE /channels/{c}/messages/{m}/reactions/{emoji}/@me`
(204; 10014 "Unknown Emoji" for an empty one), kept in `reactions`. `user_edits()`
dispatches MESSAGE_UPDATE. `PATCH /channels/{c}/messages/{m}` edits a message (`edits`).
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from flask import jsonify, request
from simple_websocket import ConnectionClosed

from fakes.gateway import FakeGateway

BOT = {"id": "900000000000000001", "username": "agentbot", "discriminator": "0", "bot": True}
GUILD = "800000000000000001"
PRIVILEGED = (1 << 1) | (1 << 8) | (1 << 15)  # GUILD_MEMBERS, GUILD_PRESENCES, MESSAGE_CONTENT


class FakeDiscord(FakeGateway):
    def __init__(self, token: str, heartbeat_ms: int = 45000) -> None:
        super().__init__("discord")
        self.token = token
        self.heartbeat_ms = heartbeat_ms
        self.ack = True                                   # answer heartbeats with op 11
        self.privileged_ok = True                         # privileged intents enabled for the app
        self.messages: list[dict[str, Any]] = []
        self.typing: list[str] = []
        self.callbacks: dict[str, dict[str, Any]] = {}        # interaction id -> its answer
        self.tokens: dict[str, str] = {}                       # interaction id -> its token
        self.clicked: dict[str, dict[str, Any]] = {}           # interaction id -> the clicked message
        self.edits: list[dict[str, Any]] = []                  # PATCHed messages
        self.reactions: dict[str, list[str]] = {}              # message id -> the bot's emoji
        self.threads: dict[str, dict[str, Any]] = {}      # thread channel id -> channel object
        self.received: list[tuple[str, dict[str, Any]]] = []  # (path, frame) from clients
        self.sessions: dict[str, list[tuple[int, str, dict[str, Any]]]] = {}
        self.snowflakes = itertools.count(int(time.time() * 1000) << 22)
        self.session_ids = itertools.count(1)
        self.cdn: dict[str, bytes] = {}          # attachment id -> bytes
        self.downloads: list[str] = []
        self.uploads: list[dict[str, Any]] = []  # files the bot posted
        app, sock = self.app, self.sock

        @app.get("/attachments/<channel>/<attachment>/<filename>")
        def cdn(channel: str, attachment: str, filename: str):
            self.downloads.append(attachment)
            if attachment not in self.cdn:
                return "not found", 404
            return self.cdn[attachment], 200, {"Content-Type": "application/octet-stream"}

        def authorised() -> bool:
            return request.headers.get("Authorization") == f"Bot {self.token}"

        @app.before_request
        def auth():
            if request.path.startswith("/api/") and "/interactions/" not in request.path and not authorised():
                return jsonify({"message": "401: Unauthorized", "code": 0}), 401

        @app.get("/api/v10/users/@me")
        def me():
            return jsonify(BOT)

        @app.get("/api/v10/gateway/bot")
        def gateway_bot():
            return jsonify({"url": self.url.replace("http", "ws", 1), "shards": 1,
                            "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 0,
                                                    "max_concurrency": 1}})

        @app.post("/api/v10/channels/<channel>/messages")
        def create_message(channel: str):
            limited = self.throttled({"message": "You are being rate limited.", "retry_after": 1.0, "global": False})
            if limited is not None:
                return limited
            files = {}
            if request.mimetype == "multipart/form-data":
                body = json.loads(request.form.get("payload_json") or "{}")
                for item in body.get("attachments") or []:
                    part = request.files.get(f"files[{item['id']}]")
                    if part is None:
                        return jsonify({"code": 50035, "message": "Invalid Form Body"}), 400
                    files[item["id"]] = {"filename": item.get("filename") or part.filename,
                                         "content_type": part.mimetype, "data": part.read()}
            else:
                body = request.get_json()
            content = body.get("content") or ""
            if files:
                self.uploads.extend({"channel": channel, **f} for f in files.values())
                message = self._message(channel, BOT, content, guild=self.guild_of(channel), attachments=[
                    {"id": str(next(self.snowflakes)), "filename": f["filename"], "size": len(f["data"])}
                    for f in files.values()])
                return jsonify(message)
            if not content or len(content) > 2000:
                return jsonify({"code": 50035, "message": "Invalid Form Body", "errors": {"content": {
                    "_errors": [{"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 2000 or fewer in length."}]}}}), 400
            extra = {"components": body["components"]} if body.get("components") else {}
            message = self._message(channel, BOT, content, guild=self.guild_of(channel),
                                    reference=body.get("message_reference"), **extra)
            self.record(channel=channel, content=content, reference=(body.get("message_reference") or {}).get(
                "message_id"), allowed_mentions=body.get("allowed_mentions"), id=message["id"], **extra)
            return jsonify(message)

        @app.post("/api/v10/channels/<channel>/messages/<message>/threads")
        def start_thread(channel: str, message: str):
            body = request.get_json() or {}
            if not 1 <= len(str(body.get("name") or "")) <= 100:
                return jsonify({"code": 50035, "message": "Invalid Form Body", "errors": {"name": {
                    "_errors": [{"code": "BASE_TYPE_BAD_LENGTH", "message": "Must be between 1 and 100 in length."}]}}}), 400
            if message in self.threads:
                return jsonify({"code": 160004, "message": "A thread has already been created for this message"}), 400
            if not any(m["id"] == message and m["channel_id"] == channel for m in self.messages):
                return jsonify({"code": 10008, "message": "Unknown Message"}), 404
            thread = {"id": message, "type": 11, "guild_id": self.guild_of(channel), "parent_id": channel,
                      "name": body["name"], "owner_id": BOT["id"], "message_count": 0,
                      "thread_metadata": {"archived": False, "locked": False,
                                          "auto_archive_duration": int(body.get("auto_archive_duration") or 4320)}}
            self.threads[message] = thread
            self.dispatch("THREAD_CREATE", {**thread, "newly_created": True})
            return jsonify(thread), 201

        @app.post("/api/v10/channels/<channel>/typing")
        def typing(channel: str):
            self.typing.append(channel)
            return "", 204

        @app.post("/api/v10/interactions/<interaction>/<token>/callback")
        def interaction_callback(interaction: str, token: str):
            if self.tokens.get(interaction) != token:
                return jsonify({"code": 10062, "message": "Unknown interaction"}), 404
            if interaction in self.callbacks:
                return jsonify({"code": 40060, "message": "Interaction has already been acknowledged."}), 400
            body = request.get_json()
            self.callbacks[interaction] = body
            if body.get("type") == 7:  # UPDATE_MESSAGE: the clicked message changes
                clicked = self.clicked[interaction]
                for item in (clicked, *[s for s in self.sent if s.get("id") == clicked["id"]]):
                    if "content" in body.get("data", {}):
                        item["content"] = body["data"]["content"]
                    if "components" in body.get("data", {}):
                        item["components"] = body["data"]["components"]
            return "", 204

        @app.patch("/api/v10/channels/<channel>/messages/<message>")
        def edit_message(channel: str, message: str):
            body = request.get_json()
            found = [m for m in (*self.messages, *self.sent) if m.get("id") == message
                     and (m.get("channel_id") or m.get("channel")) == channel]
            if not found:
                return jsonify({"code": 10008, "message": "Unknown Message"}), 404
            for item in found:
                item.update({k: body[k] for k in ("content", "components") if k in body})
            self.edits.append({"channel": channel, "id": message, **body})
            return jsonify(next(m for m in self.messages if m["id"] == message))

        @app.route("/api/v10/channels/<channel>/messages/<message>/reactions/<emoji>/@me", methods=["PUT", "DELETE"])
        def reaction(channel: str, message: str, emoji: str):
            if not emoji:
                return jsonify({"code": 10014, "message": "Unknown Emoji"}), 400
            if not any(m["id"] == message and m["channel_id"] == channel for m in self.messages):
                return jsonify({"code": 10008, "message": "Unknown Message"}), 404
            mine = self.reactions.setdefault(message, [])
            if request.method == "PUT" and emoji not in mine:
                mine.append(emoji)
            elif request.method == "DELETE" and emoji in mine:
                mine.remove(emoji)
            return "", 204

        sock.route("/", endpoint="gateway")(lambda ws: self._serve(ws, "/"))
        sock.route("/resume/", endpoint="resume")(lambda ws: self._serve(ws, "/resume"))

    # -- the gateway ---------------------------------------------------------------------
    def _serve(self, ws: Any, path: str) -> None:
        self.socks.append(ws)
        ws.send(json.dumps({"op": 10, "d": {"heartbeat_interval": self.heartbeat_ms}, "s": None, "t": None}))
        session, sent = "", 0
        try:
            while True:
                raw = ws.receive(timeout=0.05)
                if raw is not None:
                    frame = json.loads(raw)
                    self.received.append((path, frame))
                    op, d = frame.get("op"), frame.get("d")
                    if op == 1:
                        self.polled()
                        if self.ack:
                            ws.send(json.dumps({"op": 11, "d": None, "s": None, "t": None}))
                    elif op == 2:
                        if d.get("token") != self.token:
                            ws.close(4004, "Authentication failed.")
                            return
                        if int(d.get("intents") or 0) & PRIVILEGED and not self.privileged_ok:
                            ws.close(4014, "Disallowed intent(s).")
                            return
                        session = f"session{next(self.session_ids)}"
                        self.sessions[session] = []
                        self._event(session, "READY", {
                            "v": 10, "user": BOT, "guilds": [{"id": GUILD, "unavailable": True}],
                            "session_id": session, "resume_gateway_url": self.url.replace("http", "ws", 1) + "/resume",
                            "application": {"id": BOT["id"], "flags": 0}})
                    elif op == 6:
                        if d.get("token") != self.token or d.get("session_id") not in self.sessions:
                            ws.send(json.dumps({"op": 9, "d": False, "s": None, "t": None}))
                            continue
                        session, sent = d["session_id"], int(d.get("seq") or 0)
                        self._event(session, "RESUMED", {})
                if session:
                    for seq, kind, data in list(self.sessions[session]):
                        if seq > sent:
                            ws.send(json.dumps({"op": 0, "s": seq, "t": kind, "d": data}))
                            sent = seq
        except (ConnectionClosed, OSError):
            return

    def _event(self, session: str, kind: str, data: dict[str, Any]) -> None:
        with self.lock:
            events = self.sessions[session]
            events.append((len(events) + 1, kind, data))

    def dispatch(self, kind: str, data: dict[str, Any]) -> None:
        for session in list(self.sessions):
            self._event(session, kind, data)

    def send_op(self, op: int, d: Any = None) -> None:
        """Send a bare opcode (7 reconnect, 9 invalid session, 1 heartbeat request) to every socket."""
        self.to_every_socket({"op": op, "d": d, "s": None, "t": None})

    # -- platform users ------------------------------------------------------------------
    def guild_of(self, channel: str) -> str | None:
        return None if channel.startswith("dm-") else GUILD

    def _message(self, channel: str, author: dict[str, Any], content: str, guild: str | None,
                 reference: dict[str, Any] | None = None, mentions: list[dict[str, Any]] | None = None,
                 **extra: Any) -> dict[str, Any]:
        message = {"id": str(next(self.snowflakes)), "channel_id": channel, "author": author, "content": content,
                   "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "tts": False,
                   "mention_everyone": False, "mentions": mentions or [], "type": 19 if reference else 0,
                   **extra}
        if reference:
            message["message_reference"] = {"message_id": reference.get("message_id"), "channel_id": channel}
        self.messages.append(message)
        self.dispatch("MESSAGE_CREATE", {**message, **({"guild_id": guild} if guild else {})})
        return message

    def user_says(self, user: str, text: str, channel: str = "", mention: bool = False, bot: bool = False,
                  reply_to: str = "") -> str:
        """A user posts (in their DM channel unless `channel`, which may be a thread's id);
        `mention` addresses the bot, `reply_to` replies to that message (a reply to one of
        the bot's messages carries it as `referenced_message`)."""
        channel = channel or f"dm-{user}"
        author = {"id": f"id-{user}", "username": user, "discriminator": "0", **({"bot": True} if bot else {})}
        mentions = [BOT] if mention else []
        content = f"<@{BOT['id']}> {text}" if mention else text
        extra: dict[str, Any] = {}
        if reply_to:
            extra["referenced_message"] = next((m for m in self.messages if m["id"] == reply_to), None)
        self._message(channel, author, content, self.guild_of(channel), mentions=mentions,
                      reference={"message_id": reply_to} if reply_to else None, **extra)
        return channel

    def last_message_id(self) -> str:
        return self.messages[-1]["id"]

    def user_sends_file(self, user: str, data: bytes, filename: str, content_type: str, text: str = "",
                        url: str = "", size: int | None = None) -> str:
        """A user posts a file in their DM channel (`url`: where the message says it is)."""
        channel = f"dm-{user}"
        attachment = str(next(self.snowflakes))
        self.cdn[attachment] = data
        author = {"id": f"id-{user}", "username": user, "discriminator": "0"}
        self._message(channel, author, text, None, attachments=[{
            "id": attachment, "filename": filename, "content_type": content_type,
            "size": len(data) if size is None else size,
            "url": url or f"{self.url}/attachments/{channel}/{attachment}/{filename}",
            "proxy_url": url or f"{self.url}/attachments/{channel}/{attachment}/{filename}"}])
        return channel

    def user_clicks(self, user: str, message: dict[str, Any], custom_id: str) -> str:
        """User `user` clicks the button `custom_id` of the bot's `message` (one of `sent`);
        returns the interaction's id."""
        interaction, token = str(next(self.snowflakes)), f"itoken-{next(self.snowflakes)}"
        self.tokens[interaction] = token
        self.clicked[interaction] = next(m for m in self.messages if m["id"] == message["id"])
        who = {"id": f"id-{user}", "username": user, "discriminator": "0"}
        guild = self.guild_of(message["channel"])
        data = {"id": interaction, "application_id": BOT["id"], "type": 3, "token": token, "version": 1,
                "channel_id": message["channel"], "message": self.clicked[interaction],
                "data": {"custom_id": custom_id, "component_type": 2},
                **({"guild_id": guild, "member": {"user": who, "roles": []}} if guild else {"user": who})}
        self.dispatch("INTERACTION_CREATE", data)
        return interaction

    def user_edits(self, channel: str, message_id: str, text: str) -> None:
        """The author changes their message `message_id` (MESSAGE_UPDATE)."""
        message = next(m for m in self.messages if m["id"] == message_id)
        message.update(content=text, edited_timestamp=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()))
        guild = self.guild_of(channel)
        self.dispatch("MESSAGE_UPDATE", {**message, **({"guild_id": guild} if guild else {})})

    def identifies(self) -> list[dict[str, Any]]:
        return [f["d"] for _, f in self.received if f.get("op") == 2]

    def resumes(self) -> list[tuple[str, dict[str, Any]]]:
        return [(p, f["d"]) for p, f in self.received if f.get("op") == 6]
