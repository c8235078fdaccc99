"""Telegram HTML (`parse_mode: HTML`): the tags the Bot API accepts, everything else escaped."""

from __future__ import annotations

import html

from agentd.channels.format.document import EM, STRIKE, STRONG, Block, Span
from agentd.channels.format.layout import LineTarget


class TelegramHtml(LineTarget):
    name = "telegram_html"
    wraps = {STRONG: ("<b>", "</b>"), EM: ("<i>", "</i>"), STRIKE: ("<s>", "</s>")}

    def escape(self, text: str) -> str:
        return html.escape(text, quote=False)

    def inline_code(self, text: str) -> str:
        return f"<code>{self.escape(text)}</code>"

    def link(self, label: str, raw: str, href: str) -> str:
        return f'<a href="{html.escape(href, quote=True)}">{label}</a>'

    def heading(self, spans: list[Span], level: int) -> str:
        return f"<b>{self.spans(spans)}</b>"

    def code_block(self, code: str, lang: str) -> str:
        if lang:
            return f'<pre><code class="language-{html.escape(lang, quote=True)}">{self.escape(code)}</code></pre>'
        return f"<pre>{self.escape(code)}</pre>"

    def quote(self, lines: list[str], depth: int) -> str:
        # Telegram has one level of quote; deeper quotes read the same.
        text = "\n".join(lines)
        return f"<blockquote>{text}</blockquote>" if depth else text

    def render(self, blocks: list[Block]) -> str:
        # Adjacent quoted blocks make one quote, not a stack of them.
        return super().render(blocks).replace("</blockquote>\n\n<blockquote>", "\n\n")
