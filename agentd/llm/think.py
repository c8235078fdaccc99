"""Hide `<think>...</think>` reasoning blocks that some models put in their answer."""

from __future__ import annotations

import re

OPEN, CLOSE = "<think>", "</think>"
_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)


def strip_think(text: str) -> str:
    """Remove closed and unclosed think blocks; strip what is left."""
    if OPEN not in text:
        return text
    return _BLOCK.sub("", text).strip()


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThinkFilter:
    """Streaming counterpart of `strip_think`.

    Tags can be split across chunks (`<thi` | `nk>`), so a possible tag prefix at
    the end of a chunk is held back until the next chunk decides it.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._inside = False
        self._started = False  # leading whitespace after a think block is dropped

    def feed(self, chunk: str) -> str:
        """Take the next chunk; return the text that may be shown now."""
        self._buffer += chunk
        out: list[str] = []
        while self._buffer:
            tag = CLOSE if self._inside else OPEN
            pos = self._buffer.find(tag)
            if pos >= 0:
                if not self._inside:
                    out.append(self._buffer[:pos])
                self._buffer = self._buffer[pos + len(tag):]
                self._inside = not self._inside
                continue
            keep = _partial_suffix(self._buffer, tag)
            if not self._inside:
                out.append(self._buffer[:len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            break
        return self._visible("".join(out))

    def flush(self) -> str:
        """End of stream: release a held-back partial tag unless inside a block."""
        rest = "" if self._inside else self._buffer
        self._buffer = ""
        return self._visible(rest)

    def _visible(self, text: str) -> str:
        if not self._started:
            text = text.lstrip()
            if text:
                self._started = True
        return text
