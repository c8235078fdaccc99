"""A channel's allow lists: which senders and chats its section lets talk to the agents,
and whom an agent may send to through it."""

from __future__ import annotations

from typing import Any

from agentd.channels.adapter import Inbound
from agentd.channels.catalog import CHAT_LISTS, USER_LISTS


def refusal(settings: dict[str, Any], msg: Inbound) -> str:
    """Why the section `settings` refuses `msg` ("" when it lets it through)."""
    users = _entries(settings, USER_LISTS)
    if users and not _names_sender(users, {n.lower() for n in (msg.sender_id, *msg.sender_aliases) if n}):
        return "sender not in allowed_users"
    chats = _entries(settings, CHAT_LISTS)
    where = {c.lower() for c in (msg.conversation.chat_id, *msg.chat_aliases) if c}
    if chats and not msg.conversation.direct and not where & set(chats):
        return "chat not in allowed_channels"
    return ""


def admits(settings: dict[str, Any], recipient: str) -> bool:
    """Whether an agent may send to `recipient` through the section: a sender its sender lists
    let in (matched as incoming messages are) or a chat its chat lists name; anyone when it
    has no lists."""
    users, chats, name = _entries(settings, USER_LISTS), _entries(settings, CHAT_LISTS), recipient.lower()
    return (not users and not chats) or _names_sender(users, {name}) or name in chats


def _entries(settings: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    return [v.lower() for key in keys for v in settings.get(key) or []]


def _names_sender(users: list[str], names: set[str]) -> bool:
    """Whether `users` names one of `names`; a `@domain` entry names every address at that domain."""
    return any(n in users or ("@" in n and "@" + n.split("@", 1)[1] in users) for n in names)


def recipients(settings: dict[str, Any]) -> set[str]:
    """Every sender and chat the section's allow lists name, lower-cased (empty: no lists)."""
    return {v.lower() for key in (*USER_LISTS, *CHAT_LISTS) for v in settings.get(key) or []}
