"""What the line-based targets share: blocks laid out as lines, with list bullets,
indentation and quote prefixes; each target says how to write spans and code."""

from __future__ import annotations

from itertools import groupby

from agentd.channels.format.document import CODE, EM, STRIKE, STRONG, Block, Span

# Invisible: a zero-width space parts a marker from a letter (a word's edge to platforms
# whose markers count only there); a word joiner on both sides of a literal marker keeps
# it off a word's edge, whether the platform reads the joiner as a letter or as a space.
ZWSP, WJ = "\u200b", "\u2060"


class LineTarget:
    """Renders blocks one after another; subclasses write the inline parts."""

    name = ""
    bullet = "•"
    quote_prefix = "> "
    # The marks in the order they nest, outermost first, with their opening/closing text.
    wraps: dict[str, tuple[str, str]] = {}
    # Markers that count only at a word's edge (Slack, WhatsApp), which have no escape.
    word_bound = False

    def render(self, blocks: list[Block]) -> str:
        out: list[str] = []
        previous: Block | None = None
        for block in blocks:
            if previous is not None:
                # Items of a list follow each other line by line; anything else, an item's
                # second paragraph included, stands apart.
                tight = block.item and bool(previous.lists) and block.quote == previous.quote
                out.append("\n" if tight else "\n\n")
            out.append(self.block(block, first=previous is None))
            previous = block
        return "".join(out).strip("\n")

    def block(self, block: Block, first: bool = False) -> str:
        if block.kind == "code":
            body = self.code_block(block.code, block.lang)
        elif block.kind == "rule":
            body = self.rule()
        elif block.kind == "heading":
            body = self.heading(block.spans, block.level)
        else:
            body = self.spans(block.spans)
        lines = body.split("\n")
        lead, hang = self.list_lead(block)
        if first and not block.item:
            # A part that goes on with an item begun in the part before starts at the margin:
            # alone, the indent means nothing (four spaces open a code block in Markdown).
            lead = hang = ""
        lines = [(lead if n == 0 else hang) + line for n, line in enumerate(lines)]
        return self.quote(lines, block.quote)

    def list_lead(self, block: Block) -> tuple[str, str]:
        """The text before a block's first line (bullet or number) and before its other
        lines: a nested item starts where its parent item's text starts."""
        if not block.lists:
            return "", ""
        markers = [f"{level.number}." if level.ordered else self.bullet for level in block.lists]
        indent = "".join(" " * (len(marker) + 1) for marker in markers[:-1])
        hang = indent + " " * (len(markers[-1]) + 1)
        return (indent + markers[-1] + " " if block.item else hang), hang

    def quote(self, lines: list[str], depth: int) -> str:
        prefix = self.quote_prefix * depth
        return "\n".join(prefix + line if prefix else line for line in lines)

    # -- what targets write -------------------------------------------------------------
    def escape(self, text: str) -> str:
        return text

    def code_escape(self, text: str) -> str:
        return self.escape(text)

    def spans(self, spans: list[Span]) -> str:
        """A link is one piece (its marks inside it); elsewhere runs sharing a mark are
        wrapped once (`**a b**`, not `**a** **b**`), outermost mark first."""
        out: list[str] = []
        for href, group in groupby(spans, key=lambda s: s.href):
            items = list(group)
            text = self.marked(items, (STRONG, EM, STRIKE))
            out.append(self.link(text, "".join(s.text for s in items), href) if href else text)
        return self.joined(out)

    def marked(self, spans: list[Span], marks: tuple[str, ...]) -> str:
        if not marks:
            return "".join(self.leaf(s) for s in spans)
        mark, inner = marks[0], marks[1:]
        out: list[str] = []
        for has, group in groupby(spans, key=lambda s: mark in s.marks and not s.brk):
            text = self.marked(list(group), inner)
            out.append(self.wrap(mark, text) if has and mark in self.wraps else text)
        return self.joined(out)

    def joined(self, pieces: list[str]) -> str:
        """`pieces` one after another; where markers count only at a word's edge, a marked
        run against a letter (`**foo**bar`) gets a zero-width space there, or it would
        show its markers instead of its style."""
        if not self.word_bound:
            return "".join(pieces)
        markers = {before for before, _ in self.wraps.values()}
        out = ""
        for piece in pieces:
            if out and piece and ((out[-1] in markers and piece[0].isalnum())
                                  or (out[-1].isalnum() and piece[0] in markers)):
                out += ZWSP
            out += piece
        return out

    def literal(self, span: Span) -> str:
        """A span's text where markers count only at a word's edge: a `*`, `_` or `~` that
        could open or close a style and has a partner to pair with (in the text, or the
        span's own style around it) is kept inert; `2 * 3` or `snake_case` stay as
        written."""
        text = span.text
        for mark, (marker, _) in self.wraps.items():
            spots = [at for at, char in enumerate(text) if char == marker]
            opens = [at for at in spots if not text[at - 1:at].isalnum() and not text[at + 1:at + 2].isspace()]
            closes = [at for at in spots if not text[at - 1:at].isspace() and not text[at + 1:at + 2].isalnum()]
            # A styled span's own markers open before its text and close after it.
            styled = mark in span.marks
            first = -1 if styled else min(opens, default=len(text))
            last = len(text) if styled else max(closes, default=-1)
            inert = {at for at in opens if at < last} | {at for at in closes if at > first}
            text = "".join(WJ + char + WJ if at in inert else char for at, char in enumerate(text))
        return text

    def wrap(self, mark: str, text: str) -> str:
        # Markers go inside the spaces around a run: "*bold* " not "*bold *", which
        # platforms with word-bound markers would not draw.
        core = text.strip(" ")
        if not core:
            return text
        head, tail = text[:len(text) - len(text.lstrip(" "))], text[len(text.rstrip(" ")):]
        before, after = self.wraps[mark]
        return head + before + core + after + tail

    def leaf(self, span: Span) -> str:
        if span.brk:
            return self.line_break()
        if CODE in span.marks:
            return self.inline_code(span.text)
        return self.escape(self.literal(span) if self.word_bound else span.text)

    def line_break(self) -> str:
        return "\n"

    def inline_code(self, text: str) -> str:
        return self.code_escape(text)

    def link(self, label: str, raw: str, href: str) -> str:
        """A link: `label` already written in the target's format, `raw` its bare text."""
        return label

    def heading(self, spans: list[Span], level: int) -> str:
        return self.spans(spans)

    def code_block(self, code: str, lang: str) -> str:
        return self.code_escape(code)

    def rule(self) -> str:
        return "―――"
