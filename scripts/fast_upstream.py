#!/usr/bin/env python3
"""A fast fake OpenAI upstream for benchmarks: canned answers, HTTP/1.1 keep-alive, asyncio.

It answers `POST /v1/chat/completions` with a fixed completion (or a short chunked SSE
stream when the body asks for `"stream": true`) as fast as one Python core allows, so
that a benchmark measures the proxy in front of it, not the fake. `--delay-ms` holds
every answer (a slow model). Prints its base URL (`http://127.0.0.1:PORT/v1`) first.

    python scripts/fast_upstream.py --port 9000 [--delay-ms 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json

COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "gpt-4o",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the upstream."},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
}).encode()


def _chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> bytes:
    body = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "gpt-4o",
            "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


STREAM_EVENTS = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "Hello"}),
                 _chunk({"content": " from the upstream."}), _chunk({}, "stop"),
                 _chunk({}, usage={"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}),
                 b"data: [DONE]\n\n"]
STREAM_BODY = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in STREAM_EVENTS) + b"0\r\n\r\n"


class Upstream(asyncio.Protocol):
    """One connection; requests are answered in order (no pipelining tricks needed)."""

    delay = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return
            body, self.buffer = self.buffer[head_end + 4:end], self.buffer[end:]
            stream = b'"stream": true' in body or b'"stream":true' in body
            if self.delay:
                asyncio.get_running_loop().call_later(self.delay, self._answer, stream)
            else:
                self._answer(stream)

    def _answer(self, stream: bool) -> None:
        if self.transport.is_closing():
            return
        if stream:
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n" + STREAM_BODY)
        else:
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(COMPLETION), COMPLETION))


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Upstream, "127.0.0.1", port, backlog=1024)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    Upstream.delay = args.delay_ms / 1000
    try:
        asyncio.run(serve(args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
