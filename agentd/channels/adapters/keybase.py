"""Keybase: its chat API exists only inside the Keybase client (`keybase chat api`,
JSON list/read/send over the client's local socket after a paper-key login), a
binary agentd does not ship and cannot replace. The adapter validates and saves its
configuration, never pretends to connect: start() and the test call answer with what
is missing."""

from __future__ import annotations

import shutil

from agentd.channels.adapter import Adapter, ChannelError, Conversation
from agentd.channels.adapters import UNAVAILABLE

MISSING = UNAVAILABLE["keybase"]


class KeybaseAdapter(Adapter):
    max_message_len = 10_000

    def start(self) -> None:
        raise ChannelError(self._why())

    def _why(self) -> str:
        if not self.settings.get("username"):
            return "keybase: username is not set; " + MISSING
        if shutil.which("keybase") is None:
            return "keybase: the `keybase` client binary was not found on PATH; " + MISSING
        return "keybase: " + MISSING

    def send(self, conversation: Conversation, text: str) -> str:
        raise ChannelError(self._why())

    def test_target(self, override: str = "") -> Conversation:
        # The target is fine; what fails is delivery (send), so the test call answers 502.
        return Conversation(self.name, override or str(self.settings.get("username") or "keybase"))

    def health(self) -> bool:
        return False


ADAPTER = KeybaseAdapter
