"""Time helpers: every timestamp is UTC and goes on the wire as ISO 8601."""

from __future__ import annotations

from datetime import datetime, timezone


def utcnow() -> datetime:
    """Now, timezone-aware UTC."""
    return datetime.now(timezone.utc)


def iso(dt: datetime) -> str:
    """ISO 8601 with an explicit offset (naive datetimes from the database are UTC)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.isoformat()
