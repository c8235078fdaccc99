"""The channel manager: configured adapters' lifecycle, the channels API, sends.

Owned by the kernel. Reads `[channels.<name>]` sections of config.toml, starts one
adapter per section, and hands every inbound message to the router (agentd/channels/
inbound.py), which runs it against the conversation's own session of the routed agent.
"""

from __future__ import annotations

import logging
import threading
import tomllib
from typing import Any, Callable

from agentd import tomlsafe
from agentd.agents.approvals import ApprovalQueue
from agentd.agents.manager import AgentManager
from agentd.agents.runs import Runs
from agentd.channels import secrets as channel_secrets
from agentd.channels import adapters as registry
from agentd.channels.approvals import ChatApprovals
from agentd.channels.adapter import Adapter, ChannelContext, ChannelError, Inbound, Unreachable
from agentd.channels.attachments import ChannelFiles
from agentd.channels.allowlists import admits, recipients
from agentd.channels.catalog import ChannelCatalog, field_views, settings_for, validate
from agentd.channels.dispatch import Dispatcher
from agentd.channels.inbound import InboundRouter
from agentd.channels.start_retry import StartRetries
from agentd.channels.tomledit import edit_file
from agentd.config import channels_table
from agentd.errors import AgentdError, BadRequest, ConfigError
from agentd.llm.think import strip_think
from agentd.store import Store

log = logging.getLogger("agentd.channels")
KEY_SETTING = "channel_key:"  # + the channel's name: the key its runs act as


class ChannelManager:
    """Start/stop/reload adapters, serve the channels API and send for agents; their
    messages go to `inbound` (InboundRouter)."""

    def __init__(self, config_path, raw_channels: dict[str, Any], store: Store, agents: AgentManager,
                 runs: Runs, audit: Callable[[str, str, dict[str, Any]], None],
                 on_message: Callable[[str, str], None] | None = None,
                 on_inbound: Callable[[str, Inbound], None] | None = None,
                 files: ChannelFiles | None = None,
                 store_secrets: Callable[[dict[str, str]], None] | None = None,
                 approvals: ApprovalQueue | None = None) -> None:
        self.config_path = config_path
        # Writes channel secrets given as values to secrets.env and the environment (the
        # provider keys' writer); None: such a body is refused.
        self.store_secrets = store_secrets
        self.store = store
        self.audit = audit
        # The client behind a webhook request: `client_of(peer, header)`, `header(name)`
        # reading a request header. The HTTP layer sets it from `[api] trusted_proxies`.
        self.client_of: Callable[[str, Callable[[str], str | None]], str] = lambda peer, header: peer
        self.catalog = ChannelCatalog.load()
        self._lock = threading.RLock()
        self.sections: dict[str, dict[str, Any]] = {}
        self.running: dict[str, Adapter] = {}
        # Adapters inside start(): a platform may call the webhook back while it is being
        # registered (Viber's set_webhook), so the route serves an adapter once it listens.
        self.starting: dict[str, Adapter] = {}
        # Why a configured adapter could not start, by name, until it starts or is removed.
        self.errors: dict[str, str] = {}
        self.start_retries = StartRetries(self._start_again)
        settings = channels_table({"channels": raw_channels})
        self.listen_host = settings.listen_host
        self.dispatcher = Dispatcher(settings.workers, settings.queue_limit)
        self.inbound = InboundRouter(
            self.sections, self.running, agents, runs, audit, self.dispatcher,
            ChatApprovals(approvals if approvals is not None else ApprovalQueue(), audit), files,
            settings.max_file_bytes, on_message or (lambda adapter, direction: None), on_inbound,
            self.key_of)
        self._initial = raw_channels
        # Several daemons on one database (agentd/channels/leaders.py): an adapter starts only
        # where may_run(name) is true (the daemon holding its leader lease); on_stopped(name)
        # hands the lease back when it stops here.
        self.may_run: Callable[[str], bool] = lambda name: True
        self.on_stopped: Callable[[str], None] = lambda name: None

    # -- lifecycle -------------------------------------------------------------------
    def start_all(self) -> None:
        """Start every configured adapter (called once when the daemon starts)."""
        self._reconcile(self._sections_of(self._initial))

    def close(self) -> None:
        with self._lock:
            self.start_retries.close()
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
            try:
                settings = settings_for(info, validate(info, self.sections[name]))
            except BadRequest as exc:
                # Only a section read from the file gets here: the API refuses it before saving.
                raise ChannelError(f"{self.config_path} [channels.{name}]: {exc.message}") from None
            adapter = self.starting[name] = cls(self._context(name), settings)
            adapter.start()
        except (AgentdError, ChannelError, OSError, ValueError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            detail: dict[str, Any] = {"error": message[:300]}
            if isinstance(exc, Unreachable):
                detail["retry_in_secs"] = self.start_retries.later(name)
            log.warning("channel %s could not start: %s%s", name, message,
                        f" (trying again in {detail['retry_in_secs']:.0f} s)" if "retry_in_secs" in detail else "")
            self.errors[name] = message
            self.audit("channel.start_failed", name, detail)
            self.on_stopped(name)
            return False
        finally:
            self.starting.pop(name, None)
        self.start_retries.forget(name)
        self.errors.pop(name, None)
        self.running[name] = adapter
        self.audit("channel.start", name, {})
        return True

    def _start_again(self, name: str) -> None:
        with self._lock:  # close() sets `closed` under this lock: no start after shutdown
            if not self.start_retries.closed and name in self.sections and name not in self.running:
                log.info("channel %s: starting again", name)
                self._start(name)

    def _stop(self, name: str, reason: str) -> None:
        self.start_retries.forget(name)
        self.errors.pop(name, None)
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
            name, self.listen_host, deliver=lambda msg: self.inbound.deliver(name, msg),
            audit=self.audit, load_state=lambda: dict(self.store.get_setting(key, {}) or {}),
            save_state=lambda state: self.store.set_setting(key, state),
            configured=frozenset(self.sections.get(name) or {}), store_secrets=self.store_secrets)
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
    def agents_named(self, name: str, body: Any = None) -> list[str]:
        """The agents a channel's messages go to: its `default_agent` and `thread_routes`
        targets, from `body` (a configure body) or else its saved section. "" stands for
        the channel's fallback, the daemon's first agent."""
        section = body if isinstance(body, dict) else self.sections.get(name)
        if not isinstance(section, dict):
            return []
        if set(section) == {"fields"} and isinstance(section["fields"], dict):
            section = section["fields"]
        default = section.get("default_agent")
        named = [default if isinstance(default, str) else ""]
        routes = section.get("thread_routes")
        if isinstance(routes, dict):
            named += [agent for agent in routes.values() if isinstance(agent, str) and agent]
        return named

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
                        config_template=data["config_template"],
                        key_id=(self.key_of(info.name) or None) if section is not None else None)
            if info.name in self.errors and section is not None:
                item["error"] = self.errors[info.name]
            if not item["implemented"]:
                item["reason"] = registry.why_unavailable(info.name) or f"{info.name}: no adapter module"
            out.append(item)
        return out

    def key_of(self, name: str) -> str:
        """The scoped API key channel `name`'s runs act as ("": the admin's): the key that
        configured it last (agentd/key_runs.py)."""
        return self.store.get_setting(f"{KEY_SETTING}{name}", "") or ""

    def configure(self, name: str, body: Any, key_id: str = "") -> dict[str, Any]:
        """Validate, write `[channels.<name>]` atomically, hot-reload that adapter. `key_id`:
        the scoped API key configuring it (its `*_env` keys name only the adapter's own
        variables), which the channel's runs then act as; "": the admin."""
        info = self.catalog.get(name)
        secrets = None
        if isinstance(body, dict) and "secrets" in body:
            body = dict(body)
            secrets = body.pop("secrets")
        values = validate(info, body)
        if key_id:
            channel_secrets.check_names(info, values, self.sections.get(name) or {})
        stored = channel_secrets.secret_values(info, values, secrets) if secrets is not None else {}
        if stored and self.store_secrets is None:
            raise BadRequest("secrets: this daemon cannot store channel secrets")
        with self._lock:
            if stored:
                self.store_secrets(stored)  # before the adapter starts: it reads them at once
            if key_id:  # before the file: a key's section is never saved as the admin's
                self.store.set_setting(f"{KEY_SETTING}{name}", key_id)
            edit_file(self.config_path, ["channels", name], values)
            detail: dict[str, Any] = {"keys": sorted(values)}
            if key_id:
                detail["key_id"] = key_id
            if stored:
                detail["secrets_saved"] = sorted(stored)  # names only
            self.audit("channel.configure", name, detail)
            self._stop(name, reason="reconfigured")
            self.sections[name] = values
            if not key_id:
                # After the section: while the database is out this fails (503, retry) with the
                # file saved, and the channel starts once it is back, as the key it acted as.
                self.store.set_setting(f"{KEY_SETTING}{name}", "")
            started = self._start(name)
        result: dict[str, Any] = {"status": "configured", "channel": name, "activated": started}
        if stored:
            result["secrets_saved"] = sorted(stored)
        notes = [] if started else [
            "the platform does not answer yet: the adapter starts on its own once it does"
            if self.start_retries.pending(name) else "the adapter could not start (see the audit trail)"]
        named = self.agents_named(name, values)
        missing = [agent for agent in named if agent and self.inbound.agents.find(agent) is None]
        if missing:
            notes.append(f"no agent named {', '.join(missing)} yet: messages for it get an apology until it is spawned")
        elif "" in named and not self.inbound.agents.handles():
            notes.append("no agent runs yet: messages get an apology until one is spawned")
        if notes:
            result["note"] = "; ".join(notes)
        return result

    def remove(self, name: str) -> dict[str, Any]:
        """Remove `[channels.<name>]` and stop its adapter."""
        self.catalog.get(name)
        with self._lock:
            edit_file(self.config_path, ["channels", name], None)
            self._stop(name, reason="removed")
            self.sections.pop(name, None)
            self.audit("channel.remove", name, {})
            # Last: while the database is out this fails (503) with the channel removed all the
            # same; the key is cleared by the next configure.
            self.store.set_setting(f"{KEY_SETTING}{name}", "")
        return {"status": "removed", "channel": name}

    def reload(self) -> dict[str, Any]:
        """Re-read config.toml; start/stop/restart the adapters whose section changed."""
        try:
            text = self.config_path.read_text(encoding="utf-8") if self.config_path.exists() else ""
            raw = tomlsafe.loads(text).get("channels", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise BadRequest(f"cannot reload channels: {self.config_path}: {exc}") from None
        try:
            host = channels_table({"channels": raw}).listen_host
        except ConfigError as exc:
            raise BadRequest(f"cannot reload channels: {exc.message}") from None
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
        section = self.sections.get(name, {})
        if not admits(section, recipient):
            self.audit("channel.refused", name, {"recipient": recipient, "agent": agent,
                                                 "reason": "recipient not in the channel's allow-lists"})
            raise BadRequest(f"recipient {recipient!r} is not in channel {name}'s allow-lists "
                             f"({', '.join(sorted(recipients(section)))})")
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
