"""Loop guard: stops a model that keeps making the same tool call.

An identical call is the same tool name with the same canonical JSON arguments.
The 3rd identical call runs with a warning, the 5th and later are blocked, and
30 blocked calls in one run stop the run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

WARN_AT = 3
BLOCK_AT = 5
STOP_AFTER_BLOCKED = 30


@dataclass(frozen=True)
class Verdict:
    """What to do with one call: run it (maybe with a warning), or block it."""

    action: str        # "allow" | "warn" | "block"
    count: int
    message: str = ""


def call_key(name: str, arguments: Any) -> str:
    """Canonical identity of a call: JSON of [name, arguments] with sorted keys (so the same
    arguments in another key order are the same call)."""
    return json.dumps([name, arguments], sort_keys=True)


@dataclass
class LoopGuard:
    """Per-run state; a new guard for every message."""

    counts: dict[str, int] = field(default_factory=dict)
    blocked: int = 0

    def check(self, name: str, arguments: Any) -> Verdict:
        """Count this call and decide."""
        key = call_key(name, arguments)
        count = self.counts.get(key, 0) + 1
        self.counts[key] = count
        if count >= BLOCK_AT:
            self.blocked += 1
            return Verdict("block", count,
                           f"blocked by loop guard: tool '{name}' was called {count} times with "
                           "identical arguments; it was not run. Try a different approach.")
        if count >= WARN_AT:
            return Verdict("warn", count,
                           f"[loop guard] warning: tool '{name}' has been called {count} times with "
                           f"identical arguments; it will be blocked from call {BLOCK_AT} on.")
        return Verdict("allow", count)

    @property
    def tripped(self) -> bool:
        """True once enough calls were blocked that the run must stop."""
        return self.blocked >= STOP_AFTER_BLOCKED
