"""Who is watching an agent: the open WebSockets of each agent, so a run nobody asked for
in that socket (a cron job's) is shown there too. A listener has `send(type, **data)` (one
frame), `on_event(event)` (a run's events, as for its own runs) and `session_id`, the session
of the agent it talks in (None: the agent's own): it is shown the runs written there."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from agentd.agents.events import Event


class Listener(Protocol):
    session_id: str | None

    def send(self, type_: str, **data: Any) -> None: ...
    def on_event(self, event: Event) -> None: ...


class AgentListeners:
    def __init__(self) -> None:
        self._by_agent: dict[str, list[Listener]] = {}
        self._lock = threading.Lock()

    def add(self, agent_id: str, listener: Listener) -> None:
        with self._lock:
            self._by_agent.setdefault(agent_id, []).append(listener)

    def remove(self, agent_id: str, listener: Listener) -> None:
        with self._lock:
            listeners = self._by_agent.get(agent_id, [])
            if listener in listeners:
                listeners.remove(listener)
            if not listeners:
                self._by_agent.pop(agent_id, None)

    def of(self, agent_id: str) -> list[Listener]:
        with self._lock:
            return list(self._by_agent.get(agent_id, ()))
