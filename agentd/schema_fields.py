"""marshmallow fields shared by API bodies and manifests."""

from __future__ import annotations

import math
from typing import Any

from marshmallow import fields


class StrictFloat(fields.Float):
    """A JSON/TOML number only: "1.5" (a string), true and NaN are type errors, not coerced."""

    default_error_messages = {"invalid": "Not a valid number."}

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.make_error("invalid")
        return float(value)


class StrictBoolean(fields.Boolean):
    """JSON true/false only: 0, 1, "true" are type errors (marshmallow's truthy sets match 1 == True)."""

    default_error_messages = {"invalid": "Not a valid boolean."}

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value
