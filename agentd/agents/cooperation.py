"""What agents share beyond one another: the task board and the event bus, as the tools
reach them (agentd/agents/tools/cooperation.py) on behalf of one agent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from agentd.tasks.board import TaskBoard
    from agentd.triggers.bus import EventBus

Audit = Callable[[str, str, dict[str, Any]], None]


@dataclass(frozen=True)
class Cooperation:
    tasks: TaskBoard
    events: EventBus
    audit: Audit | None = None
