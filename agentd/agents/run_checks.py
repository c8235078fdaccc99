"""The refusals made before a run's response starts: the agent's hourly LLM token quota,
the budget and the scoped key's budget, each counted as a refusal in the metrics."""

from __future__ import annotations

import collections
import time
from typing import Callable

from agentd.agents.handle import AgentHandle
from agentd.errors import TooManyRequests
from agentd.metrics import Metrics
from agentd.store.outage import as_outage


def recent_tokens(handle: AgentHandle, now: float) -> collections.deque:
    """The agent's token log with entries older than an hour dropped (so it stays bounded)."""
    log_ = handle.token_log
    while log_ and log_[0][0] <= now - 3600:
        log_.popleft()
    return log_


def check_quota(handle: AgentHandle) -> None:
    """429 when the agent used its `max_llm_tokens_per_hour` in the last hour."""
    limit = handle.manifest.tokens_per_hour
    if not limit:
        return
    now = time.monotonic()  # the hour is a duration: a clock change must not move it
    log_ = recent_tokens(handle, now)
    used = sum(n for _, n in log_)
    if used >= limit:
        retry = int(log_[0][0] + 3600 - now) + 1  # (a limit is positive: the log is not empty)
        raise TooManyRequests(
            f"message delivery failed: quota exceeded: {used} of {limit} LLM tokens used in the "
            "last hour (max_llm_tokens_per_hour)", retry_after=retry)


class RunChecks:
    """Asked before every run (and again by a run that waited in its agent's queue)."""

    def __init__(self, preflight: Callable[[AgentHandle], None] | None = None,
                 key_budget: Callable[[str], None] | None = None, metrics: Metrics | None = None) -> None:
        # The budget's refusal (Metering.check_budget).
        self.preflight = preflight
        # A scoped key's own budget (KeyBudgets.check_budget).
        self.key_budget = key_budget
        self.metrics = metrics

    def precheck(self, handle: AgentHandle, key_id: str) -> None:
        """Refusals that must happen before a response starts (quota, budget, the key's budget)."""
        try:
            check_quota(handle)
        except TooManyRequests:
            self.refused("quota", handle)
            raise
        try:
            # The budgets are read from the database (a shared one on every check): its outage
            # is a 503 to retry, also on the worker that checks a queued run again.
            with as_outage():
                if self.preflight is not None:
                    self.preflight(handle)
                if key_id and self.key_budget is not None:
                    self.key_budget(key_id)
        except TooManyRequests:
            self.refused("budget", handle)
            raise

    def refused(self, reason: str, handle: AgentHandle) -> None:
        # Bodies over a size limit are counted by the HTTP layer, which refuses most of them.
        if self.metrics is not None:
            self.metrics.refusal(reason, handle.name)
