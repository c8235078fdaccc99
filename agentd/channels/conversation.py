"""Which session a channel message belongs to, and which adapters can honour the
thread and mention settings.

A direct chat is one conversation per person; a group chat is one per sender unless the
channel's `group_policy` is `shared`; a thread (Slack thread_ts, Discord threads, Matrix
`m.thread`, Telegram forum topics, Zulip topics, email reply chains...) is a conversation
of its own. The key names all of that, so two people or two threads never share a
session (nor, through the sender as memory owner, each other's recalled fragments).
"""

from __future__ import annotations

import re
from typing import Any

# Adapters that tell whether the bot was mentioned or replied to (`Inbound.mentioned`):
# only these accept the `mention-only` policy.
MENTION_ADAPTERS = frozenset({
    "slack", "discord", "telegram", "matrix", "mattermost", "zulip", "irc", "xmpp", "teams",
    "rocketchat", "nextcloud", "revolt", "pumble",
})
# Adapters whose platform hands the bot only the group messages that address it (mentions and
# replies, a robot's @-callbacks): `group_policy` respond / shared could answer nothing more, so
# they are refused there.
ADDRESSED_ONLY = frozenset({"mastodon", "bluesky", "nostr", "webex", "google_chat", "dingtalk"})
# Adapters that can answer either in a thread under the message or in the channel itself:
# only these accept the `threading` override.
THREAD_ADAPTERS = frozenset({"slack", "discord", "matrix", "mattermost", "rocketchat", "telegram"})


def without_mention(text: str, mention: str) -> str:
    """`text` without the bot's mention (`mention`, a pattern, case ignored) and the blanks after
    it; its lines and indentation stay, so pasted code and lists reach the agent as written."""
    return re.sub(rf"(?:{mention})[ \t]*", "", text, flags=re.IGNORECASE).strip()


def key_of(channel: str, chat_id: str, user_id: str, direct: bool, thread_id: str = "",
           shared: bool = False) -> str:
    """The conversation key: one session of the routed agent per key."""
    if direct:
        key = f"{channel}:dm:{user_id or chat_id}"
    else:
        key = f"{channel}:chat:{chat_id}"
    if thread_id:
        key += f":thread:{thread_id}"
    if not direct and user_id and not shared:
        key += f":user:{user_id}"
    return key


def threaded(settings: dict[str, Any], default: bool) -> bool:
    """Whether a group message not already in a thread is answered in a new thread under it:
    the channel's `overrides.threading` when set, else the adapter's own default."""
    chosen = (settings.get("overrides") or {}).get("threading")
    return default if chosen is None else bool(chosen)


def reply_thread(settings: dict[str, Any], existing: str, message_id: str, direct: bool,
                 default: bool) -> str:
    """The thread a reply goes into: the message's own thread when it is in one; else a new
    thread under the message when threading is on (never in direct chats); else none."""
    if existing:
        return existing
    if direct or not threaded(settings, default):
        return ""
    return message_id
