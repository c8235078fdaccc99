"""Common parts of the polling-platform fakes: a Flask app on a FakeServer with
credential checks, a request log, scripted 429s (`throttle`: Retry-After seconds for
the next send calls) and the contract the shared channel tests drive:
`user_says(...)`, `replies(chat)`, `polls` (inbound reads served so far)."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from flask import Flask, jsonify

from fakes.http import FakeServer


class FakePlatform(FakeServer):
    def __init__(self, name: str) -> None:
        self.app = Flask(f"fake-{name}")
        self.lock = threading.Condition()
        self.throttle: list[int] = []
        self.sent: list[dict[str, Any]] = []   # what the bot posted, in the platform's format
        self.polls: list[float] = []           # when each inbound read was served
        super().__init__(self.app)

    # Ids keep growing across fake instances: an adapter's persisted cursor (last post id...)
    # outlives one test's fake, as it would outlive a platform restart.
    _ids = itertools.count(1001)

    def new_id(self) -> int:
        return next(FakePlatform._ids)

    def throttled(self, body: Any = None):  # type: ignore[no-untyped-def]
        """A 429 with Retry-After when a throttle is scripted, else None."""
        if not self.throttle:
            return None
        wait = self.throttle.pop(0)
        response = jsonify(body if body is not None else {"error": "rate limited"})
        response.status_code = 429
        response.headers["Retry-After"] = str(wait)
        return response

    def record(self, **item: Any) -> None:
        with self.lock:
            self.sent.append({**item, "at": time.time()})
            self.lock.notify_all()

    def polled(self) -> None:
        self.polls.append(time.time())

    def wait_for_message(self, timeout: float) -> None:
        """Long-poll helper: block until `notify` or timeout (caller holds no lock)."""
        with self.lock:
            self.lock.wait(timeout)

    def notify(self) -> None:
        with self.lock:
            self.lock.notify_all()
