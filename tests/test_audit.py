"""The audit trail's store: entries read back with their time, whatever the time was."""

from __future__ import annotations

from datetime import datetime, timezone

from agentd import audit
from agentd.audit import AuditLog
from agentd.store import open_store


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
