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


# Adapters whose module exists but cannot connect, and why: the catalogue reports them
# `implemented: false` with this reason, and their start() and test call say the same.
UNAVAILABLE = {
    "guilded": ("Guilded shut down on 19 December 2025 (Roblox ended the service, its bot API "
                "included), so this adapter cannot connect; the configuration is kept but no message "
                "can be received or sent"),
    "keybase": ("keybase needs the Keybase client: install the `keybase` binary, log in the bot account "
                "(`keybase oneshot` with the paper key) and run its service; agentd has no built-in "
                "Keybase client, so this adapter cannot connect"),
}


def why_unavailable(name: str) -> str:
    """Why the adapter `name` cannot connect ("" when it can)."""
    return UNAVAILABLE.get(name, "")


def has(name: str) -> bool:
    """Whether an adapter module exists for `name` (every catalog channel has one)."""
    return name in ADAPTERS


def load(name: str) -> type:
    """The adapter class for `name` (a catalog name; anything else is a KeyError)."""
    if name not in ADAPTERS:
        raise KeyError(f"no channel adapter {name!r}")
    module = importlib.import_module(f"agentd.channels.adapters.{name}")
    return module.ADAPTER
