"""Flask's JSON provider with its encoders made once.

`json.dumps` with any argument but the object builds a new `JSONEncoder` for the call, and
Flask passes several (`default`, `ensure_ascii`, `sort_keys`, `separators`) on every
`jsonify`. An encoder holds only its settings, so one per set of settings serves every
thread and every answer, byte for byte as before.
"""

from __future__ import annotations

import json
from typing import Any

from flask.json.provider import DefaultJSONProvider

#: The settings an encoder may be kept for (anything else goes through `json.dumps`).
_KEPT = frozenset({"default", "ensure_ascii", "sort_keys", "separators", "indent"})


class CachedEncoderProvider(DefaultJSONProvider):
    """`DefaultJSONProvider` whose `dumps` reuses an encoder per set of settings."""

    def __init__(self, app: Any) -> None:
        super().__init__(app)
        self._encoders: dict[tuple, json.JSONEncoder] = {}

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        kwargs.setdefault("default", self.default)
        kwargs.setdefault("ensure_ascii", self.ensure_ascii)
        kwargs.setdefault("sort_keys", self.sort_keys)
        if not kwargs.keys() <= _KEPT:
            return json.dumps(obj, **kwargs)
        key = (kwargs["default"], kwargs["ensure_ascii"], kwargs["sort_keys"],
               kwargs.get("separators"), kwargs.get("indent"))
        encoder = self._encoders.get(key)
        if encoder is None:
            encoder = self._encoders[key] = json.JSONEncoder(**kwargs)
        return encoder.encode(obj)
