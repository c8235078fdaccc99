"""The agent's Markdown as a flat list of blocks of styled spans, parsed by markdown-it-py.

Every target format renders from this one model, and the splitter cuts it at block, line
and word boundaries, so no format ever has to parse its own output again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

# Inline marks a span can carry.
STRONG, EM, STRIKE, CODE = "strong", "em", "s", "code"


@dataclass(frozen=True)
class Span:
    """A run of text with the same marks; `href` when it is (part of) a link's text."""

    text: str
    marks: frozenset[str] = frozenset()
    href: str = ""
    # "\n" inside a paragraph: a line break the agent wrote (kept by every target).
    brk: bool = False


@dataclass(frozen=True)
class ListLevel:
    ordered: bool
    number: int = 0  # an ordered item's number (the item this block belongs to)


@dataclass
class Block:
    """A paragraph, heading, code block or rule, with the lists and quotes around it.

    `lists` is the nesting of list items the block sits in (outermost first); `item` is
    true when the block starts its innermost item (it carries the bullet or number).
    """

    kind: str  # "para" | "heading" | "code" | "rule"
    spans: list[Span] = field(default_factory=list)
    code: str = ""
    lang: str = ""
    level: int = 0
    lists: tuple[ListLevel, ...] = ()
    item: bool = False
    quote: int = 0

    def but(self, **changes: Any) -> "Block":
        return replace(self, **changes)


@lru_cache(maxsize=1)
def _parser():  # type: ignore[no-untyped-def]
    # Imported on first use: an idle daemon with no channel never loads the parser.
    from markdown_it import MarkdownIt

    # html off: raw HTML in a reply is text (each target escapes it), never markup.
    return MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


def parse(text: str) -> list[Block]:
    """The blocks of `text` (CommonMark plus tables and ~~strike~~)."""
    tokens = _parser().parse(text)
    blocks: list[Block] = []
    lists: list[dict[str, Any]] = []  # open lists: ordered, next number, item pending
    quote = 0
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        kind = tok.type
        if kind in ("bullet_list_open", "ordered_list_open"):
            start = int(tok.attrs.get("start", 1) or 1) if kind == "ordered_list_open" else 0
            lists.append({"ordered": kind == "ordered_list_open", "number": start - 1, "fresh": False})
        elif kind in ("bullet_list_close", "ordered_list_close"):
            lists.pop()
        elif kind == "list_item_open":
            top = lists[-1]
            top["number"] = int(tok.info) if tok.info.isdigit() else top["number"] + 1
            top["fresh"] = True
        elif kind == "blockquote_open":
            quote += 1
        elif kind == "blockquote_close":
            quote -= 1
        elif kind in ("paragraph_open", "heading_open"):
            inline = tokens[i + 1]
            level = int(tok.tag[1:]) if kind == "heading_open" else 0
            blocks.append(_block("heading" if level else "para", lists, quote,
                                 spans=inline_spans(inline.children or []), level=level))
            i += 2
        elif kind in ("fence", "code_block"):
            blocks.append(_block("code", lists, quote, code=tok.content.rstrip("\n"),
                                 lang=(tok.info or "").strip().split(" ")[0]))
        elif kind == "hr":
            blocks.append(_block("rule", lists, quote))
        elif kind == "table_open":
            end, rows = _table(tokens, i)
            blocks.append(_block("para", lists, quote, spans=rows))
            i = end
        elif kind == "html_block":  # only with html on; kept as text all the same
            blocks.append(_block("para", lists, quote, spans=[Span(tok.content.rstrip("\n"))]))
        i += 1
    return blocks


def _block(kind: str, lists: list[dict[str, Any]], quote: int, **values: Any) -> Block:
    item = bool(lists) and lists[-1]["fresh"]
    if lists:
        lists[-1]["fresh"] = False
    levels = tuple(ListLevel(entry["ordered"], entry["number"] if entry["ordered"] else 0) for entry in lists)
    return Block(kind, lists=levels, item=item, quote=quote, **values)


def inline_spans(children: list[Any]) -> list[Span]:
    spans: list[Span] = []
    marks: list[str] = []
    href = ""
    for child in children:
        kind = child.type
        if kind == "text":
            if child.content:
                spans.append(Span(child.content, frozenset(marks), href))
        elif kind == "code_inline":
            spans.append(Span(child.content, frozenset([*marks, CODE]), href))
        elif kind in ("softbreak", "hardbreak"):
            spans.append(Span("\n", frozenset(), "", brk=True))
        elif kind.endswith("_open") and kind[:-5] in ("strong", "em", "s"):
            marks.append(kind[:-5])
        elif kind.endswith("_close") and kind[:-6] in ("strong", "em", "s"):
            if kind[:-6] in marks:
                marks.remove(kind[:-6])
        elif kind == "link_open":
            href = str(child.attrs.get("href", ""))
        elif kind == "link_close":
            href = ""
        elif kind == "image":
            alt = child.content or str(child.attrs.get("alt", "")) or str(child.attrs.get("src", ""))
            spans.append(Span(alt, frozenset(marks), str(child.attrs.get("src", ""))))
        elif child.content:
            spans.append(Span(child.content, frozenset(marks), href))
    return merged(spans)


def merged(spans: list[Span]) -> list[Span]:
    """Neighbouring spans that look the same as one (the parser cuts text at every
    character that might start markup)."""
    out: list[Span] = []
    for span in spans:
        last = out[-1] if out else None
        if last is not None and not (span.brk or last.brk) and (last.marks, last.href) == (span.marks, span.href):
            out[-1] = Span(last.text + span.text, span.marks, span.href)
        else:
            out.append(span)
    return out


def _table(tokens: list[Any], start: int) -> tuple[int, list[Span]]:
    """A table as lines of text, one a row, its cells apart by " | " and the header's in
    bold: no chat platform draws Markdown tables, and a cell keeps its links and marks as
    any other text does."""
    spans: list[Span] = []
    header, first = False, True
    i = start
    while tokens[i].type != "table_close":
        tok = tokens[i]
        if tok.type in ("thead_open", "thead_close"):
            header = tok.type == "thead_open"
        elif tok.type == "tr_open":
            if spans:
                spans.append(Span("\n", brk=True))
            first = True
        elif tok.type == "inline":
            if not first:
                spans.append(Span(" | "))
            first = False
            spans += [Span(s.text, s.marks | {STRONG}, s.href, s.brk) if header else s
                      for s in inline_spans(tok.children or [])]
        i += 1
    return i, merged(spans)


def plain_text(spans: list[Span]) -> str:
    return "".join(span.text for span in spans)
