"""What the fakes of gateway platforms (Discord, Revolt, Slack Socket Mode) share: a
FakePlatform whose clients also hold WebSockets (flask-sock on the same server). The
sockets served are kept in `socks`, so a test can push a frame to every client or drop
them all (`restart`); what the bot posted is read back per channel with `replies`."""

from __future__ import annotations

import json
from typing import Any

from flask_sock import Sock
from simple_websocket import ConnectionClosed

from fakes.platform import FakePlatform


class FakeGateway(FakePlatform):
    #: The key of a recorded post (FakePlatform.record) that holds its text.
    text_key = "content"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.socks: list[Any] = []
        self.sock = Sock(self.app)

    def to_every_socket(self, frame: dict[str, Any]) -> None:
        """Send `frame` to every client socket (a closed one is skipped)."""
        for ws in list(self.socks):
            try:
                ws.send(json.dumps(frame))
            except (ConnectionClosed, OSError):
                pass

    def replies(self, channel: str) -> list[str]:
        """The texts the bot posted to `channel`, oldest first."""
        return [s[self.text_key] for s in self.sent if s["channel"] == channel]

    def restart(self, down_for: float = 0.3) -> None:
        """Drop every client socket, then the server itself for `down_for` seconds."""
        for ws in list(self.socks):
            try:
                ws.close()
            except (ConnectionClosed, OSError):
                pass
        self.socks.clear()
        super().restart(down_for)
