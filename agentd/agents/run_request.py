"""What a caller hands `Runs.start` and what it gets back: the `RunRequest` (one message
for one agent, and where its run executes: `WORKER`, `CALLER` or `INLINE`, described in
agentd/agents/runs.py), the `RunTicket` of a started run, and the 64 KB message check every
client-facing entry makes."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

from agentd import logs, tracing
from agentd.agents.events import Sink
from agentd.agents.handle import MESSAGE_LIMIT, AgentHandle, RunOptions
from agentd.agents.loop import RunResult
from agentd.agents.runqueue import ClaimedRun
from agentd.errors import PayloadTooLarge

if TYPE_CHECKING:
    from agentd.agents.runs import Runs

Where = Literal["worker", "caller", "inline"]
WORKER: Where = "worker"
CALLER: Where = "caller"
INLINE: Where = "inline"


def check_message(text: str, what: str = "message") -> None:
    """413 for a message (or a workflow's input) over the 64 KB every client-facing entry allows."""
    if len(text.encode("utf-8")) > MESSAGE_LIMIT:
        raise PayloadTooLarge(f"{what} too large (max 64 KB)")


@dataclass
class RunRequest:
    """One message for one agent, and how its caller takes the run (see agentd/agents/runs.py)."""

    handle: AgentHandle
    text: str
    attachments: list[dict[str, Any]] = field(default_factory=list)
    options: RunOptions | None = None
    emit: Sink | None = None  # the run's events (None: only the result is wanted)
    cancel: threading.Event = field(default_factory=threading.Event)  # set to stop the run
    on: Where = WORKER
    wait: float | None = None  # INLINE: how long to wait for the agent's current run (None: no limit)
    session_id: str = ""  # another session of the agent, created (labelled `label`) on first use
    label: str = ""
    # A client's text is held to 64 KB; a workflow step's prompt or an agent's send is
    # composed from earlier answers and is not.
    from_client: bool = True
    # Who started the run: api, sse, ws, v1, channel, workflow, agent, schedule, trigger, mcp, a2a.
    origin: str = "api"
    # The starter's trace context: the run's span continues it on whichever thread runs it.
    trace: Any = field(default_factory=tracing.capture)
    # The HTTP request that asked for the run (its log lines name it, on any thread).
    request_id: str | None = field(default_factory=logs.request_id)
    # The scoped API key the run is paid by ("" : the admin key or nobody's): its budget is
    # checked before the run and its usage rows name it (agentd/apikeys.py).
    key_id: str = ""
    # Whose conversation this is ("user:<name>", "key:<id>", "session:<name>",
    # "channel:<adapter>:<sender>"; "" for the agent's own session): exchanges remembered
    # from it are recalled only into the same person's runs.
    owner: str = ""


class KeyRows(list):
    """Usage rows that name the scoped key paying for them as they are collected."""

    def __init__(self, key_id: str) -> None:
        super().__init__()
        self.key_id = key_id or None

    def append(self, row: dict[str, Any]) -> None:
        row["key_id"] = self.key_id
        super().append(row)


class RunTicket:
    """A started run. `result()` returns its result (running it here when its place is the
    caller's thread); `abandon()` is for a caller that will not wait after all; `stop()`
    withdraws it while queued, else cancels it."""

    def __init__(self, runs: Runs, request: RunRequest, claimed: ClaimedRun | None = None,
                 future: Future | None = None) -> None:
        self._runs = runs
        self.request = request
        self._claimed = claimed
        # The run's future when a worker runs (or may run) it; None for a run on the caller's thread.
        self.future = future if future is not None else (
            claimed.job.future if claimed is not None and not claimed.here else None)

    @property
    def here(self) -> bool:
        """Whether the run executes on the thread that calls `result()`."""
        return self.future is None

    def result(self, disconnected: Callable[[], bool] | None = None) -> RunResult:
        """The run's result (or its exception). A client that went away (`disconnected`)
        withdraws a queued run and cancels a running one."""
        if self._claimed is not None:
            return self._claimed.result(disconnected)
        if self.future is not None:
            return self._runs.queues.wait(self.future, self.request.cancel, disconnected)
        with self._runs.queues.watch.watching(self.request.cancel, disconnected):
            return self._runs._execute(self.request, recheck=False)

    def abandon(self) -> None:
        """The caller will not wait for the run (its client left first): free the agent, or
        withdraw the queued run. Nothing once `result` was called."""
        if self._claimed is not None:
            self._claimed.abandon()
        elif self.future is not None:
            self.stop()

    def stop(self) -> None:
        """Withdraw the run if it is still queued, else cancel it."""
        if self.future is None or not self.future.done():
            if self.future is None or not self._runs.queues.withdraw(self.future):
                self.request.cancel.set()
