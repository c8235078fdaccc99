"""Guilded: the platform is gone. Roblox shut Guilded down on 19 December 2025 (website,
apps and the bot API: `wss://www.guilded.gg/websocket/v1` and the REST API behind it),
so there is nothing left to connect to. Sources: https://probsee.com/p/Guilded and
https://paragraph.com/@littlebit670/the-death-of-guilded ("being shut down on December
19, 2025"). The adapter validates and saves its configuration and never pretends to
connect: start() and the test call say why."""

from __future__ import annotations

from agentd.channels.adapter import Adapter, ChannelError, Conversation
from agentd.channels.adapters import UNAVAILABLE

GONE = "guilded: " + UNAVAILABLE["guilded"]


class GuildedAdapter(Adapter):
    max_message_len = 4000

    def start(self) -> None:
        raise ChannelError(GONE)

    def send(self, conversation: Conversation, text: str) -> str:
        raise ChannelError(GONE)

    def test_target(self, override: str = "") -> Conversation:
        # The target is not the problem; delivery is, so the test call answers 502.
        return Conversation(self.name, override or "guilded")

    def health(self) -> bool:
        return False


ADAPTER = GuildedAdapter
