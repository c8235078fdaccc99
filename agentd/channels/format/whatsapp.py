"""WhatsApp's own markup: *bold*, _italic_, ~strike~, `code`, ```monospace``` blocks;
links are shown as addresses (WhatsApp has no link text)."""

from __future__ import annotations

from agentd.channels.format.document import EM, STRIKE, STRONG, Span
from agentd.channels.format.plain import Plain


class WhatsApp(Plain):
    name = "whatsapp"
    wraps = {STRONG: ("*", "*"), EM: ("_", "_"), STRIKE: ("~", "~")}
    word_bound = True

    def inline_code(self, text: str) -> str:
        return f"`{text}`"

    def heading(self, spans: list[Span], level: int) -> str:
        return self.spans([Span(s.text, s.marks | {STRONG}, s.href, s.brk) for s in spans])

    def code_block(self, code: str, lang: str) -> str:
        return f"```{code}```"
