"""WebSocket routes (flask-sock). Agent sockets arrive with the agents module."""

from __future__ import annotations

from flask import Flask
from flask_sock import Sock


def register_sockets(app: Flask) -> Sock:
    """Attach flask-sock and the diagnostic echo socket."""
    # Dead peers are noticed only when a write fails; pings every 25 s make sure one does.
    app.config.setdefault("SOCK_SERVER_OPTIONS", {"ping_interval": 25, "max_message_size": 65536})
    sock = Sock(app)

    @sock.route("/api/_ws/echo")
    def echo(ws) -> None:  # type: ignore[no-untyped-def]
        """Echo every frame back; used to check the WebSocket transport."""
        while True:
            data = ws.receive()
            if data is None:
                return
            ws.send(data)

    return sock
