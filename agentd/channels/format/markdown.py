"""CommonMark again, written from the parsed blocks (so a split part is valid Markdown on
its own): for platforms that render Markdown themselves."""

from __future__ import annotations

import re

from agentd.channels.format.document import EM, STRIKE, STRONG, Span
from agentd.channels.format.layout import LineTarget

# What would be read as markup: emphasis and code marks; a "_" unless it sits between two
# letters or digits (intraword, where it never starts emphasis); a "]" that could close a
# link or a reference ("](", "][", "]:", or the text's end); a "<" that could open an
# autolink, tag or mention, an "&" that could be an entity. Other characters stay bare,
# so "[helper]" or "file_name" read as written where a platform shows the text raw.
SPECIAL = re.compile(r"([\\`*~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|\](?=[(\[:]|\Z)|<(?=[A-Za-z/!?@#:])|&(?=#?\w+;))")
# What would open a block at a line's start: a heading, quote or bullet mark; a line of
# "-" or "=" (a rule or a heading's underline); an ordered item's number, whose "." or ")"
# takes the backslash (CommonMark escapes punctuation only: a backslash before a digit is
# shown as it is).
LINE_START = re.compile(r"^(\s*)(?:([#>+-])(?=\s|$)|([-=])(?=[-= \t]*$)|(\d+)([.)])(?=\s|$))", re.M)


def _escaped_start(match: re.Match[str]) -> str:
    indent, mark, line, number, dot = match.groups()
    if number:
        return f"{indent}{number}\\{dot}"
    return f"{indent}\\{mark or line}"


class Markdown(LineTarget):
    name = "markdown"
    bullet = "-"
    wraps = {STRONG: ("**", "**"), EM: ("*", "*"), STRIKE: ("~~", "~~")}

    def escape(self, text: str) -> str:
        return LINE_START.sub(_escaped_start, SPECIAL.sub(r"\\\1", text))

    def code_escape(self, text: str) -> str:
        return text

    def inline_code(self, text: str) -> str:
        ticks = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
        pad = " " if text.startswith("`") or text.endswith("`") else ""
        return f"{ticks}{pad}{text}{pad}{ticks}"

    def link(self, label: str, raw: str, href: str) -> str:
        if raw in (href, href.removeprefix("mailto:")) and not re.search(r"[\s<>]", href):
            return f"<{href}>"
        return f"[{label}]({self.destination(href)})"

    def destination(self, href: str) -> str:
        return f"<{href}>" if re.search(r"[\s()<>]", href) else href

    def heading(self, spans: list[Span], level: int) -> str:
        return "#" * level + " " + self.spans(spans)

    def code_block(self, code: str, lang: str) -> str:
        fence = "`" * max(3, max((len(run) + 1 for run in re.findall(r"^`{3,}", code, re.M)), default=3))
        return f"{fence}{lang}\n{code}\n{fence}"

    def rule(self) -> str:
        return "---"
