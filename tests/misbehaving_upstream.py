"""A provider that misbehaves on purpose: a raw-socket HTTP server on 127.0.0.1.

It speaks just enough of the OpenAI chat-completions, Anthropic Messages and Gemini
generateContent wire formats to be a provider, and fails in the ways real ones do. The fault is the first segment of
the request path, so each agent picks its own through its manifest's `base_url`::

    http://127.0.0.1:PORT/hang/v1      (OpenAI: POST /hang/v1/chat/completions)
    http://127.0.0.1:PORT/cut          (Anthropic: POST /cut/v1/messages;
                                        Gemini: POST /cut/v1beta/models/M:streamGenerateContent)

Faults (`-` separates parameters):

    ok              a normal answer (chunked SSE when streamed, JSON otherwise)
    hang            read the request, answer nothing, wait for the client to close
    drip            headers at once, then the body one byte every 100 ms
    stall           stream: one content chunk, then silence (the connection stays open)
    cut             stream: two content chunks, then the end of the body without [DONE] /
                    finish_reason (OpenAI), message_stop (Anthropic) or finishReason (Gemini)
    close-S-N       close-delimited stream (no Content-Length, no chunked encoding,
                    Connection: close): N content chunks S seconds apart, then the end
    chunked-S-N     the same timing with chunked encoding
    status-C-R      HTTP C (429, 503 ...) with Retry-After R, every time
    reset           read the request, then reset the connection (RST)

Every connection is recorded (`Upstream.conns`): fault, when the request arrived, when
each content chunk left (`sent`: [(time.time(), text)]) and when the server saw the
client close its side (`closed_at`). Every answer is sent with `Connection: close`.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

DRIP_INTERVAL = 0.1


@dataclass
class Conn:
    """What happened on one connection."""

    fault: str = ""
    path: str = ""
    stream: bool = False
    request_at: float = 0.0
    sent: list[tuple[float, str]] = field(default_factory=list)
    closed_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Upstream:
    """The server; `start()` binds a free port, `stop()` closes everything."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.conns: list[Conn] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._clients: list[socket.socket] = []

    def base(self, fault: str, anthropic: bool = False) -> str:
        """The base URL an agent uses to get `fault`."""
        return f"http://127.0.0.1:{self.port}/{fault}" + ("" if anthropic else "/v1")

    def start(self) -> "Upstream":
        threading.Thread(target=self._accept, daemon=True, name="upstream-accept").start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.sock.close()
        with self._lock:
            clients = list(self._clients)
        for client in clients:
            try:
                client.close()
            except OSError:
                pass

    def by_fault(self, fault: str) -> list[Conn]:
        with self._lock:
            return [c for c in self.conns if c.fault == fault]

    def wait_conns(self, fault: str, n: int, timeout: float = 10.0) -> list[Conn]:
        """The first `n` connections of `fault` once their requests arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            conns = self.by_fault(fault)
            if len(conns) >= n and all(c.request_at for c in conns[:n]):
                return conns
            time.sleep(0.01)
        raise AssertionError(f"{len(self.by_fault(fault))} {fault} requests arrived, expected {n}")

    # -- serving ----------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._clients.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True, name="upstream-conn").start()

    def _serve(self, client: socket.socket) -> None:
        conn = Conn()
        try:
            path, body = _read_request(client)
            conn.path = path
            conn.fault = path.strip("/").split("/")[0]
            conn.stream = bool(body.get("stream"))
            conn.request_at = time.time()
            with self._lock:
                self.conns.append(conn)
            wire = "anthropic" if "/v1/messages" in path else "gemini" if "/v1beta/" in path else "openai"
            conn.stream = conn.stream or ":streamGenerateContent" in path
            _Reply(client, conn, wire).run()
        except OSError:
            pass
        finally:
            if conn.closed_at is None:
                conn.closed_at = time.time()
            conn.done.set()
            try:
                client.close()
            except OSError:
                pass
            with self._lock:
                if client in self._clients:
                    self._clients.remove(client)


def _read_request(client: socket.socket) -> tuple[str, dict[str, Any]]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(65536)
        if not chunk:
            raise OSError("client closed before sending a request")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    path = lines[0].split(" ")[1]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = client.recv(65536)
        if not chunk:
            break
        rest += chunk
    try:
        body = json.loads(rest[:length] or b"{}")
    except ValueError:
        body = {}
    return path, body if isinstance(body, dict) else {}


class _Reply:
    """Writes one answer with the connection's fault."""

    def __init__(self, client: socket.socket, conn: Conn, wire: str) -> None:
        self.client = client
        self.conn = conn
        self.wire = wire
        self.anthropic = wire == "anthropic"
        params = conn.fault.split("-")
        self.kind, self.params = params[0], params[1:]

    def run(self) -> None:
        kind = self.kind
        if kind == "hang":
            self._wait_for_close()
        elif kind == "reset":
            # SO_LINGER 0: close() sends RST instead of FIN.
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif kind == "status":
            code, retry_after = int(self.params[0]), self.params[1] if len(self.params) > 1 else "1"
            body = json.dumps({"error": {"message": f"upstream says {code}", "type": "overloaded", "code": None}})
            self._send(f"HTTP/1.1 {code} Busy\r\nContent-Type: application/json\r\nRetry-After: {retry_after}\r\n"
                       f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}".encode())
        elif kind == "drip":
            self._drip()
        elif not self.conn.stream:
            body = json.dumps(self._whole("hello from upstream")).encode()
            self._send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                       b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        elif kind == "close":
            self._stream(chunked=False, interval=float(self.params[0]), n=int(self.params[1]))
        elif kind == "chunked":
            self._stream(chunked=True, interval=float(self.params[0]), n=int(self.params[1]))
        elif kind == "stall":
            self._stream(chunked=True, interval=0, n=1, end=False)
            self._wait_for_close()
        elif kind == "cut":
            self._stream(chunked=True, interval=0, n=2, end=False)
        else:  # ok
            self._stream(chunked=True, interval=0, n=2)

    # -- pieces -----------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        self.client.sendall(data)

    def _wait_for_close(self) -> None:
        """Block until the client closes (recv returns EOF or fails); record when."""
        while True:
            try:
                data = self.client.recv(4096)
            except OSError:
                break
            if not data:
                break
        self.conn.closed_at = time.time()

    def _whole(self, text: str) -> dict[str, Any]:
        if self.wire == "gemini":
            return {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                                    "finishReason": "STOP"}],
                    "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4}}
        if self.anthropic:
            return {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                    "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                    "usage": {"input_tokens": 3, "output_tokens": 4}}
        return {"id": "c1", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4}}

    def _drip(self) -> None:
        if self.conn.stream:
            events = self._events(["drip "] * 50, end=True)
            body = "".join(events).encode()
            ctype = b"text/event-stream"
        else:
            body = json.dumps(self._whole("drip " * 50)).encode()
            ctype = b"application/json"
        self._send(b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\nConnection: close\r\nContent-Length: "
                   + str(len(body)).encode() + b"\r\n\r\n")
        for i in range(len(body)):
            self._send(body[i:i + 1])
            time.sleep(DRIP_INTERVAL)

    def _events(self, texts: list[str], end: bool) -> list[str]:
        """SSE events: a start, one per text, and (when `end`) the end of the answer."""
        out: list[str] = []
        if self.wire == "gemini":  # no start event; the last chunk carries finishReason
            def part(text: str, finish: str | None = None) -> str:
                candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}}
                if finish:
                    candidate["finishReason"] = finish
                return "data: " + json.dumps({"candidates": [candidate]}) + "\r\n\r\n"
            out.append(part(""))
            out += [part(t) for t in texts]
            if end:
                out.append(part("", "STOP"))
            return out
        if self.anthropic:
            def ev(name: str, data: dict[str, Any]) -> str:
                return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"
            out.append(ev("message_start", {"message": {"id": "msg_1", "role": "assistant", "model": "m",
                                                        "content": [], "usage": {"input_tokens": 3,
                                                                                 "output_tokens": 0}}}))
            out.append(ev("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}))
            out += [ev("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": t}})
                    for t in texts]
            if end:
                out.append(ev("content_block_stop", {"index": 0}))
                out.append(ev("message_delta", {"delta": {"stop_reason": "end_turn"},
                                                "usage": {"output_tokens": len(texts)}}))
                out.append(ev("message_stop", {}))
            return out

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return "data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                                          "choices": [{"index": 0, "delta": delta,
                                                       "finish_reason": finish}]}) + "\n\n"
        out.append(chunk({"role": "assistant", "content": ""}))
        out += [chunk({"content": t}) for t in texts]
        if end:
            out.append(chunk({}, "stop"))
            out.append("data: [DONE]\n\n")
        return out

    def _stream(self, chunked: bool, interval: float, n: int, end: bool = True) -> None:
        head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        head += "Transfer-Encoding: chunked\r\n" if chunked else ""
        self._send((head + "Connection: close\r\n\r\n").encode())
        texts = [f"tok{i} " for i in range(1, n + 1)]
        events = self._events(texts, end)
        # Content events are timed; the start and end events go with their neighbours.
        first = 2 if self.anthropic else 1
        for i, event in enumerate(events):
            if first <= i < first + n:
                if i > first and interval:
                    time.sleep(interval)
                self.conn.sent.append((time.time(), texts[i - first]))
            data = event.encode()
            self._send(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
        if chunked and (end or self.kind == "cut"):
            self._send(b"0\r\n\r\n")  # a cut stream still ends its body cleanly: only the end event is missing
