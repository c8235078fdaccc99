"""marshmallow fields shared by API bodies and manifests, and what counts as blank text."""

from __future__ import annotations

import math
import re
from typing import Any

from marshmallow import fields


# Blank characters: Python's whitespace (what str.strip() removes) and JSON Schema's (ECMA-262
# `\s`, which adds U+FEFF), so the document's `pattern` and the server refuse the same texts.
BLANK = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
         "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff")
# A text with at least one character that is not blank, spelled with escapes only (both
# engines read them alike); JSON Schema searches a `pattern`, marshmallow matches from the start.
NOT_BLANK = r"[\s\S]*[^\t\n\x0b\x0c\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
_NOT_BLANK = re.compile(NOT_BLANK)


def is_blank(text: str) -> bool:
    """True for a text of blank characters only (or none)."""
    return _NOT_BLANK.match(text) is None


TOO_LARGE = "Number too large (past 1.8e308)."


def finite_float(value: int | float) -> float | None:
    """`value` as a float, or None for NaN, infinity and an integer past what a float holds
    (JSON and TOML integers have no bound; Python's float() of one raises OverflowError)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


class StrictFloat(fields.Float):
    """A JSON/TOML number only: "1.5" (a string), true and NaN are type errors, not coerced."""

    default_error_messages = {"invalid": "Not a valid number.", "too_large": TOO_LARGE}

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.make_error("invalid")
        number = finite_float(value)
        if number is None:
            raise self.make_error("invalid" if isinstance(value, float) else "too_large")
        return number


class WholeNumber(fields.Integer):
    """A JSON integer: 3 and 3.0 (the same number in JSON), never "3", 3.5 or true."""

    default_error_messages = {"invalid": "Not a valid integer."}

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.make_error("invalid")
        return super()._deserialize(value, attr, data, **kwargs)


class StrictBoolean(fields.Boolean):
    """JSON true/false only: 0, 1, "true" are type errors (marshmallow's truthy sets match 1 == True)."""

    default_error_messages = {"invalid": "Not a valid boolean."}

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value
