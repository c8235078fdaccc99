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


def see_other_with(endpoint: str, lines: list[str], ok: bool = True, **values: Any) -> Response:
    """303 to `endpoint`, whose page then shows `lines` as a notice (`ok`) or an error."""
    if lines:
        values[FIELD] = dashauth.sessions().notes.dumps({"lines": lines, "ok": ok})
    return redirect(url_for(endpoint, **values), code=303)


def current_note() -> dict[str, Any] | None:
    """The signed message of this request's URL: {"lines": [...], "ok": bool}, or None."""
    value = request.args.get(FIELD)
    if not value:
        return None
    try:
        note = dashauth.sessions().notes.loads(value, max_age=MAX_AGE)
    except BadSignature:
        return None
    if not isinstance(note, dict) or not isinstance(note.get("lines"), list):
        return None
    return {"lines": [str(line) for line in note["lines"]], "ok": bool(note.get("ok"))}
