"""`/logs`: the daemon's newest log lines; with JavaScript, new lines arrive over SSE."""

from __future__ import annotations

from typing import Iterator

from flask import render_template, request

from agentd.api.pages import bp, kernel
from agentd.api.sse import comment, sse_response

SHOWN = 200
# How long a stream waits for a line before a keep-alive comment (which also notices a
# browser that left: the write fails), in slices short enough to end soon at shutdown.
KEEPALIVE_SECS = 10.0
SLICE_SECS = 0.5


@bp.get("/logs")
def logs():
    lines = kernel().log_tail.last(SHOWN)
    return render_template("logs.html", lines=lines, after=lines[-1][0] if lines else 0, limit=SHOWN)


@bp.get("/logs/stream")
def logs_stream():
    """SSE: one `line` event per new log line, its number as the event id (a reconnecting
    EventSource sends it back as Last-Event-ID and misses nothing still kept)."""
    k = kernel()
    raw = request.headers.get("Last-Event-ID") or request.args.get("after") or "0"
    try:
        after = max(0, int(raw))
    except ValueError:
        after = 0

    def lines() -> Iterator[str]:
        last, quiet = after, 0.0
        while not k.stopping.is_set():
            fresh = k.log_tail.since(last, SLICE_SECS)
            if not fresh:
                quiet += SLICE_SECS
                if quiet >= KEEPALIVE_SECS:
                    quiet = 0.0
                    yield comment("keep-alive")
                continue
            quiet = 0.0
            for number, text in fresh:
                yield f"id: {number}\nevent: line\ndata: {text}\n\n"
            last = fresh[-1][0]

    return sse_response(lines())
