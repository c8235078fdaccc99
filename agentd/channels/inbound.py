"""Inbound channel messages: the allow lists, the per-conversation queue, and the answer.

An adapter's reader hands each message to `InboundRouter.deliver`; the router queues it
on the conversation's dispatcher key, runs the routed agent in the conversation's own
session (`Runs.start`, origin "channel") and sends the reply, with the files the run made.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from agentd.agents.handle import RunOptions
from agentd.agents.manager import AgentManager
from agentd.agents.run_request import INLINE, RunRequest, check_message
from agentd.agents.runs import Runs
from agentd.channels import lifecycle
from agentd.channels import overrides as channel_overrides
from agentd.channels.adapter import Adapter, ChannelError, Conversation, Inbound
from agentd.channels.allowlists import refusal
from agentd.channels.approvals import ChatApprovals, parse as approval_command
from agentd.channels.attachments import ChannelFiles
from agentd.channels.catalog import USER_LISTS
from agentd.channels.dispatch import Dispatcher
from agentd.errors import AgentdError, BadRequest, NotFound, PayloadTooLarge
from agentd.llm.think import strip_think

log = logging.getLogger("agentd.channels")
SESSION_NS = uuid.UUID("6f1c2a8e-3b7d-4c55-9a61-0d2f7e4b9c13")
APOLOGY = "Sorry, something went wrong while answering your message. Please try again later."
KEY_REFUSED = "Sorry, this channel may not answer now: {reason}"


def session_id(agent_id: str, key: str) -> str:
    """The session of conversation `key` with agent `agent_id` (the same on every daemon)."""
    return str(uuid.uuid5(SESSION_NS, f"{agent_id}|{key}"))


@dataclass(eq=False)
class InboundRouter:
    """Route the running adapters' messages to agents and send their answers back.

    `sections` and `running` are the channel manager's own (configured sections and running
    adapters, by name): the router reads them as they are when a message arrives."""

    sections: dict[str, dict[str, Any]]
    running: dict[str, Adapter]
    agents: AgentManager
    runs: Runs
    audit: Callable[[str, str, dict[str, Any]], None]
    dispatcher: Dispatcher
    # Manual-mode tool calls asked for, and answered, in the conversation.
    chat_approvals: ChatApprovals
    # Files and images of messages, both ways (None: files are neither taken nor sent).
    files: ChannelFiles | None
    max_file_bytes: int
    # Told (adapter, "in" | "out" | "refused") for every message (the metrics' counter).
    on_message: Callable[[str, str], None]
    # Hears of every inbound message the allow-lists let through (the event bus).
    on_inbound: Callable[[str, Inbound], None] | None
    # The scoped API key a channel's runs act as ("": the admin's), by channel name.
    key_of: Callable[[str], str]
    sender_limits: channel_overrides.SenderLimits = field(default_factory=channel_overrides.SenderLimits)

    def deliver(self, name: str, msg: Inbound) -> None:
        """Called by adapter readers: allow-list check, then queue (never blocks)."""
        settings = self.sections.get(name, {})
        chosen = self.overrides(name)
        if not msg.conversation.direct and not msg.addressed and not chosen.get("group_policy"):
            return  # group chatter not addressed to the bot: not answered, nor refused
        msg.conversation.shared = not msg.conversation.direct and chosen.get("group_policy") == "shared"
        adapter = self.running.get(name)
        if adapter is not None and approval_command(msg.text) and (
                self.chat_approvals.asked_here(name, msg) or not refusal(settings, msg)):
            # Answered beside the conversation's queue, where the run waiting for it sits;
            # its own check says who may answer (others are told so, not ignored).
            self.dispatcher.submit(f"{msg.conversation.key}:approvals",
                                   lambda: self.chat_approvals.handle(adapter, msg))
            return
        refused = refusal(settings, msg) or channel_overrides.policy_refusal(
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

    def overrides(self, name: str) -> dict[str, Any]:
        """The channel's checked `overrides` table (a running adapter's section passed the check)."""
        try:
            return channel_overrides.check(self.sections.get(name, {}).get("overrides") or {}, name)
        except BadRequest:
            return {}

    def _answer(self, name: str, msg: Inbound) -> None:
        """On a dispatcher worker: run the agent in the conversation's session, reply."""
        adapter = self.running.get(name)
        if adapter is None:
            return
        conversation = msg.conversation
        life = lifecycle.Lifecycle(adapter, msg, self.overrides(name))
        life.received()
        failed = False
        try:
            handle = self._route(name, msg.agent)
            conversation.meta.setdefault("agent", handle.name)
            if msg.text.strip().lower() in ("/new", "/reset"):
                try:  # only this conversation's session: other users keep theirs
                    self.agents.delete_session(session_id(handle.id, conversation.key))
                except NotFound:
                    pass
                reply = "Started a new conversation."
            elif not self.sender_limits.allow(name, msg.sender_id,
                                              int(self.overrides(name).get("rate_limit_per_user") or 0)):
                self.audit("channel.rate_limited", name, {"message_id": msg.message_id, "sender": msg.sender_id})
                reply = channel_overrides.SLOW_DOWN.format(limit=self.overrides(name)["rate_limit_per_user"])
            elif (refused := self._key_refusal(name, key_id := self.key_of(name), handle, msg)) is not None:
                reply = refused
            else:
                text, images = self._take_files(adapter, handle, msg)
                reply = self._run(adapter, handle, conversation, text, msg.sender_id, life, key_id, images) \
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

    def _key_refusal(self, name: str, key_id: str, handle, msg: Inbound) -> str | None:  # type: ignore[no-untyped-def]
        """None when `key_id`, the key channel `name` acts as, may run `handle` now (or the
        channel is the admin's), else the reply saying why not (audited)."""
        if not key_id or self.runs.key_runs is None:
            return None
        try:
            self.runs.key_runs.fields(key_id, handle)
        except AgentdError as exc:
            self.on_message(name, "refused")
            self.audit("channel.refused", name, {"sender": msg.sender_id, "chat": msg.conversation.chat_id,
                                                 "message_id": msg.message_id, "key_id": key_id,
                                                 "reason": exc.message})
            return KEY_REFUSED.format(reason=exc.message)
        return None

    def _may_answer(self, name: str, requester: str) -> Callable[[Inbound], bool]:
        """Who may answer an approval asked in a conversation: the channel's allowed users
        when it lists them, else the person whose message started the run."""
        def allowed(msg: Inbound) -> bool:
            settings = self.sections.get(name, {})
            if any(settings.get(key) for key in USER_LISTS):
                return not refusal(settings, msg)
            return msg.sender_id == requester
        return allowed

    def _take_files(self, adapter: Adapter, handle, msg: Inbound) -> tuple[str, list[dict[str, Any]]]:  # type: ignore[no-untyped-def]
        """The message's text with a note per file, and the images for the model; a file not
        taken is said to the sender at once (and audited)."""
        text = lifecycle.text_of(msg)
        if not msg.attachments or self.files is None:
            return text, []
        got = self.files.receive(adapter.file_hosts(), handle, msg.attachments, self.max_file_bytes,
                                 model=self.overrides(adapter.name).get("model", ""))
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
             sender: str, life: lifecycle.Lifecycle, key_id: str,
             images: list[dict[str, Any]] | None = None) -> str:
        chosen = self.overrides(adapter.name)
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
                                                session_id=session_id(handle.id, conversation.key),
                                                label=conversation.key,
                                                owner=f"channel:{adapter.name}:{sender}",
                                                key_id=key_id,
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
