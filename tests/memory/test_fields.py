"""Validation of memory inputs (agentd/memory/fields.py) with exact messages, values at
each limit and one past it."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import pytest

from agentd.errors import BadRequest
from agentd.memory import fields
from agentd.memory.fields import MemoryFilter


def message(call: Any, *args: Any) -> str:
    with pytest.raises(BadRequest) as err:
        call(*args)
    return err.value.message


def test_limits_and_enums() -> None:
    assert fields.SOURCES == ("conversation", "document", "observation", "inference", "user_provided", "system")
    assert (fields.MAX_CONTENT, fields.MAX_NAME, fields.MAX_DEPTH) == (32_000, 256, 16)
    assert MemoryFilter() == MemoryFilter(None, None, None, None, None, {})


def test_text() -> None:
    assert fields.text(" a ", "f") == " a "
    assert fields.text("x" * 32_000, "content") == "x" * 32_000
    assert message(fields.text, "x" * 32_001, "content") == "content is too long (32001 characters, limit 32000)"
    assert fields.text("x" * 5, "n", 5) == "x" * 5
    assert message(fields.text, "x" * 6, "n", 5) == "n is too long (6 characters, limit 5)"
    for bad in ("", "   \n", None, 5, ["a"]):
        assert message(fields.text, bad, "content") == "content must be a non-empty string"
    assert message(fields.text, "a\ud800b", "content") == "content is not valid Unicode (lone surrogate)"


def test_source_and_confidence() -> None:
    for s in fields.SOURCES:
        assert fields.source(s) == s
    for bad in ("User_provided", "", None, "rumour"):
        assert message(fields.source, bad) == ("source must be one of conversation, document, observation, "
                                               "inference, user_provided, system")
    assert fields.confidence(0) == 0.0 and fields.confidence(1) == 1.0 and fields.confidence(0.5) == 0.5
    assert isinstance(fields.confidence(1), float)
    for bad in (-0.0001, 1.0001, math.nan, True, False, "0.5", None, math.inf):
        assert message(fields.confidence, bad) == "confidence must be a number between 0 and 1"
    assert message(fields.confidence, 2, "x.conf") == "x.conf must be a number between 0 and 1"


def test_score_and_integer() -> None:
    assert fields.score(-1) == -1.0 and fields.score(1) == 1.0 and isinstance(fields.score(0), float)
    for bad in (-1.0001, 1.0001, math.nan, True, "0", None):
        assert message(fields.score, bad) == "min_score must be a number between -1 and 1"
    assert message(fields.score, 2, "s") == "s must be a number between -1 and 1"
    assert fields.integer(1, "limit", 1, 100) == 1 and fields.integer(100, "limit", 1, 100) == 100
    for bad in (0, 101, True, 1.0, "5", None):
        assert message(fields.integer, bad, "limit", 1, 100) == "limit must be an integer between 1 and 100"


def test_obj() -> None:
    assert fields.obj({}, "m") == {} and fields.obj({"k" * 256: [1, {"x": None}]}, "m") == {"k" * 256: [1, {"x": None}]}
    for bad in ([], "x", None, 1):
        assert message(fields.obj, bad, "metadata") == "metadata must be a JSON object"
    assert message(fields.obj, {"": 1}, "metadata") == "metadata keys must be 1-256 characters"
    assert message(fields.obj, {"k" * 257: 1}, "metadata") == "metadata keys must be 1-256 characters"
    assert message(fields.obj, {"a\udc00": 1}, "metadata") == "metadata key is not valid Unicode (lone surrogate)"
    for bad in (math.nan, math.inf, -math.inf):
        assert message(fields.obj, {"k": [bad]}, "metadata") == "metadata must not hold NaN or infinite numbers"


@pytest.mark.parametrize("value,expected", [
    ("2024-01-01T00:00:00Z", datetime(2024, 1, 1, tzinfo=timezone.utc)),
    ("2024-01-01t00:00:00z", datetime(2024, 1, 1, tzinfo=timezone.utc)),
    ("2024-01-01T02:00:00+02:00", datetime(2024, 1, 1, tzinfo=timezone.utc)),
    ("2024-01-01T00:00:00", datetime(2024, 1, 1, tzinfo=timezone.utc)),
    (" 2024-01-01 00:00:00.123456789Z ", datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=timezone.utc)),
    ("2024-01-01T00:00:00.5+00:00", datetime(2024, 1, 1, 0, 0, 0, 500000, tzinfo=timezone.utc)),
    ("2024-01-01", datetime(2024, 1, 1, tzinfo=timezone.utc)),
    ("20240101T053000-01:00", datetime(2024, 1, 1, 6, 30, tzinfo=timezone.utc)),
    ("2024-W01-2 05:00z", datetime(2024, 1, 2, 5, tzinfo=timezone.utc)),
    ("2024W013t05", datetime(2024, 1, 3, 5, tzinfo=timezone.utc)),
])
def test_parse_time(value: str, expected: datetime) -> None:
    got = fields.parse_time(value, "t")
    assert got == expected and got.tzinfo == timezone.utc and got.utcoffset().total_seconds() == 0


@pytest.mark.parametrize("value", ["2024-01-01+05:00", "2024-01-01-05:00", "2024-01-01Z", "2024-01-01x05:00",
                                   "2024-01-0105:00", "20240101+0500", "2024-W01-1+05:00", "2024-01-01T05:00+05:00x"])
def test_only_t_or_a_space_separates_date_and_time(value: str) -> None:
    # Python reads any character after the date as the separator: "2024-01-01+05:00" was 05:00 UTC.
    assert message(fields.parse_time, value, "filter.after") == "filter.after must be an ISO 8601 timestamp", \
        f"BUG: {value!r} (a date followed by something other than T or a space) was read as a time"


def test_times_are_utc_whatever_the_machines_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        for value in ("2024-01-01T00:00:00", "2024-01-01T09:00:00+09:00", "2024-01-01"):
            got = fields.parse_time(value, "t")
            assert got == datetime(2024, 1, 1, tzinfo=timezone.utc), f"BUG: {value} read in the machine's zone"
            assert got.tzinfo is timezone.utc and got.isoformat() == "2024-01-01T00:00:00+00:00"
            assert fields.timestamp(value, "t") == 1704067200.0
    finally:
        monkeypatch.undo()
        time.tzset()


def test_parse_time_and_timestamp_errors() -> None:
    for bad in ("yesterday", "", 5, None, "2024-13-01T00:00:00Z"):
        assert message(fields.parse_time, bad, "filter.after") == "filter.after must be an ISO 8601 timestamp"
    assert fields.timestamp(1704067200, "t") == 1704067200.0 and isinstance(fields.timestamp(5, "t"), float)
    assert fields.timestamp(1.5, "t") == 1.5
    assert fields.timestamp("2024-01-01T00:00:00Z", "t") == 1704067200.0
    assert fields.timestamp("2024-01-01T00:00:00", "t") == 1704067200.0, "a naive time is UTC"
    assert message(fields.timestamp, True, "filter.before") == "filter.before must be an ISO 8601 timestamp"
    assert message(fields.timestamp, "nope", "filter.before") == "filter.before must be an ISO 8601 timestamp"
    assert message(fields.timestamp, "0001-01-01T00:00:00+01:00", "t") == "t must be an ISO 8601 timestamp"
    assert message(fields.timestamp, None, "filter.after") == "filter.after must be an ISO 8601 timestamp"
    assert fields.timestamp("9999-12-31T23:59:59.999999Z", "t") == 253402300799.999999
    assert fields.timestamp("0001-01-01T00:00:00Z", "t") == -62135596800.0


def test_memory_filter() -> None:
    assert fields.memory_filter(None) == MemoryFilter()
    assert fields.memory_filter({}) == MemoryFilter()
    assert fields.memory_filter({"source": None, "scope": None, "min_confidence": None, "after": None,
                                 "before": None, "metadata": None}) == MemoryFilter()
    got = fields.memory_filter({"source": "system", "scope": "s", "min_confidence": 0.5,
                                "after": "2024-01-01T00:00:00Z", "before": 1704067201, "metadata": {"k": 1}})
    assert got == MemoryFilter("system", "s", 0.5, 1704067200.0, 1704067201.0, {"k": 1})
    assert fields.memory_filter({"agent_id": "a-1", "source": None}) == MemoryFilter(agent_id="a-1")
    assert message(fields.memory_filter, {"agent_id": ""}) == "filter.agent_id must be a non-empty string"
    assert message(fields.memory_filter, []) == "filter must be a JSON object"
    assert message(fields.memory_filter, {"zeta": 1, "alpha": 2, "source": "system"}) == \
        "filter has unknown field(s) alpha, zeta; allowed: after, agent_id, before, metadata, min_confidence, scope, source"
    assert message(fields.memory_filter, {"source": "x"}).startswith("source must be one of")
    assert message(fields.memory_filter, {"scope": ""}) == "filter.scope must be a non-empty string"
    assert message(fields.memory_filter, {"scope": "s" * 257}) == "filter.scope is too long (257 characters, limit 256)"
    assert fields.memory_filter({"scope": "s" * 256}).scope == "s" * 256
    assert message(fields.memory_filter, {"min_confidence": 2}) == \
        "filter.min_confidence must be a number between 0 and 1"
    assert message(fields.memory_filter, {"after": "x"}) == "filter.after must be an ISO 8601 timestamp"
    assert message(fields.memory_filter, {"before": "x"}) == "filter.before must be an ISO 8601 timestamp"
    assert message(fields.memory_filter, {"metadata": 1}) == "filter.metadata must be a JSON object"
    assert fields.memory_filter({"min_confidence": 0}).min_confidence == 0.0
    assert fields.memory_filter({"after": 0}).after == 0.0 and fields.memory_filter({"before": 0}).before == 0.0


def test_kind() -> None:
    assert fields.kind(" person ", "entity_type") == "person"
    assert fields.kind({"custom": "pet"}, "entity_type") == "pet"
    assert fields.kind("x" * 64, "t") == "x" * 64
    assert message(fields.kind, "x" * 65, "t") == "t is too long (65 characters, limit 64)"
    assert message(fields.kind, {"custom": "pet", "x": 1}, "entity_type") == "entity_type must be a non-empty string"
    assert message(fields.kind, {"other": "pet"}, "entity_type") == "entity_type must be a non-empty string"
    assert message(fields.kind, {"custom": ""}, "relation") == "relation must be a non-empty string"
