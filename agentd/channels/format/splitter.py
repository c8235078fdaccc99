"""The one splitter: a reply's blocks cut into parts that each fit a platform's limit.

Parts break between blocks where they can, then between lines of a code block (each part
closes the block and the next reopens it, language kept), then between words of a
paragraph. A word, link or code line is cut only when it alone is longer than a part,
and a cut never falls inside a character, an emoji sequence or a letter with its accents.
The size of a part is measured on what is sent (the rendered text, in the platform's own
unit).
"""

from __future__ import annotations

import re
from typing import Callable

from agentd.channels.format.document import Block, Span, merged
from agentd.channels.format.units import safe_cut

Fits = Callable[[list[Block]], bool]
WORDS = re.compile(r"\s*\S+\s*|\s+")


def split(blocks: list[Block], fits: Fits, most: int) -> list[list[Block]]:
    """`blocks` in parts for which `fits(part)` is true (a part holds at least something).

    `most` bounds the search: no part holds more words, lines or characters than that (the
    limit itself: each of them is at least one unit long)."""
    parts: list[list[Block]] = []
    current: list[Block] = []
    queue = list(blocks)
    while queue:
        block = queue.pop(0)
        if fits([*current, block]):
            current.append(block)
            continue
        if current and fits([block]):
            parts.append(current)
            current = [block]
            continue
        # A word, link or code line goes whole into the room left after other blocks, or
        # starts the next part: it is cut only when it is longer than a part of its own.
        head, rest = _cut(block, lambda piece: fits([*current, piece]), most, whole=bool(current))
        if head is None and current:
            parts.append(current)
            current = []
            head, rest = _cut(block, lambda piece: fits([piece]), most, whole=False)
        if head is None:  # nothing fits at all (a limit smaller than any markup): send it whole
            head, rest = block, None
        current.append(head)
        parts.append(current)
        current = []
        if rest is not None:
            queue.insert(0, rest)
    if current:
        parts.append(current)
    return parts


def _cut(block: Block, fits: Callable[[Block], bool], most: int,
         whole: bool) -> tuple[Block | None, Block | None]:
    """The longest head of `block` that fits, and the rest (None, None when none fits);
    with `whole`, a head of whole words and code lines only."""
    if block.kind == "code":
        lines = block.code.split("\n")
        k = _longest(min(len(lines), most), lambda n: fits(block.but(code="\n".join(lines[:n]))))
        if k:
            return block.but(code="\n".join(lines[:k])), block.but(code="\n".join(lines[k:]), item=False)
        if whole:
            return None, None
        line = lines[0]
        k = _longest(min(len(line), most), lambda n: fits(block.but(code=line[:n])))
        k = safe_cut(line, k)
        if not k:
            return None, None
        rest = "\n".join([line[k:], *lines[1:]])
        return block.but(code=line[:k]), block.but(code=rest, item=False)
    if block.kind in ("para", "heading"):
        atoms, tail = _atoms(block.spans, most + 1)
        k = _longest(min(len(atoms), most), lambda n: fits(block.but(spans=_join(atoms[:n]))))
        if k:
            return block.but(spans=_join(atoms[:k])), _rest(block, [s for a in atoms[k:] for s in a] + tail)
        if whole:
            return None, None
        return _cut_atom(block, atoms, tail, fits, most)
    return None, None


def _cut_atom(block: Block, atoms: list[list[Span]], tail: list[Span], fits: Callable[[Block], bool],
              most: int) -> tuple[Block | None, Block | None]:
    """The first word (or link) is longer than the limit: cut inside it."""
    spans = atoms[0]
    text = "".join(s.text for s in spans)
    for keep_link in (True, False):
        def head(n: int) -> list[Span]:
            return _take(spans, n, keep_link)
        k = safe_cut(text, _longest(min(len(text), most), lambda n: fits(block.but(spans=head(n)))))
        if k and fits(block.but(spans=head(k))):
            rest = _drop(spans, k, keep_link) + [s for a in atoms[1:] for s in a] + tail
            return block.but(spans=head(k)), _rest(block, rest)
    return None, None


def _take(spans: list[Span], n: int, keep_link: bool) -> list[Span]:
    out, left = [], n
    for span in spans:
        if left <= 0:
            break
        out.append(Span(span.text[:left], span.marks, span.href if keep_link else "", span.brk))
        left -= len(span.text)
    return out


def _drop(spans: list[Span], n: int, keep_link: bool) -> list[Span]:
    out, left = [], n
    for span in spans:
        if left >= len(span.text):
            left -= len(span.text)
            continue
        out.append(Span(span.text[left:], span.marks, span.href if keep_link else "", span.brk))
        left = 0
    return out


def _rest(block: Block, spans: list[Span]) -> Block | None:
    spans = _trim(spans, leading=True)
    if not spans:
        return None
    # The words of a run back in one span: later cuts stay cheap.
    return block.but(spans=merged(spans), item=False)


def _atoms(spans: list[Span], most: int) -> tuple[list[list[Span]], list[Span]]:
    """Units a paragraph may break between (a word with its spaces, a line break, a link):
    the first `most` of them, and the spans after those, left whole."""
    atoms: list[list[Span]] = []
    index = 0
    while index < len(spans) and len(atoms) < most:
        span = spans[index]
        if span.href:
            end = index
            while end < len(spans) and spans[end].href == span.href:
                end += 1
            atoms.append(spans[index:end])
            index = end
            continue
        index += 1
        if span.brk:
            atoms.append([span])
            continue
        for word in WORDS.finditer(span.text):
            if len(atoms) >= most:
                return atoms, [Span(span.text[word.start():], span.marks), *spans[index:]]
            atoms.append([Span(word.group(), span.marks)])
    return atoms, spans[index:]


def _join(atoms: list[list[Span]]) -> list[Span]:
    return _trim([span for atom in atoms for span in atom], leading=False)


def _trim(spans: list[Span], leading: bool) -> list[Span]:
    """Spaces and line breaks at the cut belong to neither part."""
    spans = list(spans)
    if leading:
        while spans and (spans[0].brk or not spans[0].text.strip()):
            spans.pop(0)
        if spans:
            spans[0] = Span(spans[0].text.lstrip(), spans[0].marks, spans[0].href)
    else:
        while spans and (spans[-1].brk or not spans[-1].text.strip()):
            spans.pop()
        if spans:
            spans[-1] = Span(spans[-1].text.rstrip(), spans[-1].marks, spans[-1].href)
    return spans


def _longest(count: int, fits: Callable[[int], bool]) -> int:
    """The largest n in 0..count with fits(n) (fits is monotone; fits(0) is not asked)."""
    low, high = 0, count
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low
