"""Coordination primitives (agentd/store/leases.py, agentd/cluster/coordinator.py, shared approvals,
budget gate) on a real store: two `Cluster`/queue objects with different daemon ids on
one database stand for two daemons (`shared=True`: on SQLite, which a daemon locks for
itself, only a test can do that). Runs on SQLite; the multi-daemon test
(tests/cluster/test_cluster.py) runs the same code on PostgreSQL through real daemons. The lone
daemon's own path (SQLite, run leases in memory) is tested at the end."""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import datetime
from types import SimpleNamespace

import pytest
from pony import orm

from channel_fixtures import wait_for

from agentd.agents.loop import RunCancelled
from agentd.agents.shared_approvals import SharedApprovalQueue
from agentd.store.writer import PonyTx
from agentd.cluster.coordinator import Cluster
from agentd.cluster.config import ClusterSettings, cluster_settings
from agentd.cluster.held_leases import HeldLeases
from agentd.cluster.members import Members
from agentd.errors import AgentdError, ConfigError, Conflict, NotFound, TooManyRequests
from agentd.llm.catalog import Catalog
from agentd.metering import Metering
from agentd.cluster.budget_gate import BudgetGate
from agentd.store import open_store
from agentd.store.leases import Lease, Leases, RunLog, lock_key


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "postgres":
        import pgtest
        from agentd.store.backend import parse_database_url

        if pgtest.pg_bindir() is None and not os.environ.get("AGENTD_TEST_DATABASE_URL"):
            pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
        url = parse_database_url(pgtest.databases().new_url(), "test", allow_password=True)
        s = open_store(tmp_path / "agentd.db", url)
    else:
        s = open_store(tmp_path / "agentd.db")
    yield s
    s.close()


def handle(agent_id: str = "a1", session_id: str = "s1") -> SimpleNamespace:
    return SimpleNamespace(id=agent_id, name="alpha", session_id=session_id, killed=False)


def test_lease_is_exclusive_until_it_expires(store) -> None:
    a, b = Leases(store, "A"), Leases(store, "B")
    lease = a.acquire("run:s1", 0.5)
    assert lease is not None
    assert b.acquire("run:s1", 0.5) is None
    assert b.holder("run:s1") == "A"
    assert a.renew(lease, 0.5) is True
    time.sleep(0.6)
    assert b.holder("run:s1") is None
    taken = b.acquire("run:s1", 5)
    assert taken is not None and b.holder("run:s1") == "B"
    assert a.renew(lease, 5) is False  # A lost it: its token no longer matches
    a.release(lease)  # releasing a lost lease does not free B's
    assert a.holder("run:s1") == "B"
    b.release(taken)
    assert a.holder("run:s1") is None


def test_expired_run_is_reaped_failed_and_live_one_kept(store) -> None:
    runs = RunLog(store)
    with orm.db_session:
        runs.start("r-dead", "a1", "s1", "A", time.time() - 1)
        runs.start("r-live", "a2", "s2", "B", time.time() + 30)
        store.db.execute("UPDATE agent_runs SET reserve_usd = 0.5")
    reaped = runs.reap(30)
    assert reaped == [("r-dead", "a1", "A")]
    assert _run_rows(store) == {
        "r-dead": ("failed", "daemon A stopped renewing the run's lease (it died or lost the database)", 0.0, True),
        "r-live": ("running", None, 0.5, False)}
    assert runs.finish("r-dead", "completed") is False  # the late owner cannot undo the verdict
    assert runs.finish("r-live", "completed", cost_usd=0.5) is True
    assert {r["id"]: r["status"] for r in runs.list()} == {"r-dead": "failed", "r-live": "completed"}


def test_a_renewed_lease_and_record_outlive_their_first_expiry(store) -> None:
    a, b = Leases(store, "A"), Leases(store, "B")
    runs = RunLog(store)
    lease = a.acquire("run:s1", 0.3)
    with orm.db_session:
        runs.start("r1", "a1", "s1", "A", time.time() + 0.3)
    started = time.time()
    assert a.renew(lease, 30) is True
    assert runs.renew("A", ["r1", "r-gone"], time.time() + 30) == {"r-gone"}
    assert runs.renew("B", ["r1"], time.time() + 30) == {"r1"}  # not B's run
    assert runs.renew("A", [], time.time() + 30) == set()
    wait_for(lambda: time.time() > started + 0.4, what="the first expiry")
    assert b.acquire("run:s1", 30) is None and b.holder("run:s1") == "A"
    assert runs.reap(30) == [] and [r["status"] for r in runs.list()] == ["running"]


def test_taking_over_a_dead_daemons_session_fails_only_that_sessions_run(store) -> None:
    a = Cluster(store, ClusterSettings("A", lease_secs=30), "x:1", shared=True)
    b = Cluster(store, ClusterSettings("B", lease_secs=30), "x:2", shared=True)
    with orm.db_session:
        assert a.leases.take("run:s1", -1) is not None  # A died holding the session
        a.runs.start("r1", "a1", "s1", "A", time.time() - 1)
        a.runs.start("r2", "a2", "s2", "A", time.time() - 1)
    b.run(handle("a1", "s1"), threading.Event(), None, lambda: None)
    assert sorted((r["id"] if r["daemon_id"] == "A" else "b", r["status"]) for r in b.runs.list()) == [
        ("b", "completed"), ("r1", "failed"), ("r2", "running")]  # r2 waits for the heartbeat's reaper


def test_run_times_are_shown_as_utc_with_a_z() -> None:
    assert RunLog.view(("r1", "a1", "s1", "A", "completed", 1700000000.5, 1700000061, None, 0.25)) == {
        "id": "r1", "agent_id": "a1", "session_id": "s1", "daemon_id": "A", "status": "completed",
        "started_at": "2023-11-14T22:13:20.500000Z", "ended_at": "2023-11-14T22:14:21Z", "error": None,
        "cost_usd": 0.25}
    assert RunLog.view(("r1", "a1", "s1", "A", "running", 0, None, None, None))["ended_at"] is None


def test_lock_keys_are_signed_64_bit_and_the_same_in_every_daemon() -> None:
    keys = [lock_key(f"name-{i}") for i in range(64)]
    assert all(-2 ** 63 <= k < 2 ** 63 for k in keys) and min(keys) < 0 < max(keys)  # PostgreSQL's bigint
    # Daemons of different releases share one database: the key of a name never changes.
    assert lock_key("agentd:budget") == -5155229106946707214


def test_second_daemon_waits_for_the_session_lease(store) -> None:
    a = Cluster(store, ClusterSettings("A", lease_secs=5), "127.0.0.1:1", shared=True)
    b = Cluster(store, ClusterSettings("B", lease_secs=5), "127.0.0.1:2", shared=True)
    spans: dict[str, tuple[float, float]] = {}
    started, release = threading.Event(), threading.Event()

    def body(name: str):
        def run():
            t0 = time.monotonic()
            started.set()
            release.wait(30)
            spans[name] = (t0, time.monotonic())
            return SimpleNamespace(cost_usd=None)
        return run

    t = threading.Thread(target=lambda: a.run(handle(), threading.Event(), None, body("A")))
    t.start()
    assert started.wait(30)
    assert b.running_elsewhere("s1") == "A"
    with pytest.raises(Conflict, match="busy"):
        b.run(handle(), threading.Event(), 0.1, body("never"))
    threading.Timer(0.5, release.set).start()  # A ends while B waits for the lease
    b.run(handle(), threading.Event(), None, body("B"))
    t.join()
    assert spans["B"][0] >= spans["A"][1]  # B started only after A finished
    assert [r["daemon_id"] for r in a.runs.list()] == ["B", "A"]
    assert {r["status"] for r in a.runs.list()} == {"completed"}
    assert len(a.runs.list()) == 2  # the refused attempt left no run record


def test_a_run_waits_up_to_its_lock_timeout_for_the_session(store) -> None:
    a = Cluster(store, ClusterSettings("A", lease_secs=30), "x:1", shared=True)
    b = Cluster(store, ClusterSettings("B", lease_secs=30), "x:2", shared=True)
    lease = a.leases.acquire("run:s1", 30)
    threading.Timer(0.3, a.leases.release, args=(lease,)).start()
    b.run(handle(), threading.Event(), 30, lambda: None)
    assert [(r["status"], r["daemon_id"]) for r in b.runs.list()] == [("completed", "B")]


def test_cancel_while_waiting_and_failed_body_are_recorded(store) -> None:
    a = Cluster(store, ClusterSettings("A", lease_secs=5), "x:1", shared=True)
    b = Cluster(store, ClusterSettings("B", lease_secs=5), "x:2", shared=True)
    lease = a.leases.acquire("run:s1", 5)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    with pytest.raises(RunCancelled):
        b.run(handle(), cancel, None, lambda: None)
    a.leases.release(lease)

    def boom():
        raise ValueError("tool exploded")

    with pytest.raises(ValueError):
        b.run(handle(), threading.Event(), None, boom)
    (run,) = b.runs.list()
    assert (run["status"], run["error"], run["daemon_id"]) == ("failed", "ValueError: tool exploded", "B")
    assert b.leases.holder("run:s1") is None


def test_tick_marks_a_dead_daemons_run_failed_and_applies_stop_requests(store, caplog) -> None:
    a = Cluster(store, ClusterSettings("A", lease_secs=1), "x:1", shared=True)
    b = Cluster(store, ClusterSettings("B", lease_secs=1), "x:2", shared=True)
    cancel = threading.Event()
    release = threading.Event()
    t = threading.Thread(target=lambda: _swallow(lambda: a.run(handle(), cancel, None, lambda: release.wait(10))))
    t.start()
    deadline = time.monotonic() + 5
    while not a.runs.list() and time.monotonic() < deadline:
        time.sleep(0.02)
    with orm.db_session:  # a record of A's that A no longer runs (it is ending)
        a.runs.start("r-ending", "a1", "s8", "A", time.time() + 30)
    assert b.request_stop("a1") == 2
    with caplog.at_level(logging.INFO, logger="agentd.cluster"):
        a.tick()
    assert cancel.is_set()  # A saw B's stop request
    (run,) = [r for r in a.runs.list() if r["id"] != "r-ending"]
    assert [r.getMessage() for r in caplog.records] == [f"run {run['id']} stopped on request of another daemon"]
    release.set()
    t.join()
    # A "dies" holding a run: nobody renews it, B's heartbeat marks it failed.
    with orm.db_session:
        a.leases.take("run:s9", 1)
        a.runs.start("r9", "a9", "s9", "A", time.time() + 1)
    time.sleep(1.1)
    b.tick()
    failed = {r["id"]: r for r in b.runs.list(status="failed")}
    assert "r9" in failed and failed["r9"]["daemon_id"] == "A"


def _run_rows(s) -> dict[str, tuple]:
    with orm.db_session:
        return {r[0]: tuple(r[1:]) for r in s.db.select(
            "SELECT id, status, error, reserve_usd, ended_at IS NOT NULL FROM agent_runs")}


def test_a_start_fails_what_its_daemon_id_left_running_and_close_hands_everything_back(store, caplog) -> None:
    """A daemon starting again under its id: its previous life's runs are failed and its
    leases dropped at once (nobody waits them out); another daemon's are left alone."""
    runs = RunLog(store)
    with orm.db_session:
        assert Leases(store, "A").take("run:s1", 30) is not None
        assert Leases(store, "B").take("run:s2", 30) is not None
        runs.start("r-old", "a1", "s1", "A", time.time() + 30, reserve_usd=0.5)
        runs.start("r-b", "a2", "s2", "B", time.time() + 30, reserve_usd=0.5)
    Members(store, ClusterSettings("A", advertise_url="http://old:9"), "old:9").beat(started=True)
    a = Cluster(store, ClusterSettings("A", lease_secs=30, advertise_url="http://a:1"), "x:1", shared=True)
    b = Cluster(store, ClusterSettings("B", lease_secs=30), "x:2", shared=True)
    with caplog.at_level(logging.WARNING, logger="agentd.cluster"):
        a.start()
    try:
        assert _run_rows(store) == {"r-old": ("failed", "daemon A restarted while the run was in flight", 0.0, True),
                                    "r-b": ("running", None, 0.5, False)}
        assert [r.getMessage() for r in caplog.records] == ["marked 1 run(s) left running by a previous daemon failed"]
        assert (b.leases.holder("run:s1"), b.leases.holder("run:s2")) == (None, "B")
        # Its row is written anew: where it listens now, not in its previous life.
        assert [(d["id"], d["listen"], d["url"], d["self"]) for d in a.daemons()] == [("A", "x:1", "http://a:1", True)]
        assert a.claim("channel:telegram") is True and a.holds("channel:telegram") is True
        assert b.claim("channel:telegram") is False and b.holder("channel:telegram") == "A"
        assert a.status() == {"daemon_id": "A", "shared_database": True, "lease_secs": 30.0, "runs_here": 0,
                              "leases_held": ["channel:telegram"], "daemons": a.daemons()}
    finally:
        a.close()
    assert not a._thread.is_alive()
    assert b.holder("channel:telegram") is None and b.daemons() == []  # the others take over now
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agentd.cluster"):
        a.start()  # nothing left over: nothing to say
    a.close()
    assert caplog.records == []


def test_a_lone_daemon_start_fails_every_run_left_running_and_drops_every_lease(tmp_path, caplog) -> None:
    s = open_store(tmp_path / "lone.db")
    runs = RunLog(s)
    with orm.db_session:
        assert Leases(s, "old").take("run:s1", 30) is not None
        runs.start("r-other", "a1", "s1", "old", time.time() + 30, reserve_usd=0.5)
        runs.start("r-own", "a2", "s2", "A", time.time() + 30, reserve_usd=0.5)
    a = Cluster(s, ClusterSettings("A", lease_secs=30), "x:1")
    with caplog.at_level(logging.WARNING, logger="agentd.cluster"):
        a.start()
    a.close()
    assert _run_rows(s) == {"r-other": ("failed", "the daemon stopped while the run was in flight", 0.0, True),
                            "r-own": ("failed", "daemon A restarted while the run was in flight", 0.0, True)}
    assert [r.getMessage() for r in caplog.records] == ["marked 2 run(s) left running by a previous daemon failed"]
    assert _lease_rows(s) == 0
    s.close()


def test_the_heartbeat_ticks_until_close_and_outlives_a_failing_tick(store, caplog) -> None:
    a = Cluster(store, ClusterSettings("A", lease_secs=1), "x:1", shared=True)
    ticks: list[float] = []

    def hook() -> None:
        ticks.append(time.monotonic())
        if len(ticks) == 1:
            raise ValueError("hook exploded")

    a.on_tick.append(hook)
    with caplog.at_level(logging.ERROR, logger="agentd.cluster"):
        a.start()
        try:
            wait_for(lambda: len(ticks) >= 2, timeout=20, what="a heartbeat after the failing one")
        finally:
            a.close()
    assert not a._thread.is_alive()
    assert [(r.getMessage(), str(r.exc_info[1])) for r in caplog.records] == [
        ("cluster heartbeat failed", "hook exploded")]
    assert ticks[1] - ticks[0] >= 0.3  # one heartbeat (a third of the lease) apart


def test_a_heartbeat_ends_an_outage_that_only_a_write_can_end(store, monkeypatch) -> None:
    from agentd.cluster import coordinator
    from agentd.store.outage import Outage, StorageFull

    outage = Outage()
    monkeypatch.setattr(coordinator, "OUTAGE", outage)
    outage.noticed(StorageFull("insufficient storage: full"))
    Cluster(store, ClusterSettings("A", lease_secs=30), "x:1", shared=True).tick()  # it wrote its heartbeat
    assert not outage.active


def test_a_run_of_a_conversation_holds_that_conversations_session(store) -> None:
    a = Cluster(store, ClusterSettings("A", lease_secs=30), "x:1", shared=True)
    held: list[str | None] = []
    a.run(handle(), threading.Event(), None, lambda: held.append(a.leases.holder("run:telegram:42")),
          session_id="telegram:42")
    assert held == ["A"] and [r["session_id"] for r in a.runs.list()] == ["telegram:42"]


def test_the_reaper_cancels_a_dead_daemons_approvals_and_audits_its_runs(store, caplog) -> None:
    audited: list[tuple] = []
    b = Cluster(store, ClusterSettings("B", lease_secs=30), "x:2", shared=True,
                audit=lambda *entry: audited.append(entry))
    on_a, on_b = SharedApprovalQueue(store, "A"), SharedApprovalQueue(store, "B")
    waiting_on_a = on_a.request("a9", "alpha", "shell_exec", {})
    waiting_on_b = on_b.request("a1", "alpha", "shell_exec", {})
    with orm.db_session:
        b.runs.start("r9", "a9", "s9", "A", time.time() - 1)  # A stopped renewing it
    with caplog.at_level(logging.WARNING, logger="agentd.cluster"):
        b.tick()
    assert audited == [("agent.run_failed", "a9", {"run_id": "r9", "daemon_id": "A"})]
    assert [r.getMessage() for r in caplog.records] == ["run r9 of agent a9 failed: daemon A stopped renewing its lease"]
    with orm.db_session:
        decisions = dict(store.db.select("SELECT id, decision FROM cluster_approvals"))
    assert decisions == {waiting_on_a.id: "cancelled", waiting_on_b.id: None}
    assert [p["id"] for p in on_b.pending()] == [waiting_on_b.id]
    b.tick()  # nothing more to reap
    assert len(audited) == 1


def test_the_first_heartbeat_prunes_old_runs_silent_daemons_and_decided_approvals(store) -> None:
    now, day = time.time(), 86400
    with orm.db_session:
        for run_id, status, ended in [("r-8d", "completed", now - 8 * day), ("r-6d", "failed", now - 6 * day),
                                      ("r-live", "running", None)]:
            store.db.execute("INSERT INTO agent_runs (id, agent_id, session_id, daemon_id, status, started_at, "
                             "ended_at, lease_expires, reserve_usd) VALUES ($i, 'a1', $i, 'A', $st, $t, $e, $x, 0)",
                             {"i": run_id, "st": status, "t": now - 9 * day, "e": ended, "x": now + 60})
        for daemon, beat in [("gone", now - 2 * day), ("quiet", now - day + 600)]:
            store.db.execute("INSERT INTO cluster_daemons (id, listen, pid, started_at, heartbeat_at, url) "
                             "VALUES ($d, 'x:9', 1, $t, $t, '')", {"d": daemon, "t": beat})
        for approval, decided in [("p-old", now - day - 600), ("p-new", now - day + 600), ("p-open", None)]:
            store.db.execute("INSERT INTO cluster_approvals (id, agent_id, agent_name, tool, input, requested_at, "
                             "daemon_id, decision, decided_at) VALUES ($i, 'a1', 'alpha', 't', '{}', 'x', 'A', $d, $t)",
                             {"i": approval, "d": "approved" if decided else None, "t": decided})
    b = Cluster(store, ClusterSettings("B", lease_secs=30), "x:2", shared=True)

    def left() -> tuple[list, list, list]:
        with orm.db_session:
            return tuple(sorted(store.db.select(f"SELECT id FROM {table}"))
                         for table in ("agent_runs", "cluster_daemons", "cluster_approvals"))

    b.tick()
    assert left() == (["r-6d", "r-live"], ["B", "quiet"], ["p-new", "p-open"])
    with orm.db_session:
        store.db.execute("UPDATE agent_runs SET ended_at = $t WHERE id = 'r-6d'", {"t": now - 8 * day})
    b.tick()  # pruning is hourly: not again at once
    assert left()[0] == ["r-6d", "r-live"]


def test_a_cluster_answers_for_its_leases_members_and_streams(store) -> None:
    leaving = threading.Event()
    a = Cluster(store, ClusterSettings("A", lease_secs=30, advertise_url="http://a:1"), "x:1", shared=True,
                leaving=leaving)
    b = Cluster(store, ClusterSettings("B", lease_secs=30, advertise_url="http://b:2"), "x:2", shared=True)
    a.members.beat(started=True)
    assert (b.member_url("A"), b.member_url("B")) == ("http://a:1", None)
    assert a.peer_secret() == b.peer_secret() and len(a.peer_secret()) == 64
    assert a.claim("channel:slack") is True
    a.release("channel:slack")
    assert (a.holds("channel:slack"), a.holder("channel:slack")) == (False, None)
    assert b.claim("channel:slack") is True and a.holder("channel:slack") == "B"
    inside, done = threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: a.run(handle(), threading.Event(), None,
                                              lambda: (inside.set(), done.wait(10), None)[2]))
    t.start()
    try:
        assert inside.wait(5)
        a.check_stream(handle())  # running here: fine
        with pytest.raises(Conflict) as refused:
            b.check_stream(handle())
        assert refused.value.message == "run is on daemon A; route stream paths by agent id"
        assert b.status()["runs_here"] == 0 and a.status()["runs_here"] == 1
        assert b.request_stop("a1") == 1
    finally:
        done.set()
        t.join(5)
    with orm.db_session:
        b.runs.start("r-b", "a1", "s5", "B", time.time() + 30)
    leaving.set()  # A shuts down: stopping its agents asks nothing of B
    assert a.request_stop("a1") == 0 and b.runs.stop_requests("B") == []
    leaving.clear()
    assert a.request_stop("a1") == 1 and b.runs.stop_requests("B") == ["r-b"]


def test_members_rows_heartbeats_liveness_and_their_shared_key(store, monkeypatch) -> None:
    from agentd.cluster import members as members_module

    a = Members(store, ClusterSettings("A", lease_secs=30, advertise_url="http://a:1"), "127.0.0.1:4200")
    b = Members(store, ClusterSettings("B", lease_secs=30), "127.0.0.1:4201")
    a.beat(started=True)
    b.beat(started=True)
    listed = a.daemons()
    assert [(m["id"], m["listen"], m["url"], m["pid"], m["self"]) for m in listed] == [
        ("A", "127.0.0.1:4200", "http://a:1", os.getpid(), True), ("B", "127.0.0.1:4201", "", os.getpid(), False)]
    assert all(m["started_at"].endswith("Z") and m["heartbeat_at"].endswith("Z") for m in listed)
    assert [m["self"] for m in b.daemons()] == [False, True]
    assert (b.member_url("A"), a.member_url("B"), a.member_url("nobody")) == ("http://a:1", None, None)
    # A heartbeat renews the time only; a start rewrites the whole row.
    moved = Members(store, ClusterSettings("A", lease_secs=30, advertise_url="http://a:2"), "127.0.0.1:4300")
    moved.beat()
    assert (b.member_url("A"), [m["listen"] for m in a.daemons()]) == ("http://a:1", ["127.0.0.1:4200", "127.0.0.1:4201"])
    moved.beat(started=True)  # listed by start time: A started again after B
    assert (b.member_url("A"), [m["listen"] for m in a.daemons()]) == ("http://a:2", ["127.0.0.1:4201", "127.0.0.1:4300"])
    started = next(m["started_at"] for m in b.daemons() if m["id"] == "B")
    # Silent for more than a lease: not live (not listed, no URL); for a day: forgotten.
    clock = [time.time() + 31]
    monkeypatch.setattr(members_module.time, "time", lambda: clock[0])
    b.beat()
    assert ([m["id"] for m in b.daemons()], b.member_url("A")) == (["B"], None)
    assert [(m["started_at"], m["heartbeat_at"] > started) for m in b.daemons()] == [(started, True)]
    clock[0] += members_module.FORGET_SECS - 31 + 1
    b.beat()
    with orm.db_session:
        b.prune()
        assert sorted(r for r in store.db.select("SELECT id FROM cluster_daemons")) == ["B"]
    b.leave()
    with orm.db_session:
        assert store.db.select("SELECT id FROM cluster_daemons") == []
    # One key for the cluster, made once, whoever asks first.
    key = b.peer_secret()
    assert len(key) == 64 and int(key, 16) >= 0 and a.peer_secret() == key == Members(
        store, ClusterSettings("C"), "x:3").peer_secret()


def test_held_leases_are_renewed_lost_to_another_daemon_and_handed_back(store, caplog) -> None:
    a = HeldLeases(Leases(store, "A"), ClusterSettings("A", lease_secs=30))
    b = HeldLeases(Leases(store, "B"), ClusterSettings("B", lease_secs=30))

    def expires(name: str) -> float:
        with orm.db_session:
            return store.db.select("SELECT expires_at FROM cluster_leases WHERE name = $n", {"n": name})[0]

    def run_out(name: str) -> None:
        with orm.db_session:
            store.db.execute("UPDATE cluster_leases SET expires_at = $x WHERE name = $n", {"x": time.time() - 1, "n": name})

    assert a.claim("channel:slack") is True and a.claim("channel:slack") is True  # kept, not taken twice
    assert (b.claim("channel:slack"), b.holds("channel:slack"), b.holder("channel:slack")) == (False, False, "A")
    assert a.claim("channel:irc") is True and a.names() == ["channel:irc", "channel:slack"]
    run_out("channel:slack")
    run_out("channel:irc")
    assert b.claim("channel:slack") is True  # ran out: B takes it over
    with caplog.at_level(logging.WARNING, logger="agentd.cluster"):
        a.renew()
    assert [r.getMessage() for r in caplog.records] == ["lease channel:slack lost"]
    assert a.names() == ["channel:irc"] and not a.holds("channel:slack") and a.holder("channel:slack") == "B"
    assert expires("channel:irc") > time.time() + 25  # pushed out a whole lease again
    a.release("channel:irc")
    a.release("channel:irc")  # held no more: nothing to hand back
    assert a.holder("channel:irc") is None and a.names() == []
    assert a.claim("channel:irc") and a.claim("channel:xmpp")
    a.release_all()
    assert a.names() == [] and [b.holder(n) for n in ("channel:irc", "channel:xmpp", "channel:slack")] == [None, None, "B"]


def test_a_lease_claimed_again_while_the_heartbeat_renews_the_old_one_stays_held(store, caplog) -> None:
    class Reconfigured(Leases):
        """A channel is reconfigured between the heartbeat's copy of the leases and its renewal."""

        def renew(self, lease: Lease, secs: float) -> bool:
            if lease.name == "channel:telegram" and not reclaimed:
                held.release("channel:telegram")
                reclaimed.append(held.claim("channel:telegram"))
            return super().renew(lease, secs)

    reclaimed: list[bool] = []
    held = HeldLeases(Reconfigured(store, "A"), ClusterSettings("A", lease_secs=30))
    assert held.claim("channel:telegram") is True and held.claim("channel:zulip") is True
    # Renewed after telegram's: zulip ran out and another daemon took it meanwhile.
    with orm.db_session:
        store.db.execute("UPDATE cluster_leases SET expires_at = $x WHERE name = 'channel:zulip'",
                         {"x": time.time() - 1})
    assert Leases(store, "B").acquire("channel:zulip", 30) is not None
    with caplog.at_level(logging.WARNING, logger="agentd.cluster"):
        held.renew()
    assert reclaimed == [True] and [r.getMessage() for r in caplog.records] == ["lease channel:zulip lost"]
    assert held.holds("channel:telegram") and held.holder("channel:telegram") == "A"
    assert held.names() == ["channel:telegram"]
    held.release("channel:telegram")  # the new lease is the one handed back: free for the others
    assert held.holder("channel:telegram") is None


def test_held_leases_handed_back_during_an_outage_are_dropped_here(monkeypatch, caplog) -> None:
    """The database cannot take the lease back: it runs out there by itself. Any other
    failure of the release is a bug and raises; on the way out nothing raises."""
    from agentd.store import outage as outage_module
    from agentd.store.outage import DatabaseUnavailable, Outage

    monkeypatch.setattr(outage_module, "OUTAGE", Outage())
    failure: list[Exception] = []

    def release(lease) -> None:
        raise failure[0]

    leases = SimpleNamespace(acquire=lambda name, secs: SimpleNamespace(name=name, token="t"), release=release)
    held = HeldLeases(leases, ClusterSettings("A", lease_secs=30))
    for error in (DatabaseUnavailable("database unavailable: gone"), ValueError("a bug")):
        failure[:] = [error]
        assert held.claim("channel:slack")
        if isinstance(error, ValueError):
            with pytest.raises(ValueError, match="a bug"):
                held.release("channel:slack")
        else:
            held.release("channel:slack")
        assert held.names() == []
    assert held.claim("channel:a") and held.claim("channel:b")
    with caplog.at_level(logging.DEBUG, logger="agentd.cluster"):
        held.release_all()
    assert held.names() == [] and [r.getMessage() for r in caplog.records if r.name == "agentd.cluster"] == [
        "lease channel:a not released", "lease channel:b not released"]


def _swallow(fn):
    try:
        fn()
    except BaseException:  # noqa: BLE001
        pass


def test_a_run_names_its_record_in_the_log_context_and_keeps_500_characters_of_its_error(store) -> None:
    from agentd import logs

    a = Cluster(store, ClusterSettings("A", lease_secs=30), "x:1", shared=True)
    seen: list[str | None] = []
    a.run(handle(), threading.Event(), None, lambda: seen.append(logs.current().run_id))
    (run,) = a.runs.list()
    assert seen == [run["id"]] and logs.current().run_id is None

    def long_failure():
        raise ValueError("x" * 600)

    with pytest.raises(ValueError):
        a.run(handle("a1", "s2"), threading.Event(), None, long_failure)
    assert {r["session_id"]: r["error"] for r in a.runs.list()}["s2"] == "ValueError: " + "x" * 488


def test_a_run_that_cannot_start_says_why_and_leaves_no_record(store) -> None:
    a = Cluster(store, ClusterSettings("A", lease_secs=30), "x:1", shared=True)
    b = Cluster(store, ClusterSettings("B", lease_secs=30), "x:2", shared=True)
    ran: list[str] = []
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(RunCancelled, match="^run cancelled before it started$"):
        a.run(handle(), cancelled, None, lambda: ran.append("cancelled"))
    killed = handle()
    killed.killed = True
    with pytest.raises(RunCancelled, match="^run cancelled before it started$"):
        a.run(killed, threading.Event(), None, lambda: ran.append("killed"))
    lease = b.leases.acquire("run:s1", 30)
    a.close()  # the daemon stops: a run waiting for a session held elsewhere gives up
    with pytest.raises(AgentdError) as stopping:
        a.run(handle(), threading.Event(), None, lambda: ran.append("stopping"))
    assert (stopping.value.status, stopping.value.message) == (503, "the daemon is shutting down")
    b.leases.release(lease)
    assert ran == [] and a.runs.list() == [] and a.leases.holder("run:s1") is None


def test_the_heartbeat_stops_a_run_that_lost_its_lease_or_its_record(store, caplog) -> None:
    a = Cluster(store, ClusterSettings("A", lease_secs=30), "x:1", shared=True)
    bodies = {name: _HeldRun(store, None) for name in ("s1", "s2")}
    cancels = {name: threading.Event() for name in bodies}
    threads = [threading.Thread(target=_swallow, args=(lambda n=n: a.run(handle("a1", n), cancels[n], None,
                                                                           bodies[n]),))
               for n in bodies]
    for t in threads:
        t.start()
    assert all(b.inside.wait(5) for b in bodies.values())
    ids = {r["session_id"]: r["id"] for r in a.runs.list()}
    with orm.db_session:
        # Another daemon took s1's lease; s2's record was failed by another daemon's reaper.
        store.db.execute("UPDATE cluster_leases SET owner = 'B', token = 'theirs' WHERE name = 'run:s1'")
        store.db.execute("UPDATE agent_runs SET status = 'failed' WHERE session_id = 's2'")
    with caplog.at_level(logging.WARNING, logger="agentd.cluster"):
        a.tick()
    assert cancels["s1"].is_set() and cancels["s2"].is_set()
    assert [r.getMessage() for r in caplog.records] == [
        f"run {ids['s1']} lost its lease (this daemon was too slow); stopping it"]
    for b in bodies.values():
        b.release.set()
    for t in threads:
        t.join(5)


def test_a_run_that_ends_while_the_heartbeat_renews_its_lease_is_not_said_to_have_lost_it(store, caplog) -> None:
    a = Cluster(store, ClusterSettings("A", lease_secs=30), "x:1", shared=True)
    body, cancel = _HeldRun(store, None), threading.Event()
    thread = threading.Thread(target=a.run, args=(handle("a1", "s1"), cancel, None, body))
    thread.start()
    assert body.inside.wait(5)

    class EndingFirst(Leases):
        """The run ends between the heartbeat's copy of the runs and its renewal of their leases."""

        def renew(self, lease: Lease, secs: float) -> bool:
            body.release.set()
            thread.join(5)
            return super().renew(lease, secs)

    a.run_leases.leases = EndingFirst(store, "A")
    with caplog.at_level(logging.WARNING, logger="agentd.cluster"):
        a.tick()
    assert caplog.records == [] and not cancel.is_set()
    assert [r["status"] for r in a.runs.list()] == ["completed"]


def test_approval_decided_by_another_daemon(store) -> None:
    a, b = SharedApprovalQueue(store, "A"), SharedApprovalQueue(store, "B")
    approval = a.request("a1", "alpha", "file_write", {"path": "x"})
    assert [p["id"] for p in b.pending()] == [approval.id]
    assert b.pending()[0]["input"] == {"path": "x"}
    threading.Timer(0.3, lambda: b.approve(approval.id)).start()
    t0 = time.monotonic()
    assert a.wait(approval, 10) == "approved"
    assert time.monotonic() - t0 < 5
    with pytest.raises(NotFound):
        b.approve(approval.id)  # consumed by the run
    second = a.request("a1", "alpha", "shell_exec", {})
    assert b.reject(second.id).decision == "rejected"
    with pytest.raises(Conflict, match="already rejected"):
        a.approve(second.id)
    assert a.wait(second, 5) == "rejected"
    third = a.request("a1", "alpha", "shell_exec", {})
    assert a.wait(third, 0.3) == "timeout"
    assert b.pending() == []


def test_budget_gate_admits_parallel_runs_as_if_sequential(store) -> None:
    metering = Metering(store, Catalog.load())
    gate = BudgetGate(metering)
    a = Cluster(store, ClusterSettings("A", lease_secs=30), "x:1", shared=True, budget=gate)
    b = Cluster(store, ClusterSettings("B", lease_secs=30), "x:2", shared=True, budget=gate)
    # No limit: nothing reserved, nothing refused.
    a.run(handle("a1", "s1"), threading.Event(), None, lambda: SimpleNamespace(cost_usd=0.004))
    metering.set_limit(0.01)
    with orm.db_session:
        metering.store.db.execute(
            "INSERT INTO usage (agent_id, agent_name, provider, model, input_tokens, output_tokens, cost_usd, "
            "priced, at) VALUES ('a1', 'alpha', 'p', 'm', 1, 1, 0.004, $t, $now)",
            {"t": True, "now": datetime.utcnow()})
    gate_open, hold = threading.Event(), threading.Event()
    results: list[str] = []

    def slow():
        gate_open.set()
        hold.wait(10)
        return SimpleNamespace(cost_usd=0.004)

    t = threading.Thread(target=lambda: results.append(
        str(a.run(handle("a1", "s1"), threading.Event(), None, slow).cost_usd)))
    t.start()
    gate_open.wait(5)
    # spent 0.004 + reserved 0.004 (the run in flight) = 0.008 < 0.01: one more may start
    second = threading.Event()
    t2 = threading.Thread(target=lambda: (b.run(handle("a2", "s2"), threading.Event(), None,
                                                lambda: (second.set(), hold.wait(10),
                                                         SimpleNamespace(cost_usd=0.004))[2]),
                                          results.append("second")))
    t2.start()
    second.wait(5)
    # 0.004 + 0.008 reserved >= 0.01: a third run on either daemon is refused
    with pytest.raises(TooManyRequests, match=r"monthly budget reached: \$0.0040 \(\+ \$0.0080 reserved"):
        b.run(handle("a3", "s3"), threading.Event(), None, lambda: None)
    hold.set()
    t.join()
    t2.join()
    assert sorted(results) == ["0.004", "second"]
    assert b.runs.list(agent_id="a3") == []


def test_cluster_settings() -> None:
    s = cluster_settings({"cluster": {"daemon_id": "d1", "lease_secs": 4}}, "127.0.0.1:4200")
    assert (s.daemon_id, s.lease_secs, round(s.heartbeat_secs, 3)) == ("d1", 4.0, 1.333)
    assert cluster_settings({}, "127.0.0.1:4321").daemon_id.endswith(":4321")
    with pytest.raises(ConfigError, match="cluster.lease_secs"):
        cluster_settings({"cluster": {"lease_secs": 0}}, "x:1")
    with pytest.raises(ConfigError, match="cluster.daemon_id"):
        cluster_settings({"cluster": {"daemon_id": 5}}, "x:1")


@pytest.mark.parametrize("table, error", [
    ([], "config key cluster: must be a table"),
    ({"daemon_id": "x" * 101}, "config key cluster.daemon_id: must be a string of at most 100 characters"),
    ({"lease_secs": 0.99}, "config key cluster.lease_secs: must be a number between 1 and 3600"),
    ({"lease_secs": 3600.5}, "config key cluster.lease_secs: must be a number between 1 and 3600"),
    ({"lease_secs": True}, "config key cluster.lease_secs: must be a number between 1 and 3600"),
    ({"lease_secs": "10"}, "config key cluster.lease_secs: must be a number between 1 and 3600"),
])
def test_cluster_settings_refusals_word_for_word(table, error) -> None:
    with pytest.raises(ConfigError) as err:
        cluster_settings({"cluster": table}, "x:1")
    assert err.value.message == error


def test_cluster_settings_limits_and_defaults() -> None:
    """100 characters and leases of exactly 1 and 3600 s are accepted; the default id is the
    host and the listen port (an IPv6 listen address keeps only its port); the lease is 10 s."""
    import socket

    assert cluster_settings({"cluster": {"daemon_id": "x" * 100, "lease_secs": 1}}, "x:1").lease_secs == 1.0
    assert cluster_settings({"cluster": {"lease_secs": 3600}}, "x:1").lease_secs == 3600.0
    s = cluster_settings({"cluster": {}}, "[::1]:4200")
    assert (s.daemon_id, s.lease_secs) == (f"{socket.gethostname()}:4200", 10.0)
    assert cluster_settings(None, "h:7").daemon_id == f"{socket.gethostname()}:7"


def test_reaper_fails_workflow_runs_of_a_dead_daemon_only(store, caplog) -> None:
    from agentd.workflows.definition import WorkflowDef
    from agentd.workflows.store import WorkflowStore

    wf = WorkflowStore(store)
    workflow = wf.get(wf.create(WorkflowDef("w", "", [{"name": "s"}])))
    audited: list[tuple] = []
    a = Cluster(store, ClusterSettings("A", lease_secs=1), "x:1", shared=True)
    b = Cluster(store, ClusterSettings("B", lease_secs=1), "x:2", shared=True,
                audit=lambda *entry: audited.append(entry))
    a.members.beat(started=True)
    b.members.beat(started=True)
    on_a, on_b = wf.create_run(workflow, "a", "A"), wf.create_run(workflow, "b", "B")
    wf.start_run(on_a)
    wf.start_run(on_b)
    pending_a = wf.create_run(workflow, "pa", "A")          # created, not started yet
    gone = wf.create_run(workflow, "g", "C")                # a daemon without any heartbeat row
    unowned = wf.create_run(workflow, "u")                  # recorded before runs had owners
    done_a = wf.create_run(workflow, "d", "A")
    assert wf.finish_run(done_a, "completed", "ok", None, [], 1) is True

    def status(run_id: str) -> tuple:
        run = wf.run(run_id)
        return run["state"]["status"], run["error"], run["daemon_id"]

    with caplog.at_level(logging.WARNING, logger="agentd.cluster"):
        b.tick()  # A is alive: only C's run goes
    assert [r.getMessage() for r in caplog.records] == [
        f"workflow run {gone} failed: daemon C stopped while it was in progress"]
    c_error = "daemon C stopped while the run was in progress (its lease expired; marked failed by daemon B)"
    assert status(gone) == ("failed", c_error, "C")
    assert [status(r)[0] for r in (on_a, on_b, pending_a, unowned, done_a)] == \
        ["running", "running", "pending", "pending", "completed"]
    assert audited == [("workflow.run_failed", gone, {"daemon_id": "C", "error": c_error})]
    assert wf.run(gone)["completed_at"] and wf.run(gone)["started_at"] and wf.run(gone)["output"] == ""

    time.sleep(1.1)  # A's lease runs out: it sent no heartbeat for lease_secs
    b.tick()
    a_error = "daemon A stopped while the run was in progress (its lease expired; marked failed by daemon B)"
    assert status(on_a) == ("failed", a_error, "A") and status(pending_a) == ("failed", a_error, "A")
    assert [status(r)[0] for r in (on_b, unowned, done_a)] == ["running", "pending", "completed"]
    assert sorted(e[1] for e in audited[1:]) == sorted([on_a, pending_a])
    # A's late writes (it was alive after all) do not overwrite the reaper's verdict.
    assert wf.save_progress(on_a, [{"step_name": "s"}], 1) is False
    assert wf.finish_run(on_a, "completed", "late", None, [], 1) is False
    assert status(on_a) == ("failed", a_error, "A") and wf.run(on_a)["step_results"] == []
    assert wf.save_progress(on_b, [{"step_name": "s"}], 1) is True
    # A start of B fails B's own runs and the ownerless ones, never another daemon's.
    live_c = wf.create_run(workflow, "c2", "C")
    assert wf.fail_interrupted("restarted", ("B",)) == 2
    assert status(on_b) == ("failed", "restarted", "B") and status(unowned) == ("failed", "restarted", None)
    assert status(live_c)[0] == "pending"
    # A lone daemon (owners None) fails every active run.
    assert wf.fail_interrupted("alone") == 1 and status(live_c) == ("failed", "alone", "C")


def test_a_reaped_workflow_run_ends_at_the_time_it_was_reaped_whatever_the_machines_zone(store, monkeypatch) -> None:
    from agentd.workflows.definition import WorkflowDef
    from agentd.workflows.store import WorkflowStore

    wf = WorkflowStore(store)
    gone = wf.create_run(wf.get(wf.create(WorkflowDef("w", "", [{"name": "s"}]))), "g", "C")
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert [r[0] for r in RunLog(store).reap_workflow_runs("B", 30)] == [gone]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    ended = datetime.fromisoformat(wf.run(gone)["completed_at"].replace("Z", "+00:00"))
    assert abs(ended.timestamp() - time.time()) < 60


def test_what_ran_out_during_a_database_outage_is_kept_for_a_lease_after_it(store, monkeypatch) -> None:
    """B was cut off by the outage like A: its run lease, session lease and heartbeat that
    expired meanwhile are neither reaped nor taken over until B has had one lease after the
    database's return to renew them; what expired before the outage began goes at once."""
    from agentd.store import leases as leases_module
    from agentd.store.outage import DatabaseUnavailable, Outage
    from agentd.workflows.definition import WorkflowDef
    from agentd.workflows.store import WorkflowStore

    outage = Outage()
    monkeypatch.setattr(leases_module, "OUTAGE", outage)
    wf = WorkflowStore(store)
    a = Cluster(store, ClusterSettings("A", lease_secs=1), "x:1", shared=True)
    b = Cluster(store, ClusterSettings("B", lease_secs=1), "x:2", shared=True)
    b.members.beat(started=True)
    on_b = wf.create_run(wf.get(wf.create(WorkflowDef("w", "", [{"name": "s"}]))), "b", "B")
    with orm.db_session:
        assert b.leases.take("run:s0", -5) is not None  # expired before the outage: B is gone
        b.runs.start("r-old", "a0", "s0", "B", time.time() - 5)
        assert b.leases.take("run:s1", 1) is not None
        b.runs.start("r-cut", "a1", "s1", "B", time.time() + 1)
    outage.noticed(DatabaseUnavailable("gone"))
    time.sleep(1.2)  # every lease of B runs out while nobody reaches the database
    outage.cleared(wrote=True)

    a.tick()
    status = lambda: {r["id"]: r["status"] for r in a.runs.list()}  # noqa: E731
    assert status() == {"r-old": "failed", "r-cut": "running"}
    assert a.leases.acquire("run:s1", 1) is None and a.leases.acquire("run:s0", 1) is not None
    assert wf.run(on_b)["state"]["status"] == "pending"

    time.sleep(1.05)  # B had a whole lease since the return and renewed nothing: it is gone
    a.tick()
    assert status() == {"r-old": "failed", "r-cut": "failed"}
    assert a.leases.acquire("run:s1", 1) is not None
    assert wf.run(on_b)["state"]["status"] == "failed"


# -- a lone daemon (SQLite): run leases in memory, the record closed with the session -------------

def _lone(tmp_path) -> tuple[Cluster, object]:
    s = open_store(tmp_path / "lone.db")
    return Cluster(s, ClusterSettings("A", lease_secs=5), "x:1"), s


def _lone_with_budget(tmp_path) -> tuple[Cluster, object, Metering]:
    """A lone daemon's cluster whose runs pass the budget gate of its own metering."""
    s = open_store(tmp_path / "lone.db")
    metering = Metering(s, Catalog.load())
    return Cluster(s, ClusterSettings("A", lease_secs=5), "x:1", budget=BudgetGate(metering)), s, metering


def _lease_rows(s) -> int:
    with orm.db_session:
        return s.db.select("SELECT COUNT(*) FROM cluster_leases")[0]


def test_lone_daemon_serialises_a_session_in_memory_and_writes_no_lease_rows(tmp_path) -> None:
    a, s = _lone(tmp_path)
    assert a.shared is False
    inside = threading.Event()
    release = threading.Event()
    rows_during: list[int] = []

    def first():
        inside.set()
        rows_during.append(_lease_rows(s))
        release.wait(10)
        return SimpleNamespace(cost_usd=0.5)

    cancel = threading.Event()
    t = threading.Thread(target=lambda: a.run(handle(), cancel, None, first))
    t.start()
    assert inside.wait(5)
    with pytest.raises(Conflict, match="agent alpha is busy with another run"):
        a.run(handle(), threading.Event(), 0.2, lambda: None)
    # Another session of the same agent is not held up.
    a.run(handle("a1", "s2"), threading.Event(), None, lambda: SimpleNamespace(cost_usd=None))
    a.tick()  # the heartbeat must not take the missing lease row for a lost lease
    assert not cancel.is_set(), "BUG: the heartbeat stopped a lone daemon's run (no lease row to renew)"
    release.set()
    t.join(5)
    assert rows_during == [0] and _lease_rows(s) == 0, "BUG: a lone daemon wrote run lease rows"
    a.run(handle(), threading.Event(), 0.2, lambda: None)  # the session is free again
    runs = a.runs.list()
    assert sorted((r["session_id"], r["status"]) for r in runs) == [
        ("s1", "completed"), ("s1", "completed"), ("s2", "completed")]
    assert [r["cost_usd"] for r in runs if r["cost_usd"] is not None] == [0.5]
    s.close()


def test_completes_closes_the_record_inside_the_callers_transaction(tmp_path) -> None:
    a, s = _lone(tmp_path)
    seen: list[str] = []

    def body(complete):
        with orm.db_session:
            complete(PonyTx(s.db), 0.25)
            # Still inside the transaction: this connection already sees the record closed.
            seen.append(s.db.select("SELECT status FROM agent_runs")[0])
        return SimpleNamespace(cost_usd=0.25)

    a.run(handle(), threading.Event(), None, body, completes=True)
    assert seen == ["completed"]
    assert [(r["status"], r["cost_usd"]) for r in a.runs.list()] == [("completed", 0.25)]

    def completes_then_fails(complete):
        with orm.db_session:
            complete(PonyTx(s.db), None)
        raise ValueError("after the save")

    with pytest.raises(ValueError):
        a.run(handle("a1", "s2"), threading.Event(), None, completes_then_fails, completes=True)
    # The session was saved with the record: it stays completed.
    assert {r["session_id"]: r["status"] for r in a.runs.list()}["s2"] == "completed"

    def rolled_back(complete):
        with orm.db_session:
            complete(PonyTx(s.db), 1.0)
            raise RuntimeError("the save failed")

    with pytest.raises(RuntimeError):
        a.run(handle("a1", "s3"), threading.Event(), None, rolled_back, completes=True)
    s3 = [r for r in a.runs.list() if r["session_id"] == "s3"]
    assert [(r["status"], r["error"], r["cost_usd"]) for r in s3] == [
        ("failed", "RuntimeError: the save failed", None)], \
        "BUG: a close rolled back with its transaction was taken for done (the run stays 'running')"
    s.close()


def _records(s) -> list[tuple]:
    with orm.db_session:
        return [tuple(r) for r in s.db.select(
            "SELECT session_id, status, error, cost_usd, reserve_usd, daemon_id FROM agent_runs ORDER BY started_at")]


class _HeldRun:
    """A run body that records the agent_runs rows it sees, then waits for `release`."""

    def __init__(self, s, cost: float) -> None:
        self.s, self.cost = s, cost
        self.inside, self.release = threading.Event(), threading.Event()
        self.during: list[list] = []

    def __call__(self) -> SimpleNamespace:
        self.during.append(_records(self.s))
        self.inside.set()
        self.release.wait(10)
        return SimpleNamespace(cost_usd=self.cost)


def test_a_lone_run_without_a_budget_is_recorded_once_when_it_ends_and_listed_meanwhile(tmp_path) -> None:
    a, s = _lone(tmp_path)
    held = _HeldRun(s, 0.5)
    inside, release, during = held.inside, held.release, held.during
    a.run(handle("a0", "s0"), threading.Event(), None, lambda: SimpleNamespace(cost_usd=None))  # an older record
    cancel = threading.Event()
    before = time.time()
    t = threading.Thread(target=lambda: a.run(handle(), cancel, None, held))
    t.start()
    assert inside.wait(5)
    assert during == [[("s0", "completed", None, None, 0.0, "A")]], "BUG: the run wrote its record at the start"
    listed = a.list_runs()
    assert [(r["session_id"], r["status"], r["agent_id"], r["daemon_id"], r["error"], r["cost_usd"])
            for r in listed] == [("s1", "running", "a1", "A", None, None), ("s0", "completed", "a0", "A", None, None)]
    assert listed[0]["ended_at"] is None and listed[1]["ended_at"] is not None
    running = listed[0]
    assert running["id"] in a.run_leases.local and running["started_at"].endswith("Z")
    assert [r["session_id"] for r in a.list_runs(status="running")] == ["s1"]
    assert [r["session_id"] for r in a.list_runs(status="completed")] == ["s0"]
    assert [r["session_id"] for r in a.list_runs(agent_id="a1")] == ["s1"]
    assert [r["session_id"] for r in a.list_runs(agent_id="a0")] == ["s0"]
    assert [r["session_id"] for r in a.list_runs(limit=1)] == ["s1"]
    a.tick()  # the heartbeat has no record to renew and must not take that for a lost run
    assert not cancel.is_set(), "BUG: the heartbeat stopped a run whose record is not written yet"
    release.set()
    t.join(5)
    assert _records(s)[1] == ("s1", "completed", None, 0.5, 0.0, "A")
    after = a.list_runs()
    assert [(r["session_id"], r["status"]) for r in after] == [("s1", "completed"), ("s0", "completed")]
    assert after[0]["id"] == running["id"] and after[0]["started_at"] == running["started_at"]
    with orm.db_session:
        started, ended = s.db.select("SELECT started_at, ended_at FROM agent_runs WHERE session_id = 's1'")[0]
    assert before <= started <= ended <= time.time()
    assert a.run_leases.local == {}
    assert a.runs.record("other-run", "a1", "s7", "A", started, "failed", "boom") is True
    # A second close of a record written already (the body failed after its save committed) keeps it.
    assert a.runs.record(running["id"], "a1", "s1", "A", started, "failed", "late") is False
    assert _records(s)[1] == ("s1", "completed", None, 0.5, 0.0, "A")
    s.close()


def test_a_lone_run_under_a_budget_limit_is_recorded_with_its_reservation_at_the_start(tmp_path) -> None:
    a, s, metering = _lone_with_budget(tmp_path)
    metering.set_limit(5.0)
    held = _HeldRun(s, 0.25)
    inside, release, during = held.inside, held.release, held.during
    t = threading.Thread(target=lambda: a.run(handle(), threading.Event(), None, held))
    t.start()
    assert inside.wait(5)
    assert during == [[("s1", "running", None, None, 0.0, "A")]]
    assert [r["status"] for r in a.list_runs()] == ["running"], "BUG: a run listed twice (record and memory)"
    release.set()
    t.join(5)
    assert _records(s) == [("s1", "completed", None, 0.25, 0.0, "A")]
    a.run(handle(), threading.Event(), 0.2, lambda: SimpleNamespace(cost_usd=None))  # the session is free again
    metering.set_limit(0)
    a.run(handle("a1", "s2"), threading.Event(), None, lambda: SimpleNamespace(cost_usd=None))
    assert [r[:2] for r in _records(s)] == [("s1", "completed"), ("s1", "completed"), ("s2", "completed")]
    s.close()


def test_a_shared_database_lists_only_records(store) -> None:
    a = Cluster(store, ClusterSettings("A", lease_secs=30), "x:1", shared=True)
    inside, release = threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: a.run(handle(), threading.Event(), None,
                                              lambda: (inside.set(), release.wait(10), None)[2]))
    t.start()
    assert inside.wait(5)
    assert [(r["status"], r["session_id"]) for r in a.runs.list()] == [("running", "s1")]
    assert [(r["status"], r["session_id"]) for r in a.list_runs()] == [("running", "s1")]
    assert _records(store) == [("s1", "running", None, None, 0.0, "A")]  # no budget: nothing reserved
    b = Cluster(store, ClusterSettings("B", lease_secs=30), "x:2", shared=True)
    assert a.running_elsewhere("s1") is None and b.running_elsewhere("s1") == "A"
    assert b.running_elsewhere("s2") is None
    release.set()
    t.join(5)


def test_the_budget_limit_decides_where_a_lone_runs_record_starts(tmp_path) -> None:
    """Exactly 0 is no limit (the record waits for the end); any limit above it, even under
    a dollar, opens the record at the start."""
    a, s, metering = _lone_with_budget(tmp_path)
    assert a.running_elsewhere("s1") is None  # a lone daemon: nobody else runs anything
    for limit, seen in [(0.0, []), (0.5, [("s1", "running", None, None, 0.0, "A")])]:
        metering.set_limit(limit)
        with orm.db_session:
            s.db.execute("DELETE FROM agent_runs")
        held = _HeldRun(s, None)
        t = threading.Thread(target=lambda: a.run(handle(), threading.Event(), None, held))
        t.start()
        assert held.inside.wait(5)
        held.release.set()
        t.join(5)
        assert held.during == [seen], limit
    s.close()


def test_a_lone_run_refused_at_the_start_frees_its_session(tmp_path) -> None:
    a, s, metering = _lone_with_budget(tmp_path)
    metering.set_limit(0.01)
    with orm.db_session:
        s.db.execute("INSERT INTO usage (agent_id, agent_name, provider, model, input_tokens, output_tokens, "
                     "cost_usd, priced, at) VALUES ('a1', 'alpha', 'p', 'm', 1, 1, 0.02, $t, $now)",
                     {"t": True, "now": datetime.utcnow()})
    with pytest.raises(TooManyRequests):
        a.run(handle(), threading.Event(), 0.2, lambda: None)
    metering.set_limit(0)
    a.run(handle(), threading.Event(), 0.2, lambda: SimpleNamespace(cost_usd=None))  # not "busy"
    assert [r["status"] for r in a.list_runs()] == ["completed"]
    s.close()


def test_list_runs_merges_by_start_and_honours_every_filter(tmp_path) -> None:
    a, s = _lone(tmp_path)
    for i in range(4):
        a.run(handle(f"a{i % 2}", f"s{i}"), threading.Event(), None, lambda: SimpleNamespace(cost_usd=None))
        time.sleep(0.002)  # distinct start times
    held = _HeldRun(s, None)
    t = threading.Thread(target=lambda: a.run(handle("a1", "s9"), threading.Event(), None, held))
    t.start()
    assert held.inside.wait(5)
    try:
        assert [r["session_id"] for r in a.list_runs()] == ["s9", "s3", "s2", "s1", "s0"]
        assert [r["session_id"] for r in a.list_runs(status="")] == ["s9", "s3", "s2", "s1", "s0"]
        assert [r["session_id"] for r in a.list_runs(agent_id="a1")] == ["s9", "s3", "s1"]
        assert [r["session_id"] for r in a.list_runs(status="completed", limit=2)] == ["s3", "s2"]
        assert [r["session_id"] for r in a.list_runs(limit=3)] == ["s9", "s3", "s2"]
        assert [r["session_id"] for r in a.list_runs(agent_id="a1", status="completed")] == ["s3", "s1"]
        assert [r["session_id"] for r in a.runs.list(agent_id="a1", status="running")] == []
        assert [r["session_id"] for r in a.runs.list(status="completed", limit=1)] == ["s3"]
    finally:
        held.release.set()
        t.join(5)
    for i in range(10, 106):
        a.run(handle("a2", f"s{i}"), threading.Event(), None, lambda: SimpleNamespace(cost_usd=None))
    assert len(a.list_runs()) == 100 and len(a.list_runs(limit=101)) == 101
    s.close()


def test_record_finish_and_release_write_in_the_transaction_they_are_given(store) -> None:
    """With `tx`, a run record's close and a lease's release are statements of the caller's
    write (the session's, on the store's writer); nothing goes through a session of its own."""
    class Tx:
        def __init__(self) -> None:
            self.statements: list[tuple[str, dict]] = []

        def execute(self, sql: str, params: dict) -> int:
            self.statements.append((sql.split()[0], params))
            return 1

    tx = Tx()
    runs, leases = RunLog(store), Leases(store, "A")
    lease = leases.acquire("run:s9", 30)
    assert runs.record("r9", "a1", "s9", "A", time.time(), "completed", tx=tx) is True
    assert runs.finish("r8", "failed", "boom", 0.25, tx=tx) is True
    leases.release(lease, tx=tx)
    assert [(verb, params.get("i", params.get("n"))) for verb, params in tx.statements] == [
        ("INSERT", "r9"), ("UPDATE", "r8"), ("DELETE", "run:s9")]
    assert runs.list() == [] and leases.holder("run:s9") == "A", "BUG: written outside the given transaction"
    leases.release(lease)
    assert leases.holder("run:s9") is None


def _closes_then_fails(s):
    """A run body whose session write closes the run's record, then fails (and rolls back)."""
    def body(complete):
        def write(tx):
            complete(tx, 1.0)
            raise RuntimeError("the save failed")
        s.write(write)
    return body


def test_complete_closes_the_record_in_the_store_writers_transaction(tmp_path) -> None:
    """The daemon's path: the session write runs on the store's writer (no Pony session open)
    and `complete(tx, cost)` closes the run record in that same transaction."""
    a, s = _lone(tmp_path)
    put = "INSERT INTO settings (key, value) VALUES ($k, $v)"

    listed: list[list] = []

    def body(complete):
        s.write(lambda tx: (tx.execute(put, {"k": "session", "v": '"saved"'}), complete(tx, 0.25)))
        listed.append([r["status"] for r in a.list_runs()])  # closed: listed once, from its record
        return SimpleNamespace(cost_usd=0.25)

    a.run(handle(), threading.Event(), None, body, completes=True)
    assert [(r["status"], r["cost_usd"]) for r in a.runs.list()] == [("completed", 0.25)]
    assert listed == [["completed"]]

    with pytest.raises(RuntimeError):
        a.run(handle("a1", "s2"), threading.Event(), None, _closes_then_fails(s), completes=True)
    assert [(r["status"], r["error"]) for r in a.runs.list() if r["session_id"] == "s2"] == [
        ("failed", "RuntimeError: the save failed")], "BUG: the close survived its rolled-back transaction"
    s.close()


def test_a_run_records_how_it_ended(store, monkeypatch) -> None:
    from agentd.store import outage as outage_module
    from agentd.store.outage import Outage

    monkeypatch.setattr(outage_module, "OUTAGE", Outage())  # the body's outage is the test's own
    a = Cluster(store, ClusterSettings("A", lease_secs=30), "x:1", shared=True)
    endings = {"s1": RunCancelled("stopped by the user"), "s2": Conflict("agent alpha is busy with another run"),
               "s3": OSError(28, "No space left on device")}
    for session, exc in endings.items():
        def body(exc=exc):
            raise exc
        with pytest.raises(type(exc)):
            a.run(handle("a1", session), threading.Event(), None, body)
    assert sorted((r["session_id"], r["status"], r["error"]) for r in a.runs.list()) == [
        ("s1", "cancelled", "stopped by the user"),
        ("s2", "failed", "agent alpha is busy with another run"),
        ("s3", "failed", "insufficient storage: the disk holding the daemon's home is full; free some space and retry")]


def test_a_shared_runs_close_rolls_back_with_the_sessions_write(store) -> None:
    a = Cluster(store, ClusterSettings("A", lease_secs=30), "x:1", shared=True)
    with pytest.raises(RuntimeError):
        a.run(handle(), threading.Event(), None, _closes_then_fails(store), completes=True)
    assert [(r["status"], r["error"], r["cost_usd"]) for r in a.runs.list()] == [
        ("failed", "RuntimeError: the save failed", None)]
    assert a.leases.holder("run:s1") is None


def test_a_run_reserves_the_most_its_own_agent_cost_this_month(tmp_path) -> None:
    a, s, metering = _lone_with_budget(tmp_path)
    metering.set_limit(5.0)
    a.run(handle("a1", "s1"), threading.Event(), None, lambda: SimpleNamespace(cost_usd=0.25))
    a.run(handle("a2", "s2"), threading.Event(), None, lambda: SimpleNamespace(cost_usd=0.75))
    held = _HeldRun(s, None)
    t = threading.Thread(target=lambda: a.run(handle("a1", "s1"), threading.Event(), None, held))
    t.start()
    assert held.inside.wait(5)
    held.release.set()
    t.join(5)
    assert held.during[0][-1] == ("s1", "running", None, None, 0.25, "A")
    s.close()


def test_a_setting_written_here_is_never_undone_by_the_follower(store) -> None:
    """The follower re-reads shared settings all the time; a read that raced a local write
    must not put the old value back, even for a moment (a URL saved and tested at once)."""
    from agentd.cluster.settings_follow import SettingsFollower
    from agentd.llm.custom_models import CustomModels
    from agentd.providers import ProviderKeys

    catalog = Catalog.load()
    config = SimpleNamespace(provider_urls={})
    providers = ProviderKeys(config, catalog, SimpleNamespace(store=store, url_overrides={}))
    custom = CustomModels(store, catalog)
    metering = Metering(store, catalog)
    follower = SettingsFollower(store, custom, providers, metering, interval=0.0)
    follower.start()
    try:
        openai = providers.get("openai")
        for i in range(60):
            url = f"http://127.0.0.1:{9000 + i}/v1"
            providers.set_url("openai", url)
            assert providers.base_url(openai) == url, f"BUG: the follower undid a URL set here (round {i})"
            model = f"follow-{i}"
            custom.add({"id": model, "display_name": model, "provider": "openai",
                        "context_window": 8192, "max_output_tokens": 1024,
                        "input_cost_per_m": 0.0, "output_cost_per_m": 0.0, "supports_tools": True,
                        "supports_vision": False, "supports_streaming": True})
            assert catalog.get_model(model) is not None, f"BUG: the follower undid a model added here ({i})"
            custom.remove(model)
        metering.set_limit(7.5)
        time.sleep(0.05)
        assert metering.limit_usd == 7.5
    finally:
        follower.close()
    # What another daemon wrote reaches this one.
    store.set_setting("provider_urls", {"openai": "http://127.0.0.1:9999/v1"})
    follower.poll_once()
    assert providers.base_url(openai) == "http://127.0.0.1:9999/v1"
