"""What a user sees of a message's life besides the reply: the typing indicator while
the agent works (`typing_mode`) and the bot's reactions on their message
(`lifecycle_reactions`: 👀 when taken, ✅ when answered, ⚠️ when the run failed).

Which adapters can show them is the table below (docs/channels/index.md shows it too); the
two overrides are refused at configure time on an adapter that cannot.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from agentd.channels.adapter import Adapter, Conversation, Inbound
from agentd.errors import BadRequest

log = logging.getLogger("agentd.channels")

# Adapters whose platform API has a typing indicator for bots, implemented by `send_typing`.
TYPING = frozenset({"discord", "gitter", "line", "matrix", "mattermost", "messenger", "revolt", "signal", "teams", "telegram",
                    "whatsapp", "xmpp", "zulip"})
# Adapters whose platform lets a bot react to a user's message, implemented by `react`.
REACTIONS = frozenset({"discord", "feishu", "gitter", "matrix", "mattermost", "nextcloud", "nostr", "revolt", "rocketchat", "signal",
                       "slack", "telegram", "twist", "whatsapp", "xmpp", "zulip"})

TYPING_MODES = ("instant", "never")
STAGES = ("received", "answered", "failed")
DEFAULT_REACTIONS = {"received": "👀", "answered": "✅", "failed": "⚠️"}
# Telegram bots may react only with the emoji of its fixed list, which has neither ✅ nor ⚠️.
PLATFORM_REACTIONS = {"telegram": {"answered": "👍", "failed": "😢"}}
# Platforms that name their emoji (Slack, Mattermost, Zulip): the names of the defaults.
EMOJI_NAMES = {"👀": "eyes", "✅": "white_check_mark", "⚠️": "warning", "⚠": "warning", "👍": "+1",
               "😢": "cry", "❌": "x", "🤔": "thinking_face", "🎉": "tada"}
TYPING_EVERY = 4.0  # seconds: platforms drop an indicator after 5-10 s unless it is sent again


def check_typing_mode(channel: str, value: Any) -> str:
    name = "overrides.typing_mode"
    if channel and channel not in TYPING:
        raise BadRequest(f"{name}: not implemented by the {channel} adapter (its platform shows bots no "
                         "typing indicator); remove it")
    if value not in TYPING_MODES:
        raise BadRequest(f"{name}: must be one of {', '.join(TYPING_MODES)}")
    return str(value)


def check_reactions(channel: str, value: Any) -> bool | dict[str, str]:
    name = "overrides.lifecycle_reactions"
    if channel and channel not in REACTIONS:
        raise BadRequest(f"{name}: not implemented by the {channel} adapter (its platform has no reactions "
                         "for bots); remove it")
    if isinstance(value, bool):
        return value
    if not isinstance(value, dict) or not value:
        raise BadRequest(f"{name}: must be true, false or a table of emoji by stage "
                         f"({', '.join(STAGES)})")
    out = {}
    for stage, emoji in value.items():
        if stage not in STAGES:
            raise BadRequest(f"{name}.{stage}: unknown stage (accepted: {', '.join(STAGES)})")
        if not isinstance(emoji, str) or len(emoji) > 64:
            raise BadRequest(f"{name}.{stage}: must be an emoji (\"\" for no reaction at that stage)")
        out[stage] = emoji.strip()
    return out


def emoji_name(emoji: str, names: dict[str, str] | None = None) -> str:
    """The platform's name for `emoji` (`names` first, then the common ones); a name given
    as `:name:` or `name` passes through."""
    return (names or {}).get(emoji) or EMOJI_NAMES.get(emoji) or emoji.strip(":")


def reactions_for(channel: str, value: Any) -> dict[str, str]:
    """The emoji of each stage for `lifecycle_reactions` = `value` ({} when off)."""
    if not value:
        return {}
    chosen = {**DEFAULT_REACTIONS, **PLATFORM_REACTIONS.get(channel, {})}
    if isinstance(value, dict):
        chosen.update(value)
    return {stage: emoji for stage, emoji in chosen.items() if emoji}


EDITED = "(I edited my earlier message; its new text follows.)\n"


def text_of(msg: Inbound) -> str:
    """What the agent is asked: an edited message is answered as a new one that says so."""
    return EDITED + msg.text if msg.edited else msg.text


class Lifecycle:
    """One inbound message's typing indicator and reactions."""

    def __init__(self, adapter: Adapter, msg: Inbound, overrides: dict[str, Any]) -> None:
        self.adapter = adapter
        self.msg = msg
        self.typing_on = overrides.get("typing_mode", "instant") != "never"
        self.emoji = reactions_for(adapter.name, overrides.get("lifecycle_reactions"))
        self._done = threading.Event()
        self._paused = threading.Event()
        self._shown = ""

    def received(self) -> None:
        if self.msg.edited and self.emoji and self.msg.message_id:
            # Answered again: the outcome shown for the first version is taken back.
            for stage in ("answered", "failed"):
                try:
                    if self.emoji.get(stage):
                        self.adapter.unreact(self.msg.conversation, self.msg.message_id, self.emoji[stage])
                except Exception as exc:  # noqa: BLE001 - cosmetic, as below
                    log.info("channel %s: reaction not taken back: %s", self.adapter.name, exc)
        self._react("received")

    def finished(self, ok: bool) -> None:
        """The reply went out (`ok`) or the run failed."""
        self._react("answered" if ok else "failed")

    def _react(self, stage: str) -> None:
        emoji = self.emoji.get(stage)
        if not emoji or not self.msg.message_id or self.msg.interaction:
            return
        conversation = self.msg.conversation
        try:
            if self._shown and self._shown != emoji:
                self.adapter.unreact(conversation, self.msg.message_id, self._shown)
            self.adapter.react(conversation, self.msg.message_id, emoji)
            self._shown = emoji
        except Exception as exc:  # noqa: BLE001 - a reaction is cosmetic: the reply matters
            log.info("channel %s: %s reaction not shown: %s", self.adapter.name, stage, exc)

    # -- typing ------------------------------------------------------------------------
    def start_typing(self) -> None:
        if self.typing_on:
            threading.Thread(target=self._typing, args=(self.msg.conversation,),
                             name=f"channel-{self.adapter.name}-typing", daemon=True).start()

    def pause_typing(self, paused: bool) -> None:
        """While a human is asked to approve a tool call, the agent is not typing."""
        (self._paused.set if paused else self._paused.clear)()

    def stop_typing(self) -> None:
        self._done.set()

    def _typing(self, conversation: Conversation) -> None:
        while not self._done.is_set():
            if not self._paused.is_set():
                try:
                    self.adapter.send_typing(conversation)
                except Exception as exc:  # noqa: BLE001 - typing is cosmetic
                    log.debug("typing indicator failed: %s", exc)
            if self._done.wait(TYPING_EVERY):
                return
