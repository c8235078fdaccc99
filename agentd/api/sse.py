"""Server-Sent Events responses that reach the client event by event.

waitress sends headers only with the first non-empty chunk, so the stream opens
with a comment line; heartbeats are comments too, and they are how we notice a
client that left (a write to a closed socket fails).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Iterator

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


def sse_response(chunks: Iterable[str], on_close: Any = None,
                 ready: Callable[[], bool] | None = None, opening: bool = True) -> Response:
    """Wrap an iterator of pre-formatted SSE strings into a streaming response.

    `ready()` tells whether more events are already waiting: those are sent in one write
    with the one just formatted (a model's burst of deltas is one send, not one each),
    while an event that nothing follows yet goes out at once. `opening=False`: the
    chunks bring their own opening comment (a stream written in place, api/streaming.py)."""

    def body() -> Iterator[str]:
        try:
            if opening:
                yield comment("stream open")
            if ready is None:
                yield from chunks
                return
            batch: list[str] = []
            for chunk in chunks:
                batch.append(chunk)
                if not ready():
                    yield "".join(batch)
                    batch = []
            if batch:
                yield "".join(batch)
        finally:
            if on_close is not None:
                on_close()

    response = Response(stream_with_context(body()), mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    # Reverse proxies (nginx) buffer responses unless told not to.
    response.headers["X-Accel-Buffering"] = "no"
    return response
