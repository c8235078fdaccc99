"""A finished stream hands its connection back to the pool (reading.release_stream).

A raw HTTP/1.1 server on 127.0.0.1 answers streamed chat completions with a chunked SSE body
and counts the TCP connections it accepts. When the body's end follows the end marker at once,
the next call reuses the connection; a server that holds the body open, or keeps sending after
the marker, has its connection closed (as every stream's connection was before) and the call
still answers. Anthropic's `message_stop` is covered too; Gemini's stream ends with the body."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from typing import Iterator

import pytest

from agentd.llm import drivers
from agentd.llm.drivers import reading
from agentd.llm.drivers import transport
from agentd.llm.types import ChatRequest, Message, ProviderEndpoint


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


OPENAI = [b'data: {"choices": [{"delta": {"content": "hel"}}]}\n\n',
          b'data: {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]}\n\n',
          b"data: [DONE]\n\n"]
ANTHROPIC = [b'event: message_start\ndata: {"type": "message_start", "message": {"usage": {"input_tokens": 3}}}\n\n',
             b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, '
             b'"delta": {"type": "text_delta", "text": "hello"}}\n\n',
             b'event: message_delta\ndata: {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, '
             b'"usage": {"output_tokens": 2}}\n\n',
             b'event: message_stop\ndata: {"type": "message_stop"}\n\n']


class SseServer:
    """Counts connections; `after` decides what follows the last event of each answer:
    "end" (the terminator at once), "hold" (the terminator only after `hold_secs`), "more"
    (96 KB of comments, then the terminator)."""

    def __init__(self, events: list[bytes], after: str = "end", hold_secs: float = 2.0,
                 gzip_body: bool = False, sized: bool = False) -> None:
        self.events, self.after, self.hold_secs = events, after, hold_secs
        self.gzip_body, self.sized = gzip_body, sized
        self.connections = 0
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while True:
                length = 0
                line = reader.readline()
                if not line:
                    return
                while line not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                    line = reader.readline()
                reader.read(length)
                if self.sized:  # a Content-Length body, not chunked
                    whole = b"".join(self.events)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(whole), whole))
                    continue
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             + (b"Content-Encoding: gzip\r\n" if self.gzip_body else b"")
                             + b"Transfer-Encoding: chunked\r\n\r\n")
                if self.gzip_body:
                    packed = gzip.compress(b"".join(self.events))
                    conn.sendall(_chunk(packed[:20]) + _chunk(packed[20:]))
                else:
                    for event in self.events:
                        conn.sendall(_chunk(event))
                if self.after == "cut":  # half of a chunk, then the connection closes
                    conn.sendall(b"40\r\ndata: {")
                    return
                if self.after == "hold":
                    self.stopped.wait(self.hold_secs)
                elif self.after == "more":
                    for _ in range(12):
                        conn.sendall(_chunk(b": " + b"x" * 8188 + b"\n\n"))
                conn.sendall(b"0\r\n\r\n")
        except OSError:
            return
        finally:
            reader.close()
            conn.close()

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()


@pytest.fixture()
def fresh_pool(monkeypatch) -> Iterator[None]:
    monkeypatch.setattr(transport, "_local", threading.local())  # this test's own session and pool
    yield


def _stream(server: SseServer, kind: str = "openai") -> str:
    endpoint = ProviderEndpoint("acme", kind, f"http://127.0.0.1:{server.port}/v1", api_key="k", timeout=10)
    deltas: list = []
    response = drivers.complete(endpoint, ChatRequest(model="m1", messages=[Message("user", "hi")]),
                                on_event=deltas.append, retries=0)
    assert deltas, "the answer was not streamed"
    return response.text


@pytest.mark.parametrize("kind, events", [("openai", OPENAI), ("anthropic", ANTHROPIC)])
def test_a_stream_whose_body_ends_at_once_leaves_its_connection_for_the_next_call(fresh_pool, kind, events) -> None:
    server = SseServer(events)
    try:
        assert [_stream(server, kind) for _ in range(3)] == ["hello"] * 3
        assert server.connections == 1, "BUG: every streamed call opened a new connection"
    finally:
        server.close()


@pytest.mark.parametrize("after", ["hold", "more"])
def test_a_body_that_does_not_end_is_cut_off_and_its_connection_closed(fresh_pool, after) -> None:
    server = SseServer(OPENAI, after=after)
    try:
        started = time.monotonic()
        assert [_stream(server) for _ in range(2)] == ["hello"] * 2
        # (not a timing assertion: the hold is far longer than any drain may wait)
        assert time.monotonic() - started < 2 * server.hold_secs
        assert server.connections == 2
    finally:
        server.close()


def test_release_stream_answers_whether_the_connection_went_back(fresh_pool) -> None:
    for after, released in [("end", True), ("hold", False), ("more", False)]:
        server = SseServer(OPENAI, after=after)
        try:
            url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            response = transport.send_json(url, {}, {"stream": True}, timeout=(5, 5))
            seen = b""
            while not seen.endswith(b"data: [DONE]\n\n"):
                seen += response.raw.read1(1, decode_content=True)
            assert reading.release_stream(response) is released, after
            response.close()
        finally:
            server.close()
    assert reading.DRAIN_BYTES < 96 * 1024 and reading.DRAIN_SECS < 2.0


GEMINI = [b'data: {"candidates": [{"content": {"parts": [{"text": "hel"}]}}]}\n\n',
          b'data: {"candidates": [{"content": {"parts": [{"text": "lo"}]}, "finishReason": "STOP"}]}\n\n']


@pytest.fixture()
def urllib3_reads(monkeypatch) -> list[int]:
    """How many reads of a body go through urllib3's `read1` (the rest read http.client's)."""
    import urllib3.response

    calls: list[int] = []
    stock = urllib3.response.HTTPResponse.read1

    def counted(self, *args, **kwargs):
        calls.append(1)
        return stock(self, *args, **kwargs)

    monkeypatch.setattr(urllib3.response.HTTPResponse, "read1", counted)
    return calls


def test_a_plain_chunked_stream_is_read_past_urllib3_which_still_ends_it(fresh_pool, urllib3_reads) -> None:
    for kind, events in (("openai", OPENAI), ("gemini", GEMINI)):  # (Gemini's stream ends with its body)
        server = SseServer(events)
        try:
            urllib3_reads.clear()
            assert [_stream(server, kind) for _ in range(3)] == ["hello"] * 3
            # Only the end goes through urllib3, which puts the connection back for the next call.
            assert len(urllib3_reads) == 3, (kind, urllib3_reads)
            assert server.connections == 1, kind
        finally:
            server.close()


@pytest.mark.parametrize("framing", [{"gzip_body": True}, {"sized": True}])
def test_a_compressed_or_sized_stream_is_read_through_urllib3(fresh_pool, urllib3_reads, framing) -> None:
    server = SseServer(OPENAI, **framing)
    try:
        assert [_stream(server) for _ in range(2)] == ["hello"] * 2
        # (the sized body arrives in one read, which ends it: urllib3 pools the connection then)
        assert len(urllib3_reads) >= (2 if framing.get("sized") else 4), urllib3_reads
        assert server.connections == 1
    finally:
        server.close()


def test_a_stream_cut_inside_a_chunk_is_truncated_and_its_connection_not_reused(fresh_pool) -> None:
    from agentd.llm.types import LLMError

    server = SseServer(OPENAI[:2], after="cut")
    try:
        for _ in range(2):
            with pytest.raises(LLMError) as err:
                _stream(server)
            assert err.value.kind == "truncated" and "cut off" in err.value.message
        assert server.connections == 2
    finally:
        server.close()
