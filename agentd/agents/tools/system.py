"""system_time."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from agentd.agents.tools.base import ToolContext, tool


# Each tool is registered by calling `tool(...)(fn)` after its function rather than with a
# decorator: mutmut does not mutate decorated functions, and these bodies are what the
# mutation tests must reach (issue 19). Registration order is unchanged.
def system_time(ctx: ToolContext, args: dict[str, Any]) -> str:
    now = datetime.now(timezone.utc)
    return f"{now.isoformat(timespec='seconds').replace('+00:00', 'Z')} (unix {int(time.time())})"


tool("system_time", "The current date and time (UTC, ISO 8601) and Unix time.", {}, read_only=True)(system_time)
