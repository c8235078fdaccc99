"""The failure state of a connection loop that reconnects with backoff (agentd/retry.py)."""

from __future__ import annotations

from typing import Any

from agentd.retry import Backoff


class Reconnects:
    """The failure state of an adapter's connection loop. The first failure of a run is
    audited (`connection_error`) and logged with `warning` (a %s format), the first
    success after it is audited (`reconnected`) and resets the backoff; the retries in
    between are quiet, so a platform down for an hour costs two audit rows, not hundreds."""

    def __init__(self, ctx: Any, backoff: Backoff, warning: str) -> None:
        self.ctx, self.backoff, self.warning = ctx, backoff, warning
        self.failing = False

    def up(self) -> None:
        """The connection (or a poll) works again."""
        if self.failing:
            self.ctx.audit("reconnected")
        self.failing = False
        self.backoff.reset()

    def down(self, error: Any) -> None:
        """The connection failed with `error`; the caller backs off before the next try."""
        if not self.failing:
            self.ctx.audit("connection_error", error=str(error)[:300])
            self.ctx.log.warning(self.warning, error)
        self.failing = True
