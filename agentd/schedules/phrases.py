"""The `schedule` string of the `schedule_create` tool, as a schedule object.

Accepted (times are UTC, case does not matter):

* a 5-field cron expression: `0 */5 * * *`, or a nickname: `@daily`, `@hourly`, ...;
* `every N seconds|minutes|hours|days` (`every minute`, `every 2 hours`), `hourly`, `daily`,
  `weekly` (Sundays at 00:00);
* `daily at 9am`, `every day at 09:30`, `weekdays at 6pm`, `weekends at 10:00`,
  `mondays at 8:15` (any weekday name);
* one time: an ISO 8601 time (`2026-12-01T09:00:00Z`), `at <ISO time>`, `in 20 minutes`,
  `today at 17:00`, `tomorrow at 9:00` (or `tomorrow 9am`, `9:00 tomorrow`), `at 9am` (its
  next occurrence: today, or tomorrow once it has passed).
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from agentd.errors import BadRequest
from agentd.schedules.spec import NICKNAMES, iso_seconds, parse_time

UNITS = {"second": 1, "sec": 1, "minute": 60, "min": 60, "hour": 3600, "day": 86400, "week": 7 * 86400}
DAYS = {"sunday": 0, "monday": 1, "tuesday": 2, "wednesday": 3, "thursday": 4, "friday": 5, "saturday": 6}
_TIME = r"(\d{1,2})(?::(\d{2}))?\s*(am|pm)?"


def _clock(hour: str, minute: str | None, half: str | None) -> tuple[int, int]:
    h, m = int(hour), int(minute or 0)
    if half:
        if not 1 <= h <= 12:
            raise BadRequest(f"schedule: {hour}{half} is not a time")
        h = h % 12 + (12 if half == "pm" else 0)
    if not (0 <= h <= 23 and 0 <= m <= 59):
        raise BadRequest(f"schedule: {hour}:{minute or '00'} is not a time")
    return h, m


def parse_phrase(text: Any, now: float | None = None) -> dict[str, Any]:
    """A schedule object (`{kind: cron|every|at, ...}`) for a phrase; 400 when not understood."""
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("schedule: must be a cron expression or a phrase such as 'every 5 minutes'")
    phrase = " ".join(text.strip().lower().split())
    now = time.time() if now is None else now
    if len(phrase.split()) == 5 and re.fullmatch(r"[\d*/,\-a-z ?]+", phrase) and not phrase.startswith("every"):
        return {"kind": "cron", "expr": phrase, "tz": "UTC"}
    if phrase in NICKNAMES:
        return {"kind": "cron", "expr": phrase, "tz": "UTC"}
    if phrase in ("hourly", "every hour"):
        return {"kind": "cron", "expr": "0 * * * *", "tz": "UTC"}
    if phrase in ("daily", "every day"):
        return {"kind": "cron", "expr": "0 0 * * *", "tz": "UTC"}
    if phrase == "weekly":
        return {"kind": "cron", "expr": "0 0 * * 0", "tz": "UTC"}
    match = re.fullmatch(r"every (?:(\d+) )?(second|sec|minute|min|hour|day|week)s?", phrase)
    if match:
        count = int(match.group(1) or 1)
        if count < 1:
            raise BadRequest("schedule: the interval must be at least 1")
        return {"kind": "every", "every_secs": count * UNITS[match.group(2)]}
    match = re.fullmatch(r"in (\d+) (second|sec|minute|min|hour|day|week)s?", phrase)
    if match:
        return {"kind": "at", "at": iso_seconds(now + int(match.group(1)) * UNITS[match.group(2)])}
    match = (re.fullmatch(r"(today|tomorrow) (?:at )?" + _TIME, phrase)
             or re.fullmatch(r"(?:at )?" + _TIME + r" (today|tomorrow)", phrase)
             or re.fullmatch(r"at " + _TIME + r"()", phrase))
    if match:
        groups = match.groups()
        day, clock = (groups[0], groups[1:]) if groups[0] in ("today", "tomorrow") else (groups[3], groups[:3])
        hour, minute = _clock(*clock)
        base = datetime.fromtimestamp(now, timezone.utc).replace(hour=hour, minute=minute, second=0, microsecond=0)
        if day == "tomorrow" or (not day and base.timestamp() <= now):
            base += timedelta(days=1)
        return {"kind": "at", "at": iso_seconds(base.timestamp())}
    match = re.fullmatch(r"(daily|every day|weekdays|every weekday|weekends|(?:every )?([a-z]+?)s?) at " + _TIME,
                         phrase)
    if match:
        which, day = match.group(1), match.group(2)
        hour, minute = _clock(match.group(3), match.group(4), match.group(5))
        if which in ("daily", "every day"):
            days = "*"
        elif which in ("weekdays", "every weekday"):
            days = "1-5"
        elif which == "weekends":
            days = "0,6"
        elif day in DAYS:
            days = str(DAYS[day])
        else:
            days = ""
        if days:
                return {"kind": "cron", "expr": f"{minute} {hour} * * {days}", "tz": "UTC"}
    candidate = phrase[3:] if phrase.startswith("at ") else text.strip()
    try:
        return {"kind": "at", "at": iso_seconds(parse_time(candidate.upper() if "t" in candidate else candidate,
                                                           "schedule"))}
    except BadRequest:
        pass
    raise BadRequest(f"schedule: cannot read {text!r}; use a cron expression, 'every 5 minutes', "
                     "'daily at 9am', 'weekdays at 6pm', 'tomorrow at 9:00' or an ISO 8601 time")
