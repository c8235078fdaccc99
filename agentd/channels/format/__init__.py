"""Replies in each platform's own format, split at its limit.

`render(markdown, target, limit, unit)` parses the agent's Markdown once, cuts it into
parts that fit `limit` (measured in `unit` on the rendered text) and renders each part
for the target; every part also carries its plain-text version (Matrix sends both).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentd.channels.format.discord import Discord
from agentd.channels.format.document import Block, parse
from agentd.channels.format.layout import LineTarget
from agentd.channels.format.markdown import Markdown
from agentd.channels.format.matrix import MatrixHtml
from agentd.channels.format.plain import Plain
from agentd.channels.format.slack import Slack
from agentd.channels.format.splitter import split
from agentd.channels.format.telegram import TelegramHtml
from agentd.channels.format.whatsapp import WhatsApp
from agentd.channels.format.units import BYTES, CHARS, UNITS, UTF16, measure

TARGETS: dict[str, LineTarget] = {t.name: t for t in (Plain(), Markdown(), Slack(), TelegramHtml(),
                                                      MatrixHtml(), Discord(), WhatsApp())}
# `overrides.output_format`: the platform's own format (native), or one format everywhere;
# plain_text and slack_mrkdwn are other names of plain and slack.
ALIASES = {"plain_text": "plain", "slack_mrkdwn": "slack"}
OUTPUT_FORMATS = ("native", *TARGETS, *ALIASES)

__all__ = ["BYTES", "CHARS", "OUTPUT_FORMATS", "TARGETS", "UNITS", "UTF16", "Part", "measure",
           "render", "target_for"]


@dataclass(frozen=True)
class Part:
    """One message: `text` in the target's format, `plain` the same part as plain text."""

    text: str
    plain: str
    format: str


def target_for(native: str, output_format: str | None) -> str:
    """The target a channel writes in: its platform's (`native`) unless overridden."""
    if output_format in (None, "", "native"):
        return native
    return ALIASES.get(output_format, output_format)


def render(markdown: str, target: str, limit: int, unit: str = CHARS, both: bool = False) -> list[Part]:
    """`markdown` in `target`'s format, in parts of at most `limit` `unit`s each.

    With `both`, the limit holds for a part's text and its plain version together (one
    Matrix event carries both).
    """
    writer, plain = TARGETS[target], TARGETS["plain"]

    def size(blocks: list[Block]) -> int:
        total = measure(writer.render(blocks), unit)
        return total + measure(plain.render(blocks), unit) if both else total

    blocks = parse(markdown)
    if not blocks:
        return []
    parts = split(blocks, lambda part: size(part) <= limit, limit)
    return [Part(writer.render(part), plain.render(part), target) for part in parts]
