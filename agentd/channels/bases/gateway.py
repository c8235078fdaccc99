"""Gateway base: a WebSocket adapter whose platform wants application-level heartbeats
(Discord's op 1 / op 11, Revolt's Ping / Pong) on top of the WebSocket base.

The heartbeat runs on its own thread so it keeps time while the reader blocks. A beat
that is still unanswered when the next one is due means a "zombie" connection (TCP
open, nobody listening): the socket is shut down and the base reconnects.
"""

from __future__ import annotations

import time
from typing import Any

from agentd.channels.bases.websocket import WebSocketAdapter, _kill


class GatewayAdapter(WebSocketAdapter):
    """Subclasses call `set_heartbeat()` when they learn the interval (after HELLO, or
    at once in `on_open`), `heartbeat_ack()` when the platform answers a beat, and
    implement `heartbeat_payload()`."""

    #: how often the heartbeat thread looks at the clock (seconds)
    tick = 0.05

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self._beat_every: float | None = None
        self._next_beat = 0.0
        self._acked = True
        self.beats_sent = 0

    def start(self) -> None:
        super().start()
        self.spawn(self._heartbeats, "heartbeat")

    def on_open(self) -> None:
        """A new connection beats only once the platform has said how often."""
        self._beat_every = None
        self._acked = True

    def set_heartbeat(self, interval: float, first: float | None = None) -> None:
        """Beat every `interval` seconds, the first one after `first` (default: interval)."""
        self._acked = True
        self._next_beat = time.monotonic() + (interval if first is None else first)
        self._beat_every = max(0.05, interval)

    def heartbeat_ack(self) -> None:
        self._acked = True

    def heartbeat_payload(self) -> Any:
        raise NotImplementedError

    def give_up(self, why: str) -> None:
        """The platform refused us for good (bad token, forbidden intents): say so in the
        audit trail and stop reconnecting; the adapter reports inactive until reconfigured."""
        self.ctx.log.warning("%s", why)
        self.ctx.audit("error", error=why[:300])
        self.healthy = False
        self.stopping.set()

    def beat_now(self) -> None:
        """Send a beat out of turn (Discord's op 1 request); the schedule stays."""
        self.ws_send(self.heartbeat_payload())

    def _heartbeats(self) -> None:
        while not self.stopping.wait(self.tick):
            ws, every = self.ws, self._beat_every
            if ws is None or every is None or time.monotonic() < self._next_beat:
                continue
            if not self._acked:
                # No answer to the last beat within a whole interval: drop the socket;
                # the reader fails and the base reconnects (resuming where it can).
                self.ctx.log.warning("no heartbeat acknowledgement: reconnecting")
                self._beat_every = None
                _kill(ws)
                continue
            self._acked = False
            self._next_beat = time.monotonic() + every
            try:
                self.ws_send(self.heartbeat_payload())
                self.beats_sent += 1
            except Exception as exc:  # noqa: BLE001 - the reader notices the broken socket
                self.ctx.log.debug("heartbeat not sent: %s", exc)
