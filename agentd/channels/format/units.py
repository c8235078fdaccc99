"""How long a text is in the unit a platform counts, and where a text may be cut."""

from __future__ import annotations

import unicodedata

CHARS, UTF16, BYTES = "chars", "utf16", "bytes"
UNITS = (CHARS, UTF16, BYTES)


def measure(text: str, unit: str) -> int:
    """`text`'s length in code points (chars), UTF-16 code units (utf16) or UTF-8 bytes."""
    if unit == BYTES:
        return len(text.encode("utf-8"))
    if unit == UTF16:
        return len(text.encode("utf-16-le")) // 2
    return len(text)


def _joins_previous(char: str) -> bool:
    """True for a code point that belongs to the character before it on screen."""
    code = ord(char)
    return (unicodedata.combining(char) != 0 or char == "\u200d" or 0xFE00 <= code <= 0xFE0F
            or 0x1F3FB <= code <= 0x1F3FF or 0xE0020 <= code <= 0xE007F or 0xE0100 <= code <= 0xE01EF)


def safe_cut(text: str, index: int) -> int:
    """The nearest index at or before `index` that does not split a visible character
    (an emoji with its modifiers, a letter with its accents, a ZWJ sequence, a flag)."""
    cut = index
    while 0 < cut < len(text) and (_joins_previous(text[cut]) or text[cut - 1] == "\u200d"
                                   or _inside_flag(text, cut)):
        cut -= 1
    return cut if cut > 0 else index


def _inside_flag(text: str, index: int) -> bool:
    """Between the two regional indicators of a flag."""
    def regional(char: str) -> bool:
        return 0x1F1E6 <= ord(char) <= 0x1F1FF
    if not (regional(text[index - 1]) and regional(text[index])):
        return False
    run = 0
    while index - 1 - run >= 0 and regional(text[index - 1 - run]):
        run += 1
    return run % 2 == 1
