"""Manual mode: tool calls wait here until a human approves or rejects them."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentd.errors import Conflict, NotFound
from agentd.timestamps import iso, utcnow


@dataclass
class Approval:
    """One pending (or decided) tool call."""

    id: str
    agent_id: str
    agent_name: str
    tool: str
    input: dict[str, Any]
    requested_at: str
    decision: str | None = None          # "approved" | "rejected" | "timeout"
    _event: threading.Event = field(default_factory=threading.Event, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "agent_id": self.agent_id, "agent_name": self.agent_name,
                "tool": self.tool, "input": self.input, "requested_at": self.requested_at,
                "status": self.decision or "pending"}


class ApprovalQueue:
    """Pending approvals, in the order they were requested."""

    def __init__(self) -> None:
        self._pending: dict[str, Approval] = {}
        self._lock = threading.Lock()

    def request(self, agent_id: str, agent_name: str, tool: str, args: dict[str, Any]) -> Approval:
        approval = Approval(uuid.uuid4().hex, agent_id, agent_name, tool, args, iso(utcnow()))
        with self._lock:
            self._pending[approval.id] = approval
        return approval

    def wait(self, approval: Approval, timeout: float, cancel: threading.Event | None = None) -> str:
        """Block until decided, timed out or cancelled; returns the decision."""
        step = 0.2
        waited = 0.0
        while waited < timeout:
            if approval._event.wait(min(step, timeout - waited)):
                break
            waited += step
            if cancel is not None and cancel.is_set():
                self._decide(approval.id, "cancelled", allow_missing=True)
                break
        else:
            self._decide(approval.id, "timeout", allow_missing=True)
        with self._lock:
            self._pending.pop(approval.id, None)
        return approval.decision or "timeout"

    def _decide(self, approval_id: str, decision: str, allow_missing: bool = False) -> Approval | None:
        with self._lock:
            approval = self._pending.get(approval_id)
            if approval is None:
                if allow_missing:
                    return None
                raise NotFound("approval not found")
            if approval.decision is not None:
                if allow_missing:
                    return approval
                raise Conflict(f"approval already {approval.decision}")
            approval.decision = decision
            approval._event.set()
            return approval

    def local(self, approval_id: str) -> Approval | None:
        """The approval a run of this process waits on (its `decision` is set once decided),
        None when it is not one of them."""
        with self._lock:
            return self._pending.get(approval_id)

    def find(self, approval_id: str) -> Approval | None:
        """The approval while it is known: pending, or decided and not yet taken by its run."""
        return self.local(approval_id)

    def approve(self, approval_id: str) -> Approval:
        return self._decide(approval_id, "approved")  # type: ignore[return-value]

    def reject(self, approval_id: str) -> Approval:
        return self._decide(approval_id, "rejected")  # type: ignore[return-value]

    def pending(self) -> list[dict[str, Any]]:
        with self._lock:
            return [a.as_dict() for a in self._pending.values() if a.decision is None]

    def cancel_agent(self, agent_id: str) -> None:
        """Reject everything an agent is waiting on (it was killed or stopped)."""
        with self._lock:
            for approval in self._pending.values():
                if approval.agent_id == agent_id and approval.decision is None:
                    approval.decision = "cancelled"
                    approval._event.set()
