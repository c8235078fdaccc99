"""Trigger admission exactly (agentd/triggers/store.py) on a real store: the per-minute
window, the daily caps and their pause, the new UTC day, resuming, deleting by agent."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from pony import orm

from agentd.store import open_store
from agentd.timestamps import utcnow
from agentd.triggers import store as store_module
from agentd.triggers.store import TriggerStore
from support import store_url_for


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 3, 1, 23, 58, 0)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture()
def env(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(store_module, "_now", clock)
    audit: list = []
    store = open_store(tmp_path / "agentd.db", store_url_for(tmp_path))
    with orm.db_session:  # triggers belong to agents that exist
        for agent_id in ("a1", "a2"):
            store.e.AgentRow(id=agent_id, name=agent_id, manifest_toml="x", manifest={}, created_at=utcnow(),
                             last_active=utcnow(), session_id=agent_id)
    yield TriggerStore(store, lambda *entry: audit.append(entry)), clock, audit
    store.close()


def admit(triggers: TriggerStore, trigger_id: str, default_rate: int) -> tuple[bool, str]:
    admission = triggers.admit(trigger_id, default_rate)
    return admission.admitted, admission.why


def make(triggers: TriggerStore, agent_id: str = "a1", **caps) -> str:
    return triggers.create(agent_id, "content_match", {"content_match": "x"}, "p", **caps)["id"]


def test_rate_window_is_one_minute_from_its_first_firing(env) -> None:
    triggers, clock, _ = env
    tid = make(triggers)
    assert [admit(triggers, tid, 2) for _ in range(3)] == [(True, ""), (True, ""),
                                                           (False, "rate limit: 2 run(s) per minute")]
    clock.now += timedelta(seconds=59)
    assert admit(triggers, tid, 2) == (False, "rate limit: 2 run(s) per minute")
    clock.now += timedelta(seconds=1)
    assert admit(triggers, tid, 2) == (True, "")
    own = make(triggers, rate_limit_per_minute=1)
    assert [admit(triggers, own, 5)[0] for _ in range(2)] == [True, False], "the trigger's own limit wins"
    got = triggers.get(tid)
    assert got["fire_count"] == 3 and got["paused"] is False


def test_daily_runs_cap_pauses_until_the_next_utc_day(env) -> None:
    triggers, clock, audit = env
    tid = make(triggers, max_runs_per_day=2)
    reason = "max_runs_per_day reached: 2 of 2 run(s) today (resumes at 00:00 UTC)"
    assert admit(triggers, tid, 100) == (True, "")
    reaching = triggers.admit(tid, 100)
    assert (reaching.admitted, reaching.paused) == (True, reason), "the run that reaches the cap still runs"
    assert triggers.get(tid)["paused_reason"] == reason
    assert audit == [], "the pause is audited once the run started"
    triggers.started(tid, "a1", reaching)
    assert audit == [("trigger.paused", tid, {"trigger_id": tid, "agent_id": "a1", "reason": reason})]
    assert admit(triggers, tid, 100) == (False, reason)
    assert len(audit) == 1, "a paused trigger is not paused again"
    assert triggers.candidates("content_match") == []
    clock.now = datetime(2026, 3, 2, 0, 0, 1)
    # The new day ends the pause before any event comes: it shows so, and events reach it.
    assert (triggers.get(tid)["paused"], triggers.get(tid)["paused_reason"]) == (False, None)
    assert [t.id for t in triggers.candidates("content_match")] == [tid]
    assert admit(triggers, tid, 100) == (True, "")
    got = triggers.get(tid)
    assert (got["paused"], got["runs_today"], got["fire_count"]) == (False, 1, 3)


def test_a_refunded_firing_does_not_count(env) -> None:
    triggers, clock, audit = env
    tid = make(triggers, max_runs_per_day=2, rate_limit_per_minute=1)
    first = triggers.admit(tid, 100)
    fired = triggers.get(tid)
    clock.now += timedelta(minutes=1)
    refused = triggers.admit(tid, 100)
    assert (refused.admitted, triggers.get(tid)["paused"]) == (True, True)
    triggers.refund(tid, refused)
    got = triggers.get(tid)
    assert (got["runs_today"], got["fire_count"], got["last_fired_at"]) == (1, 1, fired["last_fired_at"])
    assert (got["paused"], got["paused_reason"], audit) == (False, None, [])
    # Neither the rate limit nor the cap holds the next firing back.
    assert admit(triggers, tid, 100) == (True, "")
    assert triggers.get(tid)["fire_count"] == 2 and first.admitted


def test_cost_cap_and_resume(env) -> None:
    triggers, clock, audit = env
    tid = make(triggers, max_cost_usd_per_day=0.01)
    assert admit(triggers, tid, 100) == (True, "")
    triggers.add_cost(tid, 0.004)
    assert triggers.get(tid)["paused"] is False
    triggers.add_cost(tid, 0.006)
    reason = "max_cost_usd_per_day reached: $0.01 of $0.01 today (resumes at 00:00 UTC)"
    assert triggers.get(tid)["paused_reason"] == reason and triggers.get(tid)["cost_today_usd"] == 0.01
    assert admit(triggers, tid, 100) == (False, reason)
    resumed = triggers.update(tid, {"enabled": True, "max_cost_usd_per_day": 1.0})
    assert resumed["paused"] is False and resumed["max_cost_usd_per_day"] == 1.0
    assert admit(triggers, tid, 100) == (True, "")
    assert triggers.update(tid, {"enabled": False})["enabled"] is False
    assert admit(triggers, tid, 100) == (False, "disabled")
    assert [e[0] for e in audit] == ["trigger.paused"]
    # A cost pause ends with its UTC day too.
    spent = make(triggers, max_cost_usd_per_day=0.01)
    triggers.admit(spent, 100)
    triggers.add_cost(spent, 0.02)
    assert triggers.get(spent)["paused"] is True and triggers.candidates("content_match") == []
    clock.now = datetime(2026, 3, 2, 0, 0, 1)
    assert triggers.get(spent)["paused"] is False
    assert [t.id for t in triggers.candidates("content_match")] == [spent]


def test_candidates_and_delete_for_agent(env) -> None:
    triggers, _, _ = env
    a = make(triggers, "a1")
    paused = make(triggers, "a1", max_runs_per_day=1)
    triggers.admit(paused, 10)
    off = make(triggers, "a2")
    triggers.update(off, {"enabled": False})
    other = triggers.create("a2", "agent_failed", {"agent_failed": "*"}, "p", source="manifest")["id"]
    assert [t.id for t in triggers.candidates("content_match")] == [a]
    assert [t.id for t in triggers.candidates("agent_failed")] == [other]
    assert triggers.delete_for_agent("a2", source="manifest") == 1
    assert [t["id"] for t in triggers.list("a2")] == [off]
    assert triggers.delete_for_agent("a1") == 2 and triggers.list("a1") == []
    assert triggers.delete(off) is True and triggers.delete(off) is False
    assert admit(triggers, off, 1) == (False, "deleted")
