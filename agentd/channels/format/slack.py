"""Slack mrkdwn: *bold*, _italic_, ~strike~, `code`, ```blocks```, <url|text> links.

Slack reads `&`, `<` and `>` as control characters, so text escapes exactly those three.
"""

from __future__ import annotations

from agentd.channels.format.document import EM, STRIKE, STRONG, Span
from agentd.channels.format.layout import LineTarget


class Slack(LineTarget):
    name = "slack"
    wraps = {STRONG: ("*", "*"), EM: ("_", "_"), STRIKE: ("~", "~")}
    word_bound = True

    def escape(self, text: str) -> str:
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    def inline_code(self, text: str) -> str:
        return f"`{self.escape(text)}`"

    def link(self, label: str, raw: str, href: str) -> str:
        target = self.escape(href).replace("|", "%7C")
        if raw.strip() == href:
            return f"<{target}>"
        # "|" ends the address part of a Slack link; the label shows a look-alike.
        return f"<{target}|{label.replace('|', chr(0x2223))}>"

    def heading(self, spans: list[Span], level: int) -> str:
        return self.spans([Span(s.text, s.marks | {STRONG}, s.href, s.brk) for s in spans])

    def code_block(self, code: str, lang: str) -> str:
        return f"```\n{self.escape(code)}\n```"
