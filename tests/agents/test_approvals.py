"""Manual-mode approvals (agentd/agents/approvals.py), value by value, in process.

What a human and the model see: the pending list (order, fields, status), each decision
and the exact refusal for a wrong one, the timeout, cancellation by a stopped run or a
killed agent. The same queue is driven through the daemon in tests/agents/test_agents.py
(test_manual_mode_waits_for_approval) and tests/api/test_guards_daemon.py (the approval timeout).
"""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from agentd.agents.approvals import Approval, ApprovalQueue
from agentd.errors import Conflict, NotFound


class RecordingEvent(threading.Event):
    """A real threading.Event that also notes every timeout it was asked to wait for."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return super().wait(timeout)


def test_a_request_is_pending_with_exact_fields() -> None:
    q = ApprovalQueue()
    before = datetime.now(timezone.utc)
    a = q.request("agent-1", "alice", "file_write", {"path": "f", "content": "x"})
    after = datetime.now(timezone.utc)
    assert re.fullmatch(r"[0-9a-f]{32}", a.id), "approval ids are uuid4 hex"
    assert (a.agent_id, a.agent_name, a.tool, a.input, a.decision) == \
        ("agent-1", "alice", "file_write", {"path": "f", "content": "x"}, None)
    at = datetime.fromisoformat(a.requested_at)
    assert at.utcoffset() == timedelta(0) and before <= at <= after, "BUG: requested_at is not now in UTC"
    assert q.pending() == [{"id": a.id, "agent_id": "agent-1", "agent_name": "alice", "tool": "file_write",
                            "input": {"path": "f", "content": "x"}, "requested_at": a.requested_at,
                            "status": "pending"}]
    assert q.request("agent-1", "alice", "t", {}).id != a.id, "BUG: two approvals share an id"


def test_pending_lists_undecided_calls_in_request_order() -> None:
    q = ApprovalQueue()
    first, second, third = (q.request(f"a{i}", f"n{i}", f"tool{i}", {"i": i}) for i in range(3))
    assert [p["id"] for p in q.pending()] == [first.id, second.id, third.id]
    q.approve(second.id)
    assert [p["id"] for p in q.pending()] == [first.id, third.id], "BUG: a decided call is still listed as pending"
    q.reject(first.id)
    assert [(p["id"], p["status"]) for p in q.pending()] == [(third.id, "pending")]


@pytest.mark.parametrize("decide,decision", [("approve", "approved"), ("reject", "rejected")])
def test_a_decision_reaches_the_waiting_run(decide: str, decision: str) -> None:
    q = ApprovalQueue()
    a = q.request("agent-1", "alice", "shell_exec", {"command": "ls"})
    decided = getattr(q, decide)(a.id)
    assert decided is a and a.decision == decision and a.as_dict()["status"] == decision
    assert q.find(a.id) is a, "BUG: a decided approval its run has not taken yet is not found"
    assert q.wait(a, timeout=30) == decision, f"BUG: a {decision} call is not reported as {decision}"
    assert q.find(a.id) is None
    with pytest.raises(NotFound, match="^approval not found$"):
        q.approve(a.id)   # a finished wait forgets the approval


def test_deciding_twice_is_a_conflict_naming_the_first_decision() -> None:
    q = ApprovalQueue()
    a = q.request("agent-1", "alice", "t", {})
    q.reject(a.id)
    with pytest.raises(Conflict) as caught:
        q.approve(a.id)
    assert str(caught.value) == "approval already rejected" and caught.value.status == 409
    assert a.decision == "rejected", "BUG: a second decision overwrote the first"
    with pytest.raises(Conflict, match="^approval already rejected$"):
        q.reject(a.id)


def test_unknown_approval_is_not_found() -> None:
    q = ApprovalQueue()
    q.request("agent-1", "alice", "t", {})
    for act in (q.approve, q.reject):
        with pytest.raises(NotFound) as caught:
            act("0" * 32)
        assert str(caught.value) == "approval not found" and caught.value.status == 404


def test_a_call_decided_while_waiting_wakes_the_run() -> None:
    q = ApprovalQueue()
    a = q.request("agent-1", "alice", "t", {})
    threading.Timer(0.3, q.approve, args=(a.id,)).start()
    assert q.wait(a, timeout=60) == "approved"
    assert q.pending() == []


def test_timeout_waits_in_steps_up_to_the_exact_timeout() -> None:
    q = ApprovalQueue()
    a = q.request("agent-1", "alice", "t", {})
    a._event = RecordingEvent()
    assert q.wait(a, timeout=0.5) == "timeout", "BUG: an unanswered approval is not a timeout"
    assert a.decision == "timeout" and a.as_dict()["status"] == "timeout"
    assert a._event.waits == [0.2, 0.2, pytest.approx(0.1)], \
        "BUG: the approval wait does not step 0.2 s up to the exact timeout"
    assert q.pending() == []
    with pytest.raises(NotFound):
        q.approve(a.id)   # too late: the run already went on without it


def test_a_timeout_shorter_than_a_step_is_waited_exactly() -> None:
    q = ApprovalQueue()
    a = q.request("agent-1", "alice", "t", {})
    a._event = RecordingEvent()
    assert q.wait(a, timeout=0.05) == "timeout"
    assert a._event.waits == [0.05]


def test_a_zero_timeout_does_not_wait() -> None:
    q = ApprovalQueue()
    a = q.request("agent-1", "alice", "t", {})
    a._event = RecordingEvent()
    assert q.wait(a, timeout=0) == "timeout" and a._event.waits == []


def test_a_cancelled_run_stops_waiting_at_the_next_step() -> None:
    q = ApprovalQueue()
    a = q.request("agent-1", "alice", "t", {})
    a._event = RecordingEvent()
    cancel = threading.Event()
    cancel.set()
    started = time.monotonic()
    assert q.wait(a, timeout=60, cancel=cancel) == "cancelled", "BUG: a stopped run keeps waiting for approval"
    assert time.monotonic() - started < 20, "BUG: cancellation is only seen when the timeout ends"
    assert a._event.waits == [0.2] and a.decision == "cancelled"
    assert q.pending() == []


def test_an_unset_cancel_event_does_not_cancel() -> None:
    q = ApprovalQueue()
    a = q.request("agent-1", "alice", "t", {})
    a._event = RecordingEvent()
    assert q.wait(a, timeout=0.3, cancel=threading.Event()) == "timeout"
    assert a._event.waits == [0.2, pytest.approx(0.1)]


def test_a_decision_racing_the_cancel_is_kept() -> None:
    q = ApprovalQueue()
    a = q.request("agent-1", "alice", "t", {})
    q.approve(a.id)
    assert q._decide(a.id, "cancelled", allow_missing=True) is a and a.decision == "approved", \
        "BUG: a late cancel overwrote a human's decision"
    assert q._decide("missing", "cancelled", allow_missing=True) is None


def test_killing_an_agent_cancels_only_its_undecided_calls() -> None:
    q = ApprovalQueue()
    mine = q.request("agent-1", "alice", "t", {})
    decided = q.request("agent-1", "alice", "t", {"n": 2})
    other = q.request("agent-2", "bob", "t", {})
    q.approve(decided.id)
    q.cancel_agent("agent-1")
    assert (mine.decision, decided.decision, other.decision) == ("cancelled", "approved", None), \
        "BUG: cancel_agent touched another agent's or an already decided call"
    assert mine._event.is_set() and not other._event.is_set()
    assert q.wait(mine, timeout=60) == "cancelled"
    assert [p["id"] for p in q.pending()] == [other.id]


def test_status_of_a_fresh_approval_object() -> None:
    a = Approval("i", "a", "n", "t", {}, "2026-01-01T00:00:00+00:00")
    assert a.as_dict() == {"id": "i", "agent_id": "a", "agent_name": "n", "tool": "t", "input": {},
                           "requested_at": "2026-01-01T00:00:00+00:00", "status": "pending"}
    assert not a._event.is_set()


class LateDecision(threading.Event):
    """An Event whose wait times out just as a human decides (the decision lands between
    the waiter's timed-out wait and its next check)."""

    def __init__(self, decide) -> None:
        super().__init__()
        self.decide = decide

    def wait(self, timeout: float | None = None) -> bool:
        woke = super().wait(timeout)
        if not woke and self.decide is not None:
            decide, self.decide = self.decide, None
            decide()
        return woke


def test_a_decision_landing_as_the_run_is_stopped_is_kept() -> None:
    q = ApprovalQueue()
    a = q.request("agent-1", "alice", "t", {})
    a._event = LateDecision(lambda: q.approve(a.id))
    cancel = threading.Event()
    cancel.set()
    assert q.wait(a, timeout=60, cancel=cancel) == "approved", \
        "BUG: a decision racing the run's stop raised or was overwritten"
    assert q.pending() == []


def test_a_decision_landing_in_the_last_step_beats_the_timeout() -> None:
    q = ApprovalQueue()
    a = q.request("agent-1", "alice", "t", {})
    a._event = LateDecision(lambda: q.reject(a.id))
    assert q.wait(a, timeout=0.1) == "rejected", "BUG: a decision racing the timeout raised or was overwritten"
