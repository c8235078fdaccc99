"""Adapter implementations, one module per platform; `load(name)` imports lazily."""

from __future__ import annotations

import importlib

# Chat and line-socket adapters.
IMPLEMENTED = ("irc", "email", "webhook", "telegram", "matrix", "ntfy", "gotify", "mattermost")
# Polling, line-socket and real-server adapters.
IMPLEMENTED += ("signal", "zulip", "discourse", "rocketchat", "nextcloud", "reddit", "bluesky", "twist", "linkedin", "keybase", "twitch", "xmpp", "mumble")
# Enterprise webhook adapters (teams, google_chat, feishu, dingtalk).
IMPLEMENTED += ("dingtalk", "feishu", "teams", "google_chat")

# The signed-webhook family (LINE, Messenger, ...), kept on its own line.
WEBHOOK_FAMILY = ("line", "messenger", "whatsapp", "viber")
# The streaming/relay family, kept on its own line.
IMPLEMENTED += ("webex", "mastodon", "nostr", "gitter")
# Gateway WebSocket adapters.
IMPLEMENTED += ("discord", "guilded", "revolt", "slack")
# More signed webhooks: Threema Gateway, Pumble, Flock.
WEBHOOK_FAMILY += ("threema", "pumble", "flock")


# Every adapter of the catalog (agentd/data/channels.json): all 40 exist.
ADAPTERS = frozenset(IMPLEMENTED + WEBHOOK_FAMILY)


def has(name: str) -> bool:
    """Whether an adapter module exists for `name` (every catalog channel has one)."""
    return name in ADAPTERS


def load(name: str) -> type:
    """The adapter class for `name` (a catalog name; anything else is a KeyError)."""
    if name not in ADAPTERS:
        raise KeyError(f"no channel adapter {name!r}")
    module = importlib.import_module(f"agentd.channels.adapters.{name}")
    return module.ADAPTER
