"""Approvals in the chat: a Manual-mode agent's tool call behind a channel is asked for in
the conversation the message came from, and answered there.

The approval itself is the kernel's (`ApprovalQueue`): the dashboard and `/api/approvals`
see it, and a decision taken there or in the chat is the one decision. Platforms with
buttons post Approve/Reject buttons (their press comes back as `/approve <id>` with the
interaction's details); elsewhere the request says to reply `/approve <id>` or
`/reject <id>`. Only the conversation's allowed users may answer: the channel's user
allow-list when it has one, otherwise the person whose message started the run.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable

from agentd.agents.approvals import ApprovalQueue
from agentd.agents.events import Event
from agentd.channels.adapter import Adapter, Conversation, Inbound
from agentd.errors import AgentdError

log = logging.getLogger("agentd.channels")
# `/approve <id>`; `!approve` too, for clients (IRC, Matrix) that take `/word` as their own command.
# `/deny` is the word people reach for as often as `/reject`: both reject. Telegram's clients
# address a command to one bot of a group as `/approve@botname`.
COMMAND = re.compile(r"^\s*[/!](approve|reject|deny)(?:@[A-Za-z0-9_]+)?\s+([0-9a-fA-F-]{6,64})\s*$")
NOT_ALLOWED = ("Sorry, you cannot answer this approval: only the people allowed to use this "
               "conversation with the agent can.")
UNKNOWN = "There is no pending approval {id} in this conversation (it may have been decided already)."
DONE = {"approved": "✅ Approved: {tool} runs now (approval {id}, by {who}).",
        "rejected": "❌ Rejected: {tool} will not run (approval {id}, by {who})."}
ELSEWHERE = {"approved": "✅ Approved outside the chat: {tool} runs now (approval {id}).",
             "rejected": "❌ Rejected outside the chat: {tool} will not run (approval {id}).",
             "timeout": "⌛ Nobody answered in time: {tool} did not run (approval {id}).",
             "cancelled": "The run stopped: {tool} did not run (approval {id})."}
INPUT_SHOWN = 600  # characters of the tool's input shown in the request


@dataclass
class Asked:
    """An approval asked for in one conversation (a channel's chat) and who may answer it."""

    channel: str
    chat_id: str
    allowed: Callable[[Inbound], bool]


def request_text(agent: str, tool: str, args: dict[str, Any]) -> str:
    shown = json.dumps(args, ensure_ascii=False, sort_keys=True)
    if len(shown) > INPUT_SHOWN:
        shown = shown[:INPUT_SHOWN] + "…"
    return f"🔐 Approval needed: agent {agent} wants to run {tool} with {shown}"


def parse(text: str) -> tuple[str, str] | None:
    """("approve" | "reject", id) for an approval command, else None. Only the first line
    counts: an email reply quotes the request below the answer."""
    first = next((line for line in (text or "").splitlines() if line.strip()), "")
    match = COMMAND.match(first)
    if not match:
        return None
    verb = "reject" if match.group(1) == "deny" else match.group(1)
    return verb, match.group(2).replace("-", "").lower()


class ChatApprovals:
    """Approvals asked in chats, and the answers given there."""

    def __init__(self, approvals: ApprovalQueue, audit: Callable[[str, str, dict[str, Any]], None]) -> None:
        self.approvals = approvals
        self.audit = audit
        self._asked: dict[str, Asked] = {}
        self._decided: set[str] = set()  # approvals decided in a chat, until their run hears of it
        self._lock = threading.Lock()

    def sink(self, adapter: Adapter, conversation: Conversation, agent: str,
             allowed: Callable[[Inbound], bool], on_wait: Callable[[bool], None]) -> tuple[
                 Callable[[Event], None], Callable[[], None]]:
        """The run's event sink, which asks in the chat when a tool call awaits approval,
        and the function that forgets this run's requests when it ends. `on_wait(True)` is
        told while a human is asked (the typing indicator pauses), `on_wait(False)` after."""
        mine: list[str] = []
        # (approval id, tool, the request's message id, the run's own Approval, decided once woken)
        waiting: list[tuple[str, str, str, Any]] = []

        def settle() -> None:
            """The approval being waited on is decided: say so where it was not decided in the chat."""
            approval_id, tool, request_id, approval = waiting.pop()
            on_wait(False)
            with self._lock:
                answered_here = approval_id in self._decided
                self._decided.discard(approval_id)
            decision = getattr(approval, "decision", None)
            if answered_here or decision not in ELSEWHERE:
                return
            try:
                adapter.settle_approval(conversation, request_id,
                                        ELSEWHERE[decision].format(tool=tool, id=approval_id))
            except Exception as exc:  # noqa: BLE001 - the run goes on; only the note is lost
                log.info("channel %s: approval outcome not posted: %s", adapter.name, exc)

        def emit(event: Event) -> None:
            data = event.data
            if event.type != "phase" or data.get("phase") != "awaiting_approval" or not data.get("approval_id"):
                if waiting:  # the run goes on: the approval is decided
                    settle()
                return
            approval_id = str(data["approval_id"])
            tool = str(data.get("detail") or "").split(" (approval", 1)[0]
            args = next((a.get("input") for a in self.approvals.pending() if a["id"] == approval_id), {}) or {}
            with self._lock:
                self._asked[approval_id] = Asked(adapter.name, conversation.chat_id, allowed)
            mine.append(approval_id)
            on_wait(True)
            try:
                sent = adapter.send_approval(conversation, approval_id, request_text(agent, tool, args))
            except Exception as exc:  # noqa: BLE001 - the dashboard can still decide it
                log.warning("channel %s: approval request not posted: %s", adapter.name, exc)
                self.audit("channel.send_failed", adapter.name, {"approval": approval_id, "error": str(exc)[:300]})
                return
            waiting.append((approval_id, tool, sent, self.approvals.local(approval_id)))
            self.audit("channel.approval_asked", adapter.name, {"approval": approval_id, "tool": tool,
                                                                "conversation": conversation.key,
                                                                "message_id": sent})

        def forget() -> None:
            if waiting:  # the run ended while waiting (stopped, or its last event was this)
                settle()
            with self._lock:
                for approval_id in mine:
                    self._asked.pop(approval_id, None)

        return emit, forget

    def asked_here(self, channel: str, msg: Inbound) -> bool:
        """Whether `msg` names an approval asked in its own conversation."""
        command = parse(msg.text)
        with self._lock:
            asked = self._asked.get(command[1]) if command else None
        return asked is not None and asked.channel == channel and asked.chat_id == msg.conversation.chat_id

    def handle(self, adapter: Adapter, msg: Inbound) -> bool:
        """Answer `msg` when it is an approval command (True: it was, nothing else to do)."""
        command = parse(msg.text)
        if command is None:
            return False
        verb, approval_id = command
        with self._lock:
            asked = self._asked.get(approval_id)
        if asked is None or asked.channel != adapter.name or asked.chat_id != msg.conversation.chat_id:
            self._answer(adapter, msg, UNKNOWN.format(id=approval_id), final=False)
            return True
        if not asked.allowed(msg):
            self.audit("channel.refused", adapter.name, {"sender": msg.sender_id, "approval": approval_id,
                                                         "chat": msg.conversation.chat_id,
                                                         "reason": "sender may not answer this approval"})
            self._answer(adapter, msg, NOT_ALLOWED, final=False)
            return True
        with self._lock:  # before the decision: the run it wakes must know it was taken here
            self._decided.add(approval_id)
        try:
            decided = (self.approvals.approve if verb == "approve" else self.approvals.reject)(approval_id)
        except AgentdError as exc:  # decided meanwhile (dashboard, API, another person)
            with self._lock:
                self._asked.pop(approval_id, None)
                self._decided.discard(approval_id)
            self._answer(adapter, msg, f"{UNKNOWN.format(id=approval_id)} ({exc.message})", final=True)
            return True
        with self._lock:
            self._asked.pop(approval_id, None)
        who = msg.sender_name or msg.sender_id
        self.audit("channel.approval", adapter.name, {"approval": approval_id, "decision": decided.decision,
                                                      "tool": decided.tool, "sender": msg.sender_id})
        self._answer(adapter, msg, DONE[str(decided.decision)].format(tool=decided.tool, id=approval_id, who=who),
                     final=True)
        return True

    @staticmethod
    def _answer(adapter: Adapter, msg: Inbound, text: str, final: bool) -> None:
        try:
            if msg.interaction and adapter.answer_interaction(msg, text, final):
                return
            adapter.send(msg.conversation, text)
        except Exception as exc:  # noqa: BLE001 - the decision stands; only the note is lost
            log.warning("channel %s: approval answer not posted: %s", adapter.name, exc)
