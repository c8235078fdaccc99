"""Server-Sent Events framing, byte by byte (agentd/api/sse.py).

A client parses `event:` / `data:` lines and blank-line separators, so every character of
the framing is user-visible: in process first (fast, for mutation testing), then the same
bytes through the real daemon's diagnostic stream.
"""

from __future__ import annotations

import json
import re

from flask import Flask

from agentd.api.sse import comment, format_event, sse_response


# -- framing ------------------------------------------------------------------------------------

def test_named_event_with_json_data_is_exact() -> None:
    assert format_event("chunk", {"content": "hi there", "done": False}) == \
        'event: chunk\ndata: {"content":"hi there","done":false}\n\n', \
        "BUG: SSE event framing or JSON separators changed"


def test_data_only_event_has_no_event_line() -> None:
    assert format_event(None, {"a": [1, 2]}) == 'data: {"a":[1,2]}\n\n', "BUG: OpenAI-style event got an event line"
    assert format_event("", {"a": 1}) == 'data: {"a":1}\n\n', "BUG: an empty event name produced `event: `"


def test_string_data_is_sent_as_is() -> None:
    assert format_event(None, "[DONE]") == "data: [DONE]\n\n", "BUG: the OpenAI [DONE] sentinel was JSON-quoted"
    assert format_event("x", "plain") == "event: x\ndata: plain\n\n"


def test_non_string_scalars_are_json() -> None:
    assert format_event("n", 3) == "event: n\ndata: 3\n\n"
    assert format_event("n", None) == "event: n\ndata: null\n\n"
    assert format_event("n", {"k": "é"}) == 'event: n\ndata: {"k":"\\u00e9"}\n\n'


def test_comments_are_exact() -> None:
    assert comment() == ": \n\n", "BUG: an empty SSE comment is malformed"
    assert comment("keep-alive") == ": keep-alive\n\n", "BUG: the keep-alive comment is malformed"


# -- the streaming response -------------------------------------------------------------------------

def stream_app(closed: list[str], with_close: bool = True) -> Flask:
    app = Flask("sse-test")

    @app.get("/events")
    def events():
        chunks = iter([format_event("one", {"n": 1}), comment("keep-alive"), format_event(None, "[DONE]")])
        return sse_response(chunks, on_close=(lambda: closed.append("closed")) if with_close else None)

    return app


def test_stream_opens_with_a_comment_then_the_chunks_in_order() -> None:
    closed: list[str] = []
    r = stream_app(closed).test_client().get("/events")
    assert r.status_code == 200
    assert r.get_data(as_text=True) == \
        ': stream open\n\nevent: one\ndata: {"n":1}\n\n: keep-alive\n\ndata: [DONE]\n\n', \
        "BUG: the stream does not open with a comment, or chunks are altered"
    assert closed == ["closed"], "BUG: on_close not called exactly once when the stream ends"


def test_stream_headers_are_exact() -> None:
    r = stream_app([]).test_client().get("/events")
    assert r.mimetype == "text/event-stream", "BUG: SSE served with the wrong content type"
    assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert r.headers["Cache-Control"] == "no-cache", "BUG: SSE responses may be cached"
    assert r.headers["X-Accel-Buffering"] == "no", "BUG: nginx would buffer the event stream"
    assert r.is_streamed, "BUG: the event stream is buffered, not streamed"


def test_a_client_that_leaves_early_still_closes_the_stream() -> None:
    closed: list[str] = []
    r = stream_app(closed).test_client().get("/events", buffered=False)
    parts = iter(r.response)
    assert next(parts) in (b": stream open\n\n", ": stream open\n\n")
    assert closed == [], "on_close ran before the client left"
    r.close()   # the client disconnected: the WSGI server closes the body iterator
    assert closed == ["closed"], "BUG: a disconnected client's stream never released its slot (on_close not run)"


def test_without_on_close_the_stream_still_ends_cleanly() -> None:
    r = stream_app([], with_close=False).test_client().get("/events")
    assert r.status_code == 200 and r.get_data(as_text=True).endswith("data: [DONE]\n\n")


# -- the same framing through the real daemon ---------------------------------------------------------

def test_tick_stream_bytes_through_the_daemon(shared_daemon) -> None:
    r = shared_daemon.get("/api/_sse/ticks?n=2&interval=0", stream=True)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert r.headers["Cache-Control"] == "no-cache" and r.headers["X-Accel-Buffering"] == "no"
    body = r.raw.read().decode()
    pattern = (r': stream open\n\n'
               r'event: tick\ndata: \{"n":0,"sent_at":([0-9.]+)\}\n\n'
               r'event: tick\ndata: \{"n":1,"sent_at":([0-9.]+)\}\n\n'
               r'event: done\ndata: \{"done":true\}\n\n')
    match = re.fullmatch(pattern, body)
    assert match, f"BUG: SSE bytes through the daemon are not the expected framing: {body!r}"
    assert float(match.group(1)) <= float(match.group(2))
    assert json.loads(body.split("data: ")[-1]) == {"done": True}


