"""The audit trail's store: entries read back with their time, whatever the time was."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Iterator

import pytest

from agentd import audit
from agentd.audit import AuditLog
from agentd.store import open_store
from support import store_url_for


def test_an_entry_written_on_a_whole_second_reads_back_with_its_time(tmp_path, monkeypatch) -> None:
    store = open_store(tmp_path / "agentd.db")
    try:
        log = AuditLog(store)
        monkeypatch.setattr(audit, "utcnow", lambda: datetime(2026, 3, 1, 12, 0, 5, tzinfo=timezone.utc))
        log.record("agent.spawned", "helper", {"n": 1})
        monkeypatch.setattr(audit, "utcnow", lambda: datetime(2026, 3, 1, 12, 0, 6, 250, tzinfo=timezone.utc))
        log.record("agent.killed", "helper")
        assert [(e["event"], e["timestamp"]) for e in log.recent()] == [
            ("agent.killed", "2026-03-01T12:00:06.000250+00:00"),
            ("agent.spawned", "2026-03-01T12:00:05+00:00")]
        since = datetime(2026, 3, 1, 12, 0, 6, tzinfo=timezone.utc)
        assert [e["event"] for e in log.recent(since=since)] == ["agent.killed"]
    finally:
        store.close()


@pytest.fixture()
def log(tmp_path) -> Iterator[AuditLog]:
    store = open_store(tmp_path / "agentd.db", store_url_for(tmp_path))
    yield AuditLog(store)
    store.close()


def test_an_entry_reads_back_field_by_field_newest_first(log: AuditLog) -> None:
    log.record("agent.spawn", "helper", {"agent_id": "a1"})
    log.record("agent.kill")
    log.record("agent.kill", None, None)
    entries = log.recent()
    assert [{k: v for k, v in e.items() if k not in ("id", "timestamp")} for e in entries] == [
        {"event": "agent.kill", "subject": "", "detail": {}},
        {"event": "agent.kill", "subject": "", "detail": {}},
        {"event": "agent.spawn", "subject": "helper", "detail": {"agent_id": "a1"}}]
    ids = [e["id"] for e in entries]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == 3
    assert all(isinstance(e["detail"], dict) and e["timestamp"].endswith("+00:00") for e in entries)


def test_filters_limits_and_bounds(log: AuditLog, monkeypatch: pytest.MonkeyPatch) -> None:
    for event, subject in [("channel.start", "irc"), ("xchannel.start", "irc"), ("channel.stop", "slack"),
                           ("agent.spawn", "irc")]:
        log.record(event, subject)
    assert [e["event"] for e in log.recent(prefix="channel.")] == ["channel.stop", "channel.start"]
    assert [e["event"] for e in log.recent(subject="irc")] == ["agent.spawn", "xchannel.start", "channel.start"]
    assert [e["event"] for e in log.recent(prefix="channel.", subject="irc")] == ["channel.start"]
    assert [e["event"] for e in log.recent(limit=2)] == ["agent.spawn", "channel.stop"]
    assert [e["event"] for e in log.recent(limit="1")] == ["agent.spawn"]  # type: ignore[arg-type]
    assert [e["event"] for e in log.recent(limit=0)] == ["agent.spawn"]
    assert [e["event"] for e in log.recent(limit=-5)] == ["agent.spawn"]
    monkeypatch.setattr(audit, "RECENT_MAX", 3)
    assert len(log.recent(limit=50)) == 3
    assert len(log.recent(limit=3)) == 3


def test_a_failed_write_is_logged_and_not_counted(log: AuditLog, caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 500th written entry prunes all but the newest KEEP; a write that fails is
    logged, raised to nobody, and not counted."""
    monkeypatch.setattr(audit, "KEEP", 3)
    caplog.set_level(logging.ERROR, logger="agentd.audit")
    log.record("bad", detail={"x": object()})  # not JSON: the database refuses it
    assert [r.getMessage() for r in caplog.records] == ["cannot write audit entry bad"]
    assert log.recent() == []
    for n in range(499):
        log.record(f"e{n}")
    assert len(log.recent(limit=1000)) == 499
    log.record("e499")
    assert [e["event"] for e in log.recent(limit=1000)] == ["e499", "e498", "e497"]
    for n in range(500, 999):
        log.record(f"e{n}")
    assert len(log.recent(limit=1000)) == 502
    log.record("e999")
    assert [e["event"] for e in log.recent(limit=1000)] == ["e999", "e998", "e997"]


def test_an_entry_lost_to_a_full_disk_is_one_warning_without_a_traceback(
        log: AuditLog, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    from agentd.store.outage import OUTAGE

    def full(**_: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(log.store.e, "AuditRow", full)
    monkeypatch.setattr(OUTAGE, "since", None)
    caplog.set_level(logging.WARNING, logger="agentd.audit")
    try:
        log.record("channel.configure", "telegram")
    finally:
        OUTAGE.since = OUTAGE.error = None
    assert [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records if r.name == "agentd.audit"] == [
        ("WARNING", "audit entry channel.configure telegram not written: insufficient storage: the disk "
                    "holding the database is full; free some space and retry", None)]
