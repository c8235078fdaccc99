"""The channel manager: configured adapters' lifecycle, routing to agents, audit.

Owned by the kernel. Reads `[channels.<name>]` sections of config.toml, starts one
adapter per section, and hands every inbound message to the per-conversation
dispatcher, which runs it against the conversation's own session of the routed agent.
"""

from __future__ import annotations

import logging
import threading
import tomllib
import uuid
from typing import Any, Callable

from agentd.agents.approvals import ApprovalQueue
from agentd.agents.manager import AgentManager
from agentd.agents.handle import RunOptions
from agentd.agents.runs import INLINE, RunRequest, Runs, check_message
from agentd.channels import overrides as channel_overrides
from agentd.channels import secrets as channel_secrets
from agentd.channels import adapters as registry
from agentd.channels import lifecycle
from agentd.channels.approvals import ChatApprovals, parse as approval_command
from agentd.channels.adapter import Adapter, ChannelContext, ChannelError, Conversation, Inbound
from agentd.channels.attachments import DEFAULT_MAX_BYTES, ChannelFiles
from agentd.channels.catalog import (CHAT_LISTS, USER_LISTS, ChannelCatalog,
                                     field_views, settings_for, validate)
from agentd.channels.dispatch import Dispatcher
from agentd.channels.tomledit import edit_file
from agentd.errors import AgentdError, BadRequest, NotFound, PayloadTooLarge
from agentd.llm.think import strip_think
from agentd.store import Store

log = logging.getLogger("agentd.channels")
SESSION_NS = uuid.UUID("6f1c2a8e-3b7d-4c55-9a61-0d2f7e4b9c13")
APOLOGY = "Sorry, something went wrong while answering your message. Please try again later."


class ChannelManager:
    """Start/stop/reload adapters and route their messages to agents."""

    def __init__(self, config_path, raw_channels: dict[str, Any], store: Store, agents: AgentManager,
                 runs: Runs, audit: Callable[[str, str, dict[str, Any]], None],
                 on_message: Callable[[str, str], None] | None = None,
                 on_inbound: Callable[[str, Inbound], None] | None = None,
                 files: ChannelFiles | None = None,
                 store_secrets: Callable[[dict[str, str]], None] | None = None,
                 approvals: ApprovalQueue | None = None) -> None:
        self.config_path = config_path
        # Files and images of messages, both ways (None: files are neither taken nor sent).
        self.files = files
        # Writes channel secrets given as values to secrets.env and the environment (the
        # provider keys' writer); None: such a body is refused.
        self.store_secrets = store_secrets
        # Told (adapter, "in" | "out" | "refused") for every message (the metrics' counter).
        self.on_message = on_message or (lambda adapter, direction: None)
        # Hears of every inbound message the allow-lists let through (the event bus).
        self.on_inbound = on_inbound
        self.store = store
        self.agents = agents
        self.runs = runs
        self.audit = audit
        # Manual-mode tool calls asked for, and answered, in the conversation.
        self.chat_approvals = ChatApprovals(approvals if approvals is not None else ApprovalQueue(), audit)
        # The client behind a webhook request: `client_of(peer, header)`, `header(name)`
        # reading a request header. The HTTP layer sets it from `[api] trusted_proxies`.
        self.client_of: Callable[[str, Callable[[str], str | None]], str] = lambda peer, header: peer
        self.catalog = ChannelCatalog.load()
        self._lock = threading.RLock()
        self.sender_limits = channel_overrides.SenderLimits()
        self.sections: dict[str, dict[str, Any]] = {}
        self.running: dict[str, Adapter] = {}
        # Adapters inside start(): a platform may call the webhook back while it is being
        # registered (Viber's set_webhook), so the route serves an adapter once it listens.
        self.starting: dict[str, Adapter] = {}
        self._apply_globals(raw_channels)
        self.dispatcher = Dispatcher(self.workers, self.queue_limit)
        self._initial = raw_channels
        # Several daemons on one database (agentd/channels/leaders.py): an adapter starts only
        # where may_run(name) is true (the daemon holding its leader lease); on_stopped(name)
        # hands the lease back when it stops here.
        self.may_run: Callable[[str], bool] = lambda name: True
        self.on_stopped: Callable[[str], None] = lambda name: None

    def _apply_globals(self, raw: dict[str, Any]) -> None:
        self.listen_host = str(raw.get("listen_host", "127.0.0.1"))
        self.workers = int(raw.get("workers", 8))
        self.queue_limit = int(raw.get("queue_limit", 32))
        cap = raw.get("max_file_bytes", DEFAULT_MAX_BYTES)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            log.warning("config key channels.max_file_bytes: must be a positive whole number of bytes; "
                        "using %d", DEFAULT_MAX_BYTES)
            cap = DEFAULT_MAX_BYTES
        self.max_file_bytes = min(cap, DEFAULT_MAX_BYTES)

    # -- lifecycle -------------------------------------------------------------------
    def start_all(self) -> None:
        """Start every configured adapter (called once when the daemon starts)."""
        self._reconcile(self._sections_of(self._initial))

    def close(self) -> None:
        with self._lock:
            for name in list(self.running):
                self._stop(name, reason="shutdown")
        self.dispatcher.close()

    def _sections_of(self, raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
        known = set(self.catalog.names())
        for name, value in raw.items():
            if isinstance(value, dict) and name not in known:
                log.warning("config [channels.%s]: unknown channel adapter, ignored", name)
        out = {}
        for name in self.catalog.names():
            section = raw.get(name)
            if isinstance(section, dict):
                out[name] = section
        return out

    def _reconcile(self, sections: dict[str, dict[str, Any]]) -> None:
        with self._lock:
            for name in list(self.sections):
                if name not in sections:
                    self._stop(name, reason="removed")
                    self.sections.pop(name)
            for name, section in sections.items():
                if self.sections.get(name) == section and name in self.running:
                    continue
                self._stop(name, reason="reconfigured")
                self.sections[name] = section
                self._start(name)

    def _start(self, name: str) -> bool:
        info = self.catalog.get(name)
        cls = registry.load(name)
        if not self.may_run(name):
            return False
        try:
            settings = settings_for(info, validate(info, self.sections[name]))
            adapter = self.starting[name] = cls(self._context(name), settings)
            adapter.start()
        except (AgentdError, ChannelError, OSError, ValueError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            log.warning("channel %s could not start: %s", name, message)
            self.audit("channel.start_failed", name, {"error": message[:300]})
            self.on_stopped(name)
            return False
        finally:
            self.starting.pop(name, None)
        self.running[name] = adapter
        self.audit("channel.start", name, {})
        return True

    def _stop(self, name: str, reason: str) -> None:
        adapter = self.running.pop(name, None)
        if adapter is None:
            self.on_stopped(name)
            return
        try:
            adapter.stop()
        except Exception:  # noqa: BLE001 - a failing stop must not keep the others running
            log.exception("channel %s: stop failed", name)
        self.on_stopped(name)
        self.audit("channel.stop", name, {"reason": reason})

    def _context(self, name: str) -> ChannelContext:
        key = f"channel_state:{name}"
        ctx = ChannelContext(
            name, self.listen_host, deliver=lambda msg: self._deliver(name, msg),
            audit=self.audit, load_state=lambda: dict(self.store.get_setting(key, {}) or {}),
            save_state=lambda state: self.store.set_setting(key, state),
            configured=frozenset(self.sections.get(name) or {}))
        ctx.client_of = lambda peer, header: self.client_of(peer, header)
        return ctx

    def webhook(self, name: str) -> Adapter | None:
        """The running webhook adapter `name` (served at /channels/<name>/webhook), if any."""
        from agentd.channels.bases.webhook import WebhookAdapter

        adapter = self.running.get(name)
        if adapter is None:  # one still starting, once its requests can be served
            adapter = self.starting.get(name)
            adapter = adapter if getattr(adapter, "started", False) else None
        return adapter if isinstance(adapter, WebhookAdapter) else None

    # -- API operations ----------------------------------------------------------------
    def list(self) -> list[dict[str, Any]]:
        """GET /api/channels: the 40 adapters with configured/active and field states."""
        out = []
        for info in self.catalog.items:
            section = self.sections.get(info.name)
            adapter = self.running.get(info.name)
            data = info.data
            item = {k: data[k] for k in ("name", "display_name", "icon", "description", "category",
                                         "difficulty", "setup_time", "quick_setup", "setup_type")}
            item.update(configured=section is not None,
                        active=adapter is not None and bool(adapter.health()),
                        implemented=registry.has(info.name) and not registry.why_unavailable(info.name),
                        fields=field_views(info, section), setup_steps=data["setup_steps"],
                        config_template=data["config_template"])
            if not item["implemented"]:
                item["reason"] = registry.why_unavailable(info.name) or f"{info.name}: no adapter module"
            out.append(item)
        return out

    def configure(self, name: str, body: Any) -> dict[str, Any]:
        """Validate, write `[channels.<name>]` atomically, hot-reload that adapter."""
        info = self.catalog.get(name)
        secrets = None
        if isinstance(body, dict) and "secrets" in body:
            body = dict(body)
            secrets = body.pop("secrets")
        values = validate(info, body)
        stored = channel_secrets.secret_values(info, values, secrets) if secrets is not None else {}
        if stored and self.store_secrets is None:
            raise BadRequest("secrets: this daemon cannot store channel secrets")
        with self._lock:
            if stored:
                self.store_secrets(stored)  # before the adapter starts: it reads them at once
            edit_file(self.config_path, ["channels", name], values)
            detail: dict[str, Any] = {"keys": sorted(values)}
            if stored:
                detail["secrets_saved"] = sorted(stored)  # names only
            self.audit("channel.configure", name, detail)
            self._stop(name, reason="reconfigured")
            self.sections[name] = values
            started = self._start(name)
        result: dict[str, Any] = {"status": "configured", "channel": name, "activated": started}
        if stored:
            result["secrets_saved"] = sorted(stored)
        if not started:
            result["note"] = f"{name}: configuration saved but the adapter could not start (see the audit trail)"
        return result

    def remove(self, name: str) -> dict[str, Any]:
        """Remove `[channels.<name>]` and stop its adapter."""
        self.catalog.get(name)
        with self._lock:
            edit_file(self.config_path, ["channels", name], None)
            self._stop(name, reason="removed")
            self.sections.pop(name, None)
            self.audit("channel.remove", name, {})
        return {"status": "removed", "channel": name}

    def reload(self) -> dict[str, Any]:
        """Re-read config.toml; start/stop/restart the adapters whose section changed."""
        try:
            text = self.config_path.read_text(encoding="utf-8") if self.config_path.exists() else ""
            raw = tomllib.loads(text).get("channels", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise BadRequest(f"cannot reload channels: {self.config_path}: {exc}") from None
        if not isinstance(raw, dict):
            raise BadRequest("cannot reload channels: [channels] must be a table")
        host = str(raw.get("listen_host", "127.0.0.1"))
        if host != self.listen_host:  # listeners must re-bind: restart every adapter
            with self._lock:
                self.listen_host = host
                for name in list(self.running):
                    self._stop(name, reason="listen_host changed")
                self.sections.clear()
        self._reconcile(self._sections_of(raw))
        self.audit("channel.reload", "", {"active": len(self.running)})
        return {"status": "reloaded", "channels_active": len(self.running)}

    def test(self, name: str, message: str, target: str = "", detail: bool = False) -> dict[str, Any]:
        """Send a real message through the adapter's sender to its configured target (with
        `detail`, the answer also names the platform's `message_id`)."""
        info = self.catalog.get(name)
        cls = registry.load(name)
        section = self.sections.get(name)
        if section is None:
            raise BadRequest(f"channel {name} is not configured")
        adapter = self.running.get(name)
        if adapter is None:  # not running (failed start): its sender still works
            adapter = cls(self._context(name), settings_for(info, validate(info, section)))
        try:
            conversation = adapter.test_target(target)
        except ChannelError as exc:
            raise BadRequest(str(exc)) from None
        try:
            message_id = adapter.send(conversation, message)
        except ChannelError as exc:
            self.audit("channel.test_failed", name, {"error": str(exc)[:300]})
            raise AgentdError(f"test message not delivered: {exc}", status=502) from None
        self.audit("channel.outbound", name, {"message_id": message_id, "test": True,
                                              "conversation": conversation.key})
        result = {"status": "success", "message": f"test message delivered to {conversation.chat_id}"}
        if detail:
            result["message_id"] = message_id or ""
        return result

    def send_to(self, name: str, recipient: str, message: str, agent: str = "",
                meta: dict[str, Any] | None = None, file: tuple[str, str, bytes] | None = None) -> dict[str, Any]:
        """An agent's own message (channel_send) through a running adapter's sender, only to
        a recipient the channel's allow-lists let talk to it."""
        adapter = self.running.get(name)
        if adapter is None:
            configured = ", ".join(sorted(self.running)) or "none"
            raise BadRequest(f"channel {name!r} is not running here (running: {configured})")
        settings = self.sections.get(name, {})
        users = {u.lower() for key in USER_LISTS for u in settings.get(key) or []}
        chats = {c.lower() for key in CHAT_LISTS for c in settings.get(key) or []}
        if (users or chats) and recipient.lower() not in users | chats:
            self.audit("channel.refused", name, {"recipient": recipient, "agent": agent,
                                                 "reason": "recipient not in the channel's allow-lists"})
            raise BadRequest(f"recipient {recipient!r} is not in channel {name}'s allow-lists "
                             f"({', '.join(sorted(users | chats))})")
        try:
            conversation = adapter.test_target(recipient)
        except ChannelError as exc:
            raise BadRequest(str(exc)) from None
        conversation.meta.update(meta or {})
        if agent:
            conversation.meta.setdefault("agent", agent)
        try:
            # A file (filename, type, bytes) goes first; the message is its caption.
            message_id = adapter.send_file(conversation, *file) if file is not None else ""
            if message.strip():
                message_id = adapter.send(conversation, message)
        except Exception as exc:  # noqa: BLE001 - the platform's failure, told to the agent
            self.audit("channel.send_failed", name, {"agent": agent, "error": str(exc)[:300]})
            raise AgentdError(f"message not delivered: {exc}", status=502) from None
        self.audit("channel.outbound", name, {"message_id": message_id, "agent": agent,
                                              "conversation": conversation.key})
        return {"channel": name, "recipient": conversation.chat_id, "message_id": message_id}
    def send_text(self, name: str, text: str, target: str = "") -> str:
        """Send `text` through the adapter's sender to `target` (its configured target when
        empty), formatted as a channel reply; the platform's message id. ChannelError or
        BadRequest when it cannot be sent."""
        info = self.catalog.get(name)
        section = self.sections.get(name)
        if info is None or section is None:
            raise BadRequest(f"channel {name} is not configured")
        adapter = self.running.get(name)
        if adapter is None:  # a standby daemon (or a failed start): the sender still works
            adapter = registry.load(name)(self._context(name), settings_for(info, validate(info, section)))
        conversation = adapter.test_target(target)
        message_id = adapter.send(conversation, strip_think(text).strip())
        self.audit("channel.outbound", name, {"message_id": message_id, "conversation": conversation.key})
        return message_id

    # -- inbound routing ---------------------------------------------------------------
    def _deliver(self, name: str, msg: Inbound) -> None:
        """Called by adapter readers: allow-list check, then queue (never blocks)."""
        settings = self.sections.get(name, {})
        chosen = self._overrides(name)
        msg.conversation.shared = not msg.conversation.direct and chosen.get("group_policy") == "shared"
        adapter = self.running.get(name)
        if adapter is not None and approval_command(msg.text) and (
                self.chat_approvals.asked_here(name, msg) or not self._refusal(settings, msg)):
            # Answered beside the conversation's queue, where the run waiting for it sits;
            # its own check says who may answer (others are told so, not ignored).
            self.dispatcher.submit(f"{msg.conversation.key}:approvals",
                                   lambda: self.chat_approvals.handle(adapter, msg))
            return
        refused = self._refusal(settings, msg) or channel_overrides.policy_refusal(
            chosen, msg.conversation.direct, msg.mentioned)
        if not refused:
            try:
                check_message(msg.text)
            except PayloadTooLarge:
                refused = "message larger than 64 KB"
        if refused:
            self.on_message(name, "refused")
            self.audit("channel.refused", name, {"sender": msg.sender_id, "chat": msg.conversation.chat_id,
                                                 "message_id": msg.message_id, "reason": refused})
            return
        self.on_message(name, "in")
        self.audit("channel.inbound", name, {"message_id": msg.message_id, "sender": msg.sender_id,
                                             "conversation": msg.conversation.key})
        if self.on_inbound is not None:
            self.on_inbound(name, msg)
        if not self.dispatcher.submit(msg.conversation.key, lambda: self._answer(name, msg)):
            self.audit("channel.dropped", name, {"message_id": msg.message_id,
                                                 "conversation": msg.conversation.key})

    def _overrides(self, name: str) -> dict[str, Any]:
        """The channel's checked `overrides` table (a running adapter's section passed the check)."""
        try:
            return channel_overrides.check(self.sections.get(name, {}).get("overrides") or {}, name)
        except BadRequest:
            return {}

    @staticmethod
    def _refusal(settings: dict[str, Any], msg: Inbound) -> str:
        users = [u.lower() for key in USER_LISTS for u in settings.get(key) or []]
        names = {n.lower() for n in (msg.sender_id, *msg.sender_aliases) if n}
        if users and not any(n in users or ("@" in n and "@" + n.split("@", 1)[1] in users) for n in names):
            return "sender not in allowed_users"
        chats = [c.lower() for key in CHAT_LISTS for c in settings.get(key) or []]
        where = {c.lower() for c in (msg.conversation.chat_id, *msg.chat_aliases) if c}
        if chats and not msg.conversation.direct and not where & set(chats):
            return "chat not in allowed_channels"
        return ""

    def _answer(self, name: str, msg: Inbound) -> None:
        """On a dispatcher worker: run the agent in the conversation's session, reply."""
        adapter = self.running.get(name)
        if adapter is None:
            return
        conversation = msg.conversation
        life = lifecycle.Lifecycle(adapter, msg, self._overrides(name))
        life.received()
        failed = False
        try:
            handle = self._route(name, msg.agent)
            conversation.meta.setdefault("agent", handle.name)
            if msg.text.strip().lower() in ("/new", "/reset"):
                try:  # only this conversation's session: other users keep theirs
                    self.agents.delete_session(self._session_id(handle.id, conversation.key))
                except NotFound:
                    pass
                reply = "Started a new conversation."
            elif not self.sender_limits.allow(name, msg.sender_id,
                                              int(self._overrides(name).get("rate_limit_per_user") or 0)):
                self.audit("channel.rate_limited", name, {"message_id": msg.message_id, "sender": msg.sender_id})
                reply = channel_overrides.SLOW_DOWN.format(limit=self._overrides(name)["rate_limit_per_user"])
            else:
                text, images = self._take_files(adapter, handle, msg)
                reply = self._run(adapter, handle, conversation, text, msg.sender_id, life, images) \
                    if text.strip() or images else ""
        except Exception as exc:  # noqa: BLE001 - errors become an apology, never a crash
            error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            log.warning("channel %s: message %s failed: %s", name, msg.message_id, error)
            self.audit("channel.error", name, {"message_id": msg.message_id, "error": error[:300]})
            reply, failed = APOLOGY, True
        if not reply.strip():
            life.finished(ok=not failed)
            return
        try:
            sent_id = adapter.send(conversation, reply)
        except Exception as exc:  # noqa: BLE001
            self.audit("channel.send_failed", name, {"in_reply_to": msg.message_id, "error": str(exc)[:300]})
            life.finished(ok=False)
            return
        life.finished(ok=not failed)
        self.on_message(name, "out")
        self.audit("channel.outbound", name, {"message_id": sent_id, "in_reply_to": msg.message_id,
                                              "conversation": conversation.key})

    def _route(self, name: str, agent: str = ""):  # type: ignore[no-untyped-def]
        agent_name = agent or self.sections.get(name, {}).get("default_agent")
        if agent_name:
            handle = self.agents.find(agent_name)
            if handle is None:
                raise ChannelError(f"{'thread_routes agent' if agent else 'default_agent'} {agent_name!r} does not exist")
            return handle
        handles = self.agents.handles()
        if not handles:
            raise ChannelError("no agent is running to answer channel messages")
        return handles[0]

    @staticmethod
    def _session_id(agent_id: str, key: str) -> str:
        return str(uuid.uuid5(SESSION_NS, f"{agent_id}|{key}"))

    def _may_answer(self, name: str, requester: str) -> Callable[[Inbound], bool]:
        """Who may answer an approval asked in a conversation: the channel's allowed users
        when it lists them, else the person whose message started the run."""
        def allowed(msg: Inbound) -> bool:
            settings = self.sections.get(name, {})
            if any(settings.get(key) for key in USER_LISTS):
                return not self._refusal(settings, msg)
            return msg.sender_id == requester
        return allowed

    def _take_files(self, adapter: Adapter, handle, msg: Inbound) -> tuple[str, list[dict[str, Any]]]:  # type: ignore[no-untyped-def]
        """The message's text with a note per file, and the images for the model; a file not
        taken is said to the sender at once (and audited)."""
        text = lifecycle.text_of(msg)
        if not msg.attachments or self.files is None:
            return text, []
        got = self.files.receive(adapter.file_hosts(), handle, msg.attachments, self.max_file_bytes,
                                 model=self._overrides(adapter.name).get("model", ""))
        for sentence in got.refused:
            self.audit("channel.file_refused", adapter.name, {"message_id": msg.message_id, "reason": sentence})
            try:
                adapter.send(msg.conversation, sentence)
            except Exception as exc:  # noqa: BLE001 - the run still answers what was taken
                self.audit("channel.send_failed", adapter.name, {"in_reply_to": msg.message_id,
                                                                 "error": str(exc)[:300]})
        return "\n".join(p for p in (text, *got.notes) if p), got.images

    def _send_files(self, adapter: Adapter, handle, conversation: Conversation, result) -> None:  # type: ignore[no-untyped-def]
        """Post the files the run made back to the conversation."""
        if self.files is None:
            return
        for item in self.files.outgoing(handle, result):
            try:
                sent = adapter.send_file(conversation, item.filename, item.content_type, item.data)
            except Exception as exc:  # noqa: BLE001 - the text reply still goes out
                self.audit("channel.send_failed", adapter.name, {"file": item.filename, "error": str(exc)[:300]})
                continue
            self.on_message(adapter.name, "out")
            self.audit("channel.outbound", adapter.name, {"message_id": sent, "file": item.filename,
                                                          "conversation": conversation.key})

    def _run(self, adapter: Adapter, handle, conversation: Conversation, text: str,  # type: ignore[no-untyped-def]
             sender: str, life: lifecycle.Lifecycle, images: list[dict[str, Any]] | None = None) -> str:
        chosen = self._overrides(adapter.name)
        emit, forget = None, lambda: None
        if handle.mode == "Manual":  # its tool calls are asked for in this conversation
            emit, forget = self.chat_approvals.sink(
                adapter, conversation, handle.name, self._may_answer(adapter.name, sender),
                on_wait=life.pause_typing)
        life.start_typing()
        try:
            # The conversation's own session of the agent: its history is never another's.
            options = RunOptions(extra_system=chosen.get("system_prompt", ""), model=chosen.get("model", ""))
            result = self.runs.start(RunRequest(handle, text, attachments=list(images or []), on=INLINE,
                                                origin="channel", options=options,
                                                session_id=self._session_id(handle.id, conversation.key),
                                                label=conversation.key,
                                                owner=f"channel:{adapter.name}:{sender}",
                                                emit=emit)).result()
        finally:
            forget()
            life.stop_typing()
        self._send_files(adapter, handle, conversation, result)
        reply = strip_think(result.response).strip()
        if not reply:
            return reply
        if chosen.get("prefix_agent_name"):
            reply = f"[{handle.name}] {reply}"
        usage = channel_overrides.footer(chosen.get("usage_footer", "off"), result.usage.input_tokens,
                                         result.usage.output_tokens, result.cost_usd)
        return f"{reply}\n\n{usage}" if usage else reply
