"""Polling base: one loop calling `poll_once()` with backoff and jitter on failure,
and a persisted cursor (update offset, since-token, last UID...)."""

from __future__ import annotations

from typing import Any

from agentd.channels.adapter import Adapter
from agentd.channels.bases.backoff import Reconnects
from agentd.channels.bases.sender import HttpSender
from agentd.retry import Backoff


class PollingAdapter(Adapter):
    """Subclasses implement `poll_once()` (may block in a long poll) and `send()`."""

    #: seconds between successful polls (0 for long polls, which wait server-side)
    poll_interval = 0.0

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)
        self.backoff = Backoff(initial=0.5, maximum=30.0)
        self.healthy = False
        self.state: dict[str, Any] = ctx.load_state()

    def start(self) -> None:
        self.prepare()
        self.spawn(self._loop, "poll")

    def prepare(self) -> None:
        """Checks before the loop starts (credentials present...); raise ChannelError."""

    def _loop(self) -> None:
        link = Reconnects(self.ctx, self.backoff, "poll failed: %s")
        while not self.stopping.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # noqa: BLE001 - any failure: back off and retry
                if self.stopping.is_set():
                    break
                self.healthy = False
                link.down(exc)  # audits the transition, not every retry
                self.backoff.wait(self.stopping)
                continue
            link.up()
            self.healthy = True
            if self.poll_interval:
                self.stopping.wait(self.poll_interval)

    def poll_once(self) -> None:
        raise NotImplementedError

    def save_cursor(self, **values: Any) -> None:
        """Persist cursor values so a restart continues where this run stopped."""
        self.state.update(values)
        self.ctx.save_state(dict(self.state))

    def health(self) -> bool:
        return self.healthy

    def close(self) -> None:
        self.http.close()
