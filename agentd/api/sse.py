"""Server-Sent Events: the wire format, and responses whose body is an iterator.

waitress sends headers only with the first non-empty chunk, so a stream opens with a
comment line; heartbeats are comments too, and they are how we notice a client that left
(a write to a closed socket fails). A run's stream is written as it goes instead
(agentd/api/streaming.py).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator

from flask import Response, stream_with_context

# Every event's encoder (json.dumps with options builds a new one per call).
encode_compact = json.JSONEncoder(separators=(",", ":")).encode


def format_event(event: str | None, data: Any) -> str:
    """One SSE event; `event=None` gives a data-only event (OpenAI style)."""
    payload = data if isinstance(data, str) else encode_compact(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n"


def comment(text: str = "") -> str:
    """An SSE comment line (ignored by clients; used to open streams and keep them alive)."""
    return f": {text}\n\n"


def sse_response(chunks: Iterable[str], on_close: Any = None) -> Response:
    """Wrap an iterator of pre-formatted SSE strings into a streaming response."""

    def body() -> Iterator[str]:
        try:
            yield comment("stream open")
            yield from chunks
        finally:
            if on_close is not None:
                on_close()

    response = Response(stream_with_context(body()), mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    # Reverse proxies (nginx) buffer responses unless told not to.
    response.headers["X-Accel-Buffering"] = "no"
    return response
