"""A channel's allow lists: which senders and chats its section lets talk to the agents,
and whom an agent may send to through it."""

from __future__ import annotations

from typing import Any

from agentd.channels.adapter import Inbound
from agentd.channels.catalog import CHAT_LISTS, USER_LISTS


def refusal(settings: dict[str, Any], msg: Inbound) -> str:
    """Why the section `settings` refuses `msg` ("" when it lets it through)."""
    users = [u.lower() for key in USER_LISTS for u in settings.get(key) or []]
    names = {n.lower() for n in (msg.sender_id, *msg.sender_aliases) if n}
    if users and not any(n in users or ("@" in n and "@" + n.split("@", 1)[1] in users) for n in names):
        return "sender not in allowed_users"
    chats = [c.lower() for key in CHAT_LISTS for c in settings.get(key) or []]
    where = {c.lower() for c in (msg.conversation.chat_id, *msg.chat_aliases) if c}
    if chats and not msg.conversation.direct and not where & set(chats):
        return "chat not in allowed_channels"
    return ""


def recipients(settings: dict[str, Any]) -> set[str]:
    """Every sender and chat the section's allow lists name, lower-cased (empty: no lists)."""
    return {v.lower() for key in (*USER_LISTS, *CHAT_LISTS) for v in settings.get(key) or []}
