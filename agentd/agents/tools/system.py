"""system_time."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from agentd.agents.tools.base import ToolContext, tool


@tool("system_time", "The current date and time (UTC, ISO 8601) and Unix time.", {}, read_only=True)
def system_time(ctx: ToolContext, args: dict[str, Any]) -> str:
    now = datetime.now(timezone.utc)
    return f"{now.isoformat(timespec='seconds').replace('+00:00', 'Z')} (unix {int(time.time())})"
