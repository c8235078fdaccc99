"""The message a dashboard POST leaves for the page it redirects to (post/redirect/get).

The message travels in the redirect's query string, signed, so a refresh shows it again
without re-submitting anything and a crafted link cannot put words in the page.
"""

from __future__ import annotations

from typing import Any

from flask import Response, redirect, request, url_for
from itsdangerous import BadSignature

from agentd.api import dashauth

FIELD = "note"
MAX_AGE = 3600  # seconds a result link keeps showing its message
TYPED_LIMIT = 4000  # characters of a typed value carried back; a longer one is left out (URL length)


def see_other_with(endpoint: str, lines: list[str], ok: bool = True, typed: dict[str, str] | None = None,
                   **values: Any) -> Response:
    """303 to `endpoint`, whose page then shows `lines` as a notice (`ok`) or an error.

    `typed`: what a refused form held, for the page to fill the form with again (never a
    secret: the message travels readable in the URL; a value over TYPED_LIMIT is left out)."""
    if lines:
        note: dict[str, Any] = {"lines": lines, "ok": ok}
        kept = {k: v for k, v in (typed or {}).items() if len(v) <= TYPED_LIMIT}
        if kept:
            note["typed"] = kept
        values[FIELD] = dashauth.sessions().notes.dumps(note)
    return redirect(url_for(endpoint, **values), code=303)


def current_note() -> dict[str, Any] | None:
    """The signed message of this request's URL: {"lines": [...], "ok": bool, "typed": {...}},
    or None."""
    value = request.args.get(FIELD)
    if not value:
        return None
    try:
        note = dashauth.sessions().notes.loads(value, max_age=MAX_AGE)
    except BadSignature:
        return None
    if not isinstance(note, dict) or not isinstance(note.get("lines"), list):
        return None
    typed = note.get("typed")
    return {"lines": [str(line) for line in note["lines"]], "ok": bool(note.get("ok")),
            "typed": {str(k): str(v) for k, v in typed.items()} if isinstance(typed, dict) else {}}
