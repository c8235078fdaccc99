"""Approvals on a database several daemons share (agentd/agents/shared_approvals.py).

Two `SharedApprovalQueue` objects with different daemon ids on one real store stand for
two daemons (as in tests/cluster/test_cluster_units.py); this file checks values exactly: the stored
row, who wins a race, the poll steps, cancellation and a row removed under a waiter.
Runs on SQLite (the same SQL runs on PostgreSQL in tests/cluster/test_cluster_units.py and, through
real daemons, tests/cluster/test_cluster.py).
"""

from __future__ import annotations

import re
import threading
import time

import pytest
from pony import orm

from agentd.agents.shared_approvals import POLL_SECS, SharedApprovalQueue
from agentd.errors import Conflict, NotFound
from agentd.store import open_store
from tests.agents.test_approvals import RecordingEvent


@pytest.fixture()
def store(tmp_path):
    s = open_store(tmp_path / "agentd.db")   # migrations create cluster_approvals
    yield s
    s.close()


def rows(store) -> list[tuple]:
    with orm.db_session:
        return [tuple(r) for r in store.db.select(
            "SELECT id, agent_id, agent_name, tool, input, requested_at, daemon_id, decision FROM cluster_approvals "
            "ORDER BY requested_at, id")]


def test_a_request_is_one_row_every_daemon_lists(store) -> None:
    a, b = SharedApprovalQueue(store, "A"), SharedApprovalQueue(store, "B")
    approval = a.request("a1", "alpha", "file_write", {"path": "é.txt", "n": 1})
    assert re.fullmatch(r"[0-9a-f]{32}", approval.id)
    assert (approval.agent_id, approval.agent_name, approval.tool, approval.input, approval.decision) == \
        ("a1", "alpha", "file_write", {"path": "é.txt", "n": 1}, None), "BUG: the waiter's own approval is wrong"
    assert a._pending == {approval.id: approval}
    assert rows(store) == [(approval.id, "a1", "alpha", "file_write", '{"path": "é.txt", "n": 1}',
                            approval.requested_at, "A", None)], "BUG: the stored approval row is wrong"
    expected = [{"id": approval.id, "agent_id": "a1", "agent_name": "alpha", "tool": "file_write",
                 "input": {"path": "é.txt", "n": 1}, "requested_at": approval.requested_at, "status": "pending"}]
    assert b.pending() == expected and a.pending() == expected, "BUG: daemons disagree on what is pending"


def test_pending_is_in_request_order_and_skips_decided_rows(store) -> None:
    a, b = SharedApprovalQueue(store, "A"), SharedApprovalQueue(store, "B")
    first = a.request("a1", "alpha", "t1", {})
    time.sleep(0.002)
    second = b.request("a2", "beta", "t2", {})
    time.sleep(0.002)
    third = a.request("a1", "alpha", "t3", {})
    assert [p["id"] for p in b.pending()] == [first.id, second.id, third.id]
    b.approve(second.id)
    assert [p["id"] for p in a.pending()] == [first.id, third.id], "BUG: a decided call is still pending"


def test_a_decision_on_another_daemon_reaches_the_waiter(store) -> None:
    a, b = SharedApprovalQueue(store, "A"), SharedApprovalQueue(store, "B")
    approval = a.request("a1", "alpha", "t", {"x": 1})
    decided = b.reject(approval.id)
    assert decided is not approval, "B has no local waiter: it answers from the row"
    found = b.find(approval.id)
    assert (found.id, found.agent_id, found.decision) == (approval.id, "a1", "rejected"), \
        "BUG: a decided approval its run has not taken yet is not found on another daemon"
    assert (decided.id, decided.agent_id, decided.agent_name, decided.tool, decided.input, decided.requested_at,
            decided.decision) == (approval.id, "a1", "alpha", "t", {"x": 1}, approval.requested_at, "rejected")
    assert a.wait(approval, 30) == "rejected" and approval.decision == "rejected"
    assert rows(store) == [], "BUG: a finished approval stays in the table"
    assert a._pending == {}, "BUG: finished approvals pile up in the daemon's memory"
    assert b.find(approval.id) is None
    with pytest.raises(NotFound, match="^approval not found$"):
        b.approve(approval.id)


def test_a_decision_on_the_same_daemon_wakes_the_waiters_own_object(store) -> None:
    a = SharedApprovalQueue(store, "A")
    approval = a.request("a1", "alpha", "t", {})
    decided = a.approve(approval.id)
    assert decided is approval and approval.decision == "approved" and approval._event.is_set(), \
        "BUG: a local decision does not wake the waiting run at once"
    assert a.wait(approval, 30) == "approved"


def test_only_the_first_decision_wins(store) -> None:
    a, b = SharedApprovalQueue(store, "A"), SharedApprovalQueue(store, "B")
    approval = a.request("a1", "alpha", "t", {})
    a.approve(approval.id)
    for queue in (a, b):
        for act in (queue.approve, queue.reject):
            with pytest.raises(Conflict) as caught:
                act(approval.id)
            assert str(caught.value) == "approval already approved"
    assert rows(store)[0][7] == "approved"
    assert b._decide(approval.id, "cancelled", allow_missing=True) is None
    assert b._decide("nope", "cancelled", allow_missing=True) is None
    with pytest.raises(NotFound, match="^approval not found$"):
        b.reject("nope")


def test_timeout_polls_in_steps_and_records_the_timeout(store) -> None:
    a = SharedApprovalQueue(store, "A")
    approval = a.request("a1", "alpha", "t", {})
    approval._event = RecordingEvent()
    began = time.monotonic()
    assert a.wait(approval, 0.5) == "timeout" and approval.decision == "timeout"
    assert time.monotonic() - began >= 0.5, "BUG: the wait ended before its timeout"
    waits = approval._event.waits
    assert waits[0] == POLL_SECS == 0.2 and all(0 < w <= POLL_SECS for w in waits), \
        f"BUG: the waiter does not poll its row every {POLL_SECS} s: {waits}"
    # The polls between the waits take their share of the timeout (more on a loaded host).
    assert sum(waits) <= 0.5 + 1e-9, f"BUG: the wait is not bounded by the timeout: {waits}"
    assert rows(store) == [] and a.pending() == []


def test_a_zero_timeout_records_a_timeout_without_waiting(store) -> None:
    a = SharedApprovalQueue(store, "A")
    approval = a.request("a1", "alpha", "t", {})
    approval._event = RecordingEvent()
    assert a.wait(approval, 0) == "timeout" and approval._event.waits == []


def test_a_decision_racing_the_timeout_holds(store) -> None:
    a, b = SharedApprovalQueue(store, "A"), SharedApprovalQueue(store, "B")
    approval = a.request("a1", "alpha", "t", {})
    b.approve(approval.id)
    assert a._settle(approval.id, "timeout") == "approved", "BUG: a timeout overwrote a human's decision"
    assert rows(store)[0][7] == "approved"
    fresh = a.request("a1", "alpha", "t", {})
    assert a._settle(fresh.id, "timeout") == "timeout" and rows(store)[1][7] == "timeout"


def test_a_cancelled_run_stops_waiting_after_one_poll(store) -> None:
    a = SharedApprovalQueue(store, "A")
    approval = a.request("a1", "alpha", "t", {})
    approval._event = RecordingEvent()
    cancel = threading.Event()
    cancel.set()
    assert a.wait(approval, 60, cancel) == "cancelled", "BUG: a stopped run keeps waiting for approval"
    assert approval._event.waits == [POLL_SECS] and rows(store) == []


def test_a_decision_already_made_beats_the_cancel(store) -> None:
    a, b = SharedApprovalQueue(store, "A"), SharedApprovalQueue(store, "B")
    approval = a.request("a1", "alpha", "t", {})
    b.approve(approval.id)
    cancel = threading.Event()
    cancel.set()
    assert a.wait(approval, 60, cancel) == "approved"


def test_an_unset_cancel_does_not_cancel(store) -> None:
    a = SharedApprovalQueue(store, "A")
    approval = a.request("a1", "alpha", "t", {})
    assert a.wait(approval, 0.3, threading.Event()) == "timeout"


def test_a_row_removed_under_the_waiter_is_a_cancellation(store) -> None:
    a = SharedApprovalQueue(store, "A")
    approval = a.request("a1", "alpha", "t", {})
    with orm.db_session:
        store.db.execute("DELETE FROM cluster_approvals")   # the reaper cleaned up after a dead daemon
    assert a.wait(approval, 60) == "cancelled"
    assert a._stored_decision(approval.id) == "cancelled"


def test_stopping_an_agent_cancels_its_calls_on_every_daemon(store) -> None:
    a, b = SharedApprovalQueue(store, "A"), SharedApprovalQueue(store, "B")
    mine = a.request("a1", "alpha", "t", {})
    decided = a.request("a1", "alpha", "t", {"n": 2})
    other = a.request("a2", "beta", "t", {})
    b.approve(decided.id)
    b.cancel_agent("a1")
    by_id = {r[0]: r[7] for r in rows(store)}
    assert (by_id[mine.id], by_id[decided.id], by_id[other.id]) == ("cancelled", "approved", None), \
        "BUG: cancel_agent touched another agent's or an already decided call"
    assert not mine._event.is_set(), "B holds no waiter of A's"
    a.cancel_agent("a1")
    assert mine._event.is_set() and not other._event.is_set(), "BUG: the local waiter is not woken"
    assert a.wait(mine, 60) == "cancelled"
    assert [p["id"] for p in b.pending()] == [other.id]


class StopThatDecides:
    """A run's cancel flag that is found set just as a human on another daemon decides."""

    def __init__(self, decide) -> None:
        self.decide = decide

    def is_set(self) -> bool:
        if self.decide is not None:
            decide, self.decide = self.decide, None
            decide()
        return True


def test_a_decision_landing_as_the_run_is_stopped_holds(store) -> None:
    a, b = SharedApprovalQueue(store, "A"), SharedApprovalQueue(store, "B")
    approval = a.request("a1", "alpha", "t", {})
    assert a.wait(approval, 60, StopThatDecides(lambda: b.approve(approval.id))) == "approved", \
        "BUG: a stop racing a human's decision overwrote it"
    assert approval.decision == "approved" and rows(store) == [] and a._pending == {}
