"""A job's schedule: validation and its due times.

Three kinds, as the API and the `cron_create` tool write them:

* `{"kind": "cron", "expr": "30 2 * * *", "tz": "Europe/Berlin"}` -- a standard 5-field cron
  expression (croniter), or a nickname such as `@daily`, read in an IANA zone (default UTC);
* `{"kind": "every", "every_secs": 60}` -- a fixed interval from the job's first due time;
* `{"kind": "at", "at": "2026-12-01T09:00:00Z"}` -- one time (ISO 8601; no offset means the
  zone `tz`, default UTC).

Due times are Unix seconds (UTC). A cron expression is walked in the zone's wall-clock time
and each wall time is mapped to one instant: a time the spring-forward gap skips runs at the
same wall time of the new offset, a time the fall-back hour repeats runs at its first occurrence
only, so a change of daylight-saving time neither skips nor doubles a run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from agentd.errors import BadRequest

KINDS = ("cron", "every", "at")
# The nicknames every cron takes for the commonest expressions (croniter reads them as their
# 5-field equivalents: @daily is 0 0 * * *). @reboot has no due time, so it is not one of them.
NICKNAMES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
# What a standard field holds: numbers, `*`, lists, ranges and steps, and in the month and
# weekday fields their names. croniter reads more (L, W, #, ?, R), which no other cron does.
_STANDARD_FIELD = re.compile(r"[0-9*,/-]*")
_NAMES = {3: re.compile(r"jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec"),
          4: re.compile(r"sun|mon|tue|wed|thu|fri|sat")}
# Names the host's zone database holds that are no IANA zone: the host's own zone, and the
# zones again under other rules (`right/` counts leap seconds).
_HOST_ZONES = ("localtime", "posixrules")
_HOST_ZONE_FOLDERS = ("posix/", "right/")
# A cron walk that finds no instant after this many wall times is a schedule that never fires
# (`0 0 30 2 *`, February 30th): such an expression is refused when created.
_MAX_STEPS = 1000
# The largest change of a zone's offset at once (daylight-saving shifts are one hour, some two).
_SHIFT = timedelta(hours=2)


@dataclass(frozen=True)
class Schedule:
    kind: str
    expr: str = ""
    every_secs: int = 0
    at: float = 0.0  # Unix seconds
    tz: str = "UTC"

    def to_json(self) -> dict[str, Any]:
        if self.kind == "cron":
            return {"kind": "cron", "expr": self.expr, "tz": self.tz}
        if self.kind == "every":
            return {"kind": "every", "every_secs": self.every_secs}
        return {"kind": "at", "at": iso_seconds(self.at)}

    def first_due(self, now: float) -> float | None:
        """The first due time strictly after `now` (an `at` in the past: None)."""
        if self.kind == "every":
            return now + self.every_secs
        if self.kind == "at":
            return self.at if self.at > now else None
        return self.next_after(now)

    def next_after(self, after: float, anchor: float | None = None) -> float | None:
        """The first due time strictly after `after`; `anchor` is a past due time of an
        interval (intervals keep their phase). None: there is none (`at`)."""
        if self.kind == "at":
            return self.at if self.at > after else None
        if self.kind == "every":
            if anchor is None:
                return after + self.every_secs
            steps = math.floor((after - anchor) / self.every_secs) + 1
            return anchor + max(1, steps) * self.every_secs
        zone = ZoneInfo(self.tz)
        # (Loaded with the first cron job, not by an idle daemon.)
        from croniter import CroniterBadDateError, croniter

        # Wall times inside a spring-forward gap map to instants after it, out of wall order
        # (02:30 of the gap runs after 03:00): the walk starts at `after`'s wall time read
        # with the offset before any shift, and takes the earliest instant among the wall
        # times up to one shift past the first that is due.
        start = min(_wall(after, zone), _wall(after - _SHIFT.total_seconds(), zone) + _SHIFT)
        walk = croniter(self.expr, start)
        best: float | None = None
        horizon: datetime | None = None
        for _ in range(_MAX_STEPS):
            try:
                wall = walk.get_next(datetime)
            except CroniterBadDateError:  # an expression that never matches a date
                break
            if horizon is not None and wall > horizon:
                break
            instant = _instant(wall, zone)
            if instant > after and (best is None or instant < best):
                if best is None and _offset(after, zone) == _offset(instant + _SHIFT.total_seconds(), zone):
                    return instant  # no shift on the way: wall order is time order
                best = instant
                horizon = horizon or wall + _SHIFT
        return best


def _offset(instant: float, zone: ZoneInfo) -> timedelta | None:
    return datetime.fromtimestamp(instant, zone).utcoffset()


def _wall(instant: float, zone: ZoneInfo) -> datetime:
    """The naive wall-clock time of `instant` in `zone`."""
    return datetime.fromtimestamp(instant, timezone.utc).astimezone(zone).replace(tzinfo=None)


def _instant(wall: datetime, zone: ZoneInfo) -> float:
    """The instant of a wall-clock time in `zone`: its first occurrence when the fall-back
    hour repeats it; a time inside the spring-forward gap is read with the offset before the
    gap (02:30 that does not exist runs at 03:30 of the new offset)."""
    return wall.replace(tzinfo=zone, fold=0).timestamp()


def iso_seconds(value: float | None) -> str | None:
    if value is None:
        return None
    return datetime.fromtimestamp(value, timezone.utc).isoformat().replace("+00:00", "Z")


def parse_time(text: Any, field: str, tz: str = "UTC") -> float:
    """An ISO 8601 time (no offset: in the zone `tz`, UTC by default) as Unix seconds; 400
    naming `field` otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise BadRequest(f"{field}: must be an ISO 8601 time, e.g. 2026-12-01T09:00:00Z")
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadRequest(f"{field}: must be an ISO 8601 time, e.g. 2026-12-01T09:00:00Z") from None
    if when.tzinfo is None:
        # A wall time the fall-back hour repeats is its first occurrence, as for cron.
        when = when.replace(tzinfo=timezone.utc if tz == "UTC" else ZoneInfo(tz), fold=0)
    try:
        # A time whose offset moves it past year 9999 (or before year 1) in UTC has no instant.
        return when.astimezone(timezone.utc).timestamp()
    except (OverflowError, ValueError):
        raise BadRequest(f"{field}: must be a time from year 1 to year 9999 in UTC") from None


def parse_schedule(data: Any, field: str = "schedule") -> Schedule:
    """A schedule object as the API takes it; 400 naming the field at fault."""
    if not isinstance(data, dict):
        raise BadRequest(f"{field}: must be an object with kind cron, every or at")
    kind = data.get("kind")
    if kind not in KINDS:
        raise BadRequest(f"{field}.kind: must be one of cron, every, at")
    allowed = {"cron": {"kind", "expr", "tz"}, "every": {"kind", "every_secs", "tz"}, "at": {"kind", "at", "tz"}}[kind]
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise BadRequest(f"{field}.{unknown[0]}: unknown field for kind {kind}")
    # Every kind takes `tz`: the zone of a cron expression and of an `at` time written without
    # an offset; an interval is the same in every zone.
    tz = _zone(data.get("tz"), f"{field}.tz")
    if kind == "cron":
        expr = _cron_expr(data.get("expr"), f"{field}.expr")
        schedule = Schedule("cron", expr=expr, tz=tz)
        if schedule.next_after(datetime.now(timezone.utc).timestamp()) is None:
            raise BadRequest(f"{field}.expr: the expression never matches a date")
        return schedule
    if kind == "every":
        secs = data.get("every_secs")
        if isinstance(secs, bool) or not isinstance(secs, int) or not 1 <= secs <= 366 * 86400:
            raise BadRequest(f"{field}.every_secs: must be an integer from 1 to {366 * 86400} (366 days)")
        return Schedule("every", every_secs=secs)
    return Schedule("at", at=parse_time(data.get("at"), f"{field}.at", tz))


def find_zone(name: str) -> ZoneInfo | None:
    """The IANA zone `name`, or None when there is none by that name."""
    if name in _HOST_ZONES or name.startswith(_HOST_ZONE_FOLDERS):
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a name that is a folder of the zone database ("Europe") or too long a path.
        return None


def _zone(tz: Any, field: str) -> str:
    if tz is None:
        return "UTC"
    if not isinstance(tz, str) or not tz:
        raise BadRequest(f"{field}: must be an IANA time zone name, e.g. Europe/Berlin")
    if find_zone(tz) is None:
        raise BadRequest(f"{field}: unknown time zone {tz!r}")
    return tz


def _cron_expr(expr: Any, field: str) -> str:
    """A 5-field expression or a nickname, whitespace normalised; 400 saying what is wrong."""
    from croniter import CroniterError, croniter

    usage = (f"{field}: must be a 5-field cron expression (minute hour day month weekday) "
             f"or one of {', '.join(NICKNAMES)}")
    if not isinstance(expr, str) or not expr.strip():
        raise BadRequest(usage)
    expr = " ".join(expr.split())
    if expr.startswith("@"):
        if expr.lower() not in NICKNAMES:
            raise BadRequest(usage)
        return expr.lower()
    if len(expr.split()) != 5:
        raise BadRequest(f"{usage}; {expr!r} has {len(expr.split())} fields")
    for index, value in enumerate(expr.split()):
        names = _NAMES.get(index)
        if not _STANDARD_FIELD.fullmatch(names.sub("", value.lower()) if names else value):
            raise BadRequest(f"{usage}; {value!r} in field {index} is not standard cron")
    try:
        croniter(expr)
    except (CroniterError, ValueError) as exc:
        # croniter's own words say what is wrong ("[61 * * * *] is not acceptable, out of range").
        reason = str(exc)
        reason = reason.replace(f"[{expr}]", repr(expr)) if f"[{expr}]" in reason else f"{expr!r}: {reason}"
        raise BadRequest(f"{usage}; {reason}") from None
    return expr


def schedule_from_json(data: dict[str, Any]) -> Schedule:
    """A stored schedule (already validated)."""
    kind = data["kind"]
    if kind == "cron":
        return Schedule("cron", expr=data["expr"], tz=data.get("tz") or "UTC")
    if kind == "every":
        return Schedule("every", every_secs=int(data["every_secs"]))
    return Schedule("at", at=parse_time(data["at"], "at"))


def day_start(now: float) -> float:
    """Midnight UTC of the day of `now` (the per-day caps count from there)."""
    day = datetime.fromtimestamp(now, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return day.timestamp()


__all__ = ["KINDS", "NICKNAMES", "Schedule", "day_start", "find_zone", "iso_seconds", "parse_schedule", "parse_time",
           "schedule_from_json"]
