"""The daemon's event bus: what happened (a KV key changed, a custom event, a workflow
completed, an agent run failed, a channel message arrived), handed to subscribers off the
publisher's thread so a publisher never waits for what its event starts.

Events are not persisted and not sent to other daemons: the daemon where an event happens
evaluates it, so on a shared database each event is evaluated once.
"""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

from agentd.timestamps import iso, utcnow
from agentd.store.outage import log_failure

log = logging.getLogger("agentd.events")

# What an event is about; each trigger pattern listens to one kind.
MEMORY = "memory"      # type memory_key_changed
CUSTOM = "custom"      # event_publish and POST /api/events: the publisher's event_type
WORKFLOW = "workflow"  # type workflow_completed
AGENT = "agent"        # type agent_failed
CHANNEL = "channel"    # type channel_message


@dataclass(frozen=True)
class Event:
    kind: str
    type: str
    payload: dict[str, Any]
    # The agent whose action caused the event (or whose key changed), and the origin of the
    # run it happened in ("trigger", "api", ...; "" outside any run): a trigger's own run
    # must not fire its agent's triggers again.
    agent_id: str | None = None
    origin: str = ""
    # The scoped API key that published it (POST /api/events, event_publish in a run of the
    # key, a workflow run the key started; "": the admin or the daemon): it fires only
    # triggers of agents the key reaches (agentd/triggers/service.py).
    key_id: str = ""
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    at: datetime = field(default_factory=utcnow)

    def as_json(self) -> dict[str, Any]:
        """The event as a trigger's prompt shows it (`{{event}}`)."""
        return {"id": self.id, "type": self.type, "agent_id": self.agent_id, "payload": self.payload,
                "timestamp": iso(self.at)}


Subscriber = Callable[[Event], None]


class EventBus:
    """publish() returns at once; subscribers hear events in the order they were published,
    on the bus's own thread."""

    def __init__(self, workers: int = 1) -> None:
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        self._closed = False
        # Threads start on the first event, so a daemon that never publishes runs none.
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agentd-events")

    def subscribe(self, fn: Subscriber) -> None:
        with self._lock:
            self._subscribers.append(fn)

    def publish(self, event: Event) -> Event:
        with self._lock:
            if self._closed:
                return event
            subscribers = list(self._subscribers)
            for fn in subscribers:
                self._pool.submit(self._deliver, fn, event)
        return event

    @staticmethod
    def _deliver(fn: Subscriber, event: Event) -> None:
        try:
            fn(event)
        except Exception as exc:  # noqa: BLE001 - one subscriber's failure must not stop the bus
            log_failure(log, exc, "event %s (%s): a subscriber failed", event.id, event.type)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
