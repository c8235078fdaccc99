"""Server-side WebSocket clients for the fakes (flask-sock on the werkzeug server):
each connection gets a queue; `broadcast()` pushes a JSON frame to all of them."""

from __future__ import annotations

import json
import queue
import threading
from typing import Any, Callable

from simple_websocket import ConnectionClosed


class Hub:
    def __init__(self) -> None:
        self.clients: list["queue.Queue[str]"] = []
        self.lock = threading.Lock()
        self.connections = 0
        self.received: list[Any] = []

    def serve(self, ws: Any, on_frame: Callable[[Any, Any], None] | None = None) -> None:
        """Run one connection until it closes: forward broadcasts, record client frames."""
        outbox: "queue.Queue[str]" = queue.Queue()
        with self.lock:
            self.clients.append(outbox)
            self.connections += 1
        try:
            while True:
                try:
                    frame = ws.receive(timeout=0.05)
                except ConnectionClosed:
                    return
                if frame is not None:
                    try:
                        data = json.loads(frame)
                    except ValueError:
                        data = frame
                    self.received.append(data)
                    if on_frame is not None:
                        on_frame(ws, data)
                while not outbox.empty():
                    ws.send(outbox.get_nowait())
        except (ConnectionClosed, OSError):
            return
        finally:
            with self.lock:
                self.clients.remove(outbox)

    def broadcast(self, payload: Any) -> None:
        text = json.dumps(payload)
        with self.lock:
            for outbox in self.clients:
                outbox.put(text)

    def connected(self) -> int:
        with self.lock:
            return len(self.clients)
