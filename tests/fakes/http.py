"""Run a Flask app (a platform fake) on a real threaded HTTP server that can also
drop every open connection, the way a crashed or restarted platform would."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from flask import Flask, jsonify
from werkzeug.serving import make_server

from support import free_port


def serve_file(files: dict[str, tuple[bytes, str]], key: str, downloads: list[str],
               missing: str | dict[str, Any] = "Not found") -> Any:
    """`files[key]` (bytes, content type) as a platform's media host answers it, each fetch
    counted in `downloads`; `missing` is the platform's own 404 body (a dict is sent as JSON)."""
    if key not in files:
        return (jsonify(missing) if isinstance(missing, dict) else missing), 404
    downloads.append(key)
    data, kind = files[key]
    return data, 200, {"Content-Type": kind}


class FakeServer:
    """`start()` on a free port (or the given one), `stop()`, `restart()` on the same port."""

    def __init__(self, app: Flask) -> None:
        self.app = app
        self.port = 0
        self.server: Any = None
        self.thread: threading.Thread | None = None
        self.conns: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FakeServer":
        if not self.port:  # a port that stays ours across restart() (see free_port)
            self.port = free_port()
        for _ in range(50):  # the old socket may take a moment to release the port
            try:
                self.server = make_server("127.0.0.1", self.port, self.app, threaded=True)
                break
            except (OSError, SystemExit):  # werkzeug exits (SystemExit) when the port is taken
                time.sleep(0.1)
        else:
            raise RuntimeError(f"cannot bind 127.0.0.1:{self.port}")
        self.port = self.server.server_port
        original = self.server.get_request

        def get_request():  # type: ignore[no-untyped-def]
            sock, addr = original()
            self.conns.append(sock)
            return sock, addr

        self.server.get_request = get_request
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def drop_connections(self) -> None:
        for sock in self.conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conns.clear()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.drop_connections()

    def restart(self, down_for: float = 0.3) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()
