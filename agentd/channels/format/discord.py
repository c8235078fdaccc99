"""Discord Markdown: CommonMark as Discord draws it, with mentions that never ping.

`@everyone`, `@here` and `<@id>`/`<@&id>` in the agent's text get a zero-width space, so
they read the same but are not mentions; the sender also sends `allowed_mentions` empty.
"""

from __future__ import annotations

import re

from agentd.channels.format.document import Span
from agentd.channels.format.markdown import Markdown

MENTION = re.compile(r"@(everyone|here)\b|<@")
ZWSP = "\u200b"


def neutralise(text: str) -> str:
    return MENTION.sub(lambda m: "@" + ZWSP + m.group(1) if m.group(1) else "<" + ZWSP + "@", text)


class Discord(Markdown):
    name = "discord"

    def escape(self, text: str) -> str:
        # "||" opens and closes a spoiler on Discord, not in CommonMark.
        return neutralise(super().escape(text)).replace("||", "\\|\\|")

    def heading(self, spans: list[Span], level: int) -> str:
        # Discord draws three heading sizes.
        return "#" * min(level, 3) + " " + self.spans(spans)

    def destination(self, href: str) -> str:
        # <url> keeps Discord from unfurling every link of a reply into an embed.
        return f"<{href}>"
