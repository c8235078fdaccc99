"""Approvals in the database: created on one daemon, decided on any.

Same interface as `ApprovalQueue` (agentd/agents/approvals.py). The row in
`cluster_approvals` is the truth: a decision is one conditional UPDATE (only a pending
row changes, so two daemons deciding at once cannot both win), and a waiting run polls
its row, so it notices a decision made on another daemon within one poll step. A
decision made on the same daemon also wakes the waiter at once through its event.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pony import orm

from agentd.agents.approvals import Approval, ApprovalQueue
from agentd.errors import Conflict, NotFound
from agentd.store import Store

POLL_SECS = 0.2


class SharedApprovalQueue(ApprovalQueue):
    """ApprovalQueue whose pending calls and decisions live in `cluster_approvals`."""

    def __init__(self, store: Store, daemon_id: str) -> None:
        super().__init__()
        self.store = store
        self.daemon_id = daemon_id

    def request(self, agent_id: str, agent_name: str, tool: str, args: dict[str, Any]) -> Approval:
        approval = super().request(agent_id, agent_name, tool, args)
        with orm.db_session:
            self.store.db.execute(
                "INSERT INTO cluster_approvals (id, agent_id, agent_name, tool, input, requested_at, daemon_id) "
                "VALUES ($i, $a, $n, $t, $inp, $at, $d)",
                {"i": approval.id, "a": agent_id, "n": agent_name, "t": tool,
                 "inp": json.dumps(args, ensure_ascii=False), "at": approval.requested_at, "d": self.daemon_id})
        return approval

    def _stored_decision(self, approval_id: str) -> str | None:
        with orm.db_session:
            rows = self.store.db.select("SELECT decision FROM cluster_approvals WHERE id = $i", {"i": approval_id})
        return rows[0] if rows else "cancelled"

    def wait(self, approval: Approval, timeout: float, cancel: Any = None) -> str:
        """Block until decided (here or on another daemon), timed out or cancelled."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                decision = self._settle(approval.id, "timeout")
                break
            approval._event.wait(min(POLL_SECS, left))
            decision = self._stored_decision(approval.id)
            if decision is not None:
                break
            if cancel is not None and cancel.is_set():
                decision = self._settle(approval.id, "cancelled")
                break
        approval.decision = decision
        with self._lock:
            self._pending.pop(approval.id, None)
        # The run has its answer: the approval is gone, as with the in-memory queue
        # (deciding it again is 404).
        with orm.db_session:
            self.store.db.execute("DELETE FROM cluster_approvals WHERE id = $i", {"i": approval.id})
        return decision

    def _settle(self, approval_id: str, decision: str) -> str:
        """Record `decision` unless one was made meanwhile; the decision that holds."""
        if self._update(approval_id, decision):
            return decision
        return self._stored_decision(approval_id) or decision

    def _update(self, approval_id: str, decision: str) -> bool:
        with orm.db_session:
            return self.store.db.execute(
                "UPDATE cluster_approvals SET decision = $d, decided_at = $now WHERE id = $i AND decision IS NULL",
                {"d": decision, "now": time.time(), "i": approval_id}).rowcount == 1

    def _decide(self, approval_id: str, decision: str, allow_missing: bool = False) -> Approval | None:
        approval = self._load(approval_id)  # read first: the woken waiter deletes the row
        if approval is not None and approval.decision is None and self._update(approval_id, decision):
            approval.decision = decision
            with self._lock:
                local = self._pending.get(approval_id)
            if local is not None:  # requested here: the waiter's own object carries it at once
                local.decision = decision
                local._event.set()
                return local
            return approval
        if allow_missing:
            return None
        current = self._load(approval_id)
        if current is None:
            raise NotFound("approval not found")
        raise Conflict(f"approval already {current.decision}")

    def find(self, approval_id: str) -> Approval | None:
        return self._load(approval_id)

    def _load(self, approval_id: str) -> Approval | None:
        with orm.db_session:
            rows = self.store.db.select("SELECT id, agent_id, agent_name, tool, input, requested_at, decision "
                                        "FROM cluster_approvals WHERE id = $i", {"i": approval_id})
        if not rows:
            return None
        r = rows[0]
        return Approval(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6])

    def pending(self) -> list[dict[str, Any]]:
        with orm.db_session:
            rows = self.store.db.select("SELECT id, agent_id, agent_name, tool, input, requested_at "
                                        "FROM cluster_approvals WHERE decision IS NULL ORDER BY requested_at, id")
        return [Approval(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5]).as_dict() for r in rows]

    def cancel_agent(self, agent_id: str) -> None:
        """Cancel everything an agent waits on, on any daemon (it was stopped or killed)."""
        with orm.db_session:
            self.store.db.execute("UPDATE cluster_approvals SET decision = 'cancelled', decided_at = $now "
                                  "WHERE agent_id = $a AND decision IS NULL", {"now": time.time(), "a": agent_id})
        with self._lock:
            for approval in self._pending.values():
                if approval.agent_id == agent_id:
                    approval._event.set()
