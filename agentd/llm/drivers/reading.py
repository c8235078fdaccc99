"""Reading a provider's answer: a whole body in one read, a stream as its bytes arrive,
its SSE events, and the rest of a finished stream so its connection goes back to the pool."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from typing import Any, Callable

import requests
from urllib3.exceptions import DecodeError, ProtocolError, ReadTimeoutError, SSLError

from agentd.llm.drivers.guard import CallGuard
from agentd.sse_lines import SseEvent, lines_of, sse_events


class Interrupted(Exception):
    """The guard shut the connection down; the attempt fails with the guard's reason."""


READ_SIZE = 64 * 1024


def read_chunks(response: requests.Response, guard: CallGuard) -> Iterator[bytes]:
    """The body as bytes arrive, whatever the framing.

    `read1` returns whatever is available: a close-delimited body (no Content-Length, no
    chunked encoding) is not held back until a buffer fills, as `iter_content` would.
    """
    raw = response.raw
    read1 = _plain_chunk_reader(raw) or (lambda size: raw.read1(size, decode_content=True))
    guard.streaming()
    while True:
        data = read1(READ_SIZE)
        if guard.reason is not None:
            raise Interrupted(guard.reason)
        if not data:
            return
        guard.got_bytes()
        yield data


def _plain_chunk_reader(raw: Any) -> Callable[[int], bytes] | None:
    """`read1` of the http.client response under urllib3's, for a chunked body with no
    content coding (what providers stream), when urllib3 holds none of it; else None.

    urllib3's `read1` wraps each read in its error and decoding machinery: about 6 µs a
    read, and a stream is read an HTTP chunk at a time (seven reads for a short answer).
    Nothing of that machinery applies here: there is nothing to decode, errors from
    http.client and the socket are mapped as urllib3's are (`transport.network_error`),
    and urllib3 still ends the body: `release_stream` reads the rest (or the end it
    finds) through urllib3, which then puts the connection back in its pool, and a body
    that failed is closed with its connection, as before."""
    body = getattr(raw, "_fp", None)
    if (not isinstance(body, http.client.HTTPResponse) or not getattr(raw, "chunked", False)
            or raw.headers.get("content-encoding", "identity").lower() not in ("identity", "")
            or getattr(raw, "_has_decoded_content", True)):
        return None
    return body.read1


# How long a finished stream's body may take to end, and how much of it may still come,
# before its connection is closed instead of going back to the pool (see release_stream).
DRAIN_SECS = 0.05
DRAIN_BYTES = 64 * 1024


def release_stream(response: requests.Response) -> bool:
    """After a stream's last event: read the rest of the body when it is there at once, so
    urllib3 hands the connection back to the pool; True when the body ended.

    The end marker (`[DONE]`, `message_stop`) arrives just before the body's own end (the
    chunked terminator, or the server closing); closing the response with that unread throws
    the connection away, and the next call pays a new TCP and TLS handshake. A server that
    keeps the body open or keeps sending is cut off after DRAIN_SECS or DRAIN_BYTES (the
    connection is then closed, as before)."""
    raw = response.raw
    sock = getattr(getattr(raw, "_connection", None), "sock", None)
    if sock is None:
        return False
    left = DRAIN_BYTES
    try:
        sock.settimeout(DRAIN_SECS)  # (urllib3 sets its own again when it reuses the connection)
        while left > 0:
            data = raw.read1(READ_SIZE, decode_content=True)
            if not data:
                return True  # the body ended: urllib3 has put the connection back
            left -= len(data)
    except Exception:  # noqa: BLE001 - a timeout or a reset: the caller closes the connection
        return False
    return False


def iter_sse(response: requests.Response, guard: CallGuard) -> Iterator[SseEvent]:
    """Parse an SSE body as it arrives; tolerates `\\n` and `\\r\\n` line endings."""
    return sse_events(lines_of(read_chunks(response, guard)))


def read_body(response: requests.Response) -> bytes:
    """A whole (non-streamed) body in one read, with the errors `response.content` raises.

    `content` reads a streamed response through `iter_content`'s generator in 10 KB steps
    and `json()` then decodes it to text: about a twentieth of a model call's CPU."""
    try:
        return response.raw.read(decode_content=True)
    except ProtocolError as exc:
        raise requests.exceptions.ChunkedEncodingError(exc) from None
    except DecodeError as exc:
        raise requests.exceptions.ContentDecodingError(exc) from None
    except ReadTimeoutError as exc:
        raise requests.ConnectionError(exc) from None
    except SSLError as exc:
        raise requests.exceptions.SSLError(exc) from None
