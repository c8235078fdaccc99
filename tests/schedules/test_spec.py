"""Schedules on a fake clock: due times across daylight-saving changes, monthly and
interval schedules, validation messages, and the phrases of `schedule_create`."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from agentd.errors import BadRequest
from agentd.schedules.phrases import parse_phrase
from agentd.schedules.spec import Schedule, parse_schedule

NEW_YORK = ZoneInfo("America/New_York")


def walk(schedule: Schedule, start: datetime, count: int) -> list[datetime]:
    """The next `count` due times after `start`, each found from the one before (as the ticker does)."""
    due, out = start.timestamp(), []
    for _ in range(count):
        due = schedule.next_after(due)
        out.append(datetime.fromtimestamp(due, NEW_YORK))
    return out


def test_a_daily_job_in_the_spring_forward_gap_runs_once_that_day() -> None:
    # 2026-03-08 02:00 EST jumps to 03:00 EDT: 02:30 does not exist that day.
    days = walk(parse_schedule({"kind": "cron", "expr": "30 2 * * *", "tz": "America/New_York"}),
                datetime(2026, 3, 6, 12, tzinfo=timezone.utc), 4)
    assert [(d.month, d.day) for d in days] == [(3, 7), (3, 8), (3, 9), (3, 10)]
    assert [d.strftime("%H:%M %Z") for d in days] == ["02:30 EST", "03:30 EDT", "02:30 EDT", "02:30 EDT"]


def test_a_daily_job_in_the_repeated_fall_back_hour_runs_once_that_day() -> None:
    # 2026-11-01 02:00 EDT falls back to 01:00 EST: 01:30 happens twice.
    days = walk(parse_schedule({"kind": "cron", "expr": "30 1 * * *", "tz": "America/New_York"}),
                datetime(2026, 10, 30, 12, tzinfo=timezone.utc), 4)
    assert [(d.month, d.day) for d in days] == [(10, 31), (11, 1), (11, 2), (11, 3)]
    assert [d.strftime("%H:%M %Z") for d in days] == ["01:30 EDT", "01:30 EDT", "01:30 EST", "01:30 EST"]


def test_an_hourly_job_across_spring_forward_neither_doubles_nor_stalls() -> None:
    days = walk(parse_schedule({"kind": "cron", "expr": "0 * * * *", "tz": "America/New_York"}),
                datetime(2026, 3, 8, 5, 30, tzinfo=timezone.utc), 3)
    assert [d.strftime("%H:%M %Z") for d in days] == ["01:00 EST", "03:00 EDT", "04:00 EDT"]


def test_a_monthly_job_lands_on_the_last_matching_day() -> None:
    utc = parse_schedule({"kind": "cron", "expr": "0 9 31 * *"})
    due = utc.next_after(datetime(2026, 1, 31, 10, tzinfo=timezone.utc).timestamp())
    assert datetime.fromtimestamp(due, timezone.utc) == datetime(2026, 3, 31, 9, tzinfo=timezone.utc)


def test_an_at_time_without_an_offset_is_read_in_its_zone() -> None:
    berlin = {"kind": "at", "at": "2030-06-01T09:00:00", "tz": "Europe/Berlin"}
    assert parse_schedule(berlin).to_json() == {"kind": "at", "at": "2030-06-01T07:00:00Z"}
    assert parse_schedule({**berlin, "at": "2030-06-01T09:00:00+00:00"}).to_json()["at"] == "2030-06-01T09:00:00Z"
    assert parse_schedule({**berlin, "tz": None}).to_json()["at"] == "2030-06-01T09:00:00Z"
    # The fall-back hour repeats 02:30: its first occurrence, as for a cron expression.
    assert parse_schedule({**berlin, "at": "2030-10-27T02:30:00"}).to_json()["at"] == "2030-10-27T00:30:00Z"
    assert parse_schedule({"kind": "every", "every_secs": 5, "tz": "Asia/Tokyo"}).to_json() == \
        {"kind": "every", "every_secs": 5}


def test_an_interval_keeps_its_phase() -> None:
    every = parse_schedule({"kind": "every", "every_secs": 10})
    assert every.next_after(1000.0, anchor=1000.0) == 1010.0
    assert every.next_after(1034.5, anchor=1000.0) == 1040.0


@pytest.mark.parametrize("body, field", [
    ({"kind": "cron", "expr": "* * * *"}, "schedule.expr"),
    ({"kind": "cron", "expr": "0 0 0 * * *"}, "schedule.expr"),
    ({"kind": "cron", "expr": "61 * * * *"}, "schedule.expr"),
    ({"kind": "cron", "expr": "0 0 30 2 *"}, "schedule.expr"),
    ({"kind": "cron", "expr": "0 9 * * *", "tz": "Mars/Olympus"}, "schedule.tz"),
    ({"kind": "cron", "expr": "0 9 * * *", "tz": "Europe"}, "schedule.tz"),  # a folder of the zone database
    ({"kind": "cron", "expr": "0 9 * * *", "tz": "localtime"}, "schedule.tz"),  # the host's zone, no IANA name
    ({"kind": "cron", "expr": "0 9 * * *", "tz": "right/UTC"}, "schedule.tz"),  # UTC counting leap seconds
    ({"kind": "at", "at": "2030-01-01T09:00:00", "tz": "America/"}, "schedule.tz"),
    ({"kind": "every", "every_secs": 5, "tz": 5}, "schedule.tz"),
    ({"kind": "every", "every_secs": 0}, "schedule.every_secs"),
    ({"kind": "every", "every_secs": 1.5}, "schedule.every_secs"),
    ({"kind": "every", "every_secs": True}, "schedule.every_secs"),
    ({"kind": "at", "at": "tomorrow"}, "schedule.at"),
    ({"kind": "at", "at": "9999-12-31T23:59:59-23:59"}, "schedule.at"),  # past year 9999 in UTC
    ({"kind": "at", "at": "9999-12-31T23:59:59", "tz": "America/New_York"}, "schedule.at"),
    ({"kind": "at", "at": "0001-01-01T00:00:00+14:00"}, "schedule.at"),
    ({"kind": "weekly"}, "schedule.kind"),
    ({"kind": "every", "every_secs": 5, "expr": "x"}, "schedule.expr"),
    ("0 9 * * *", "schedule"),
])
def test_a_bad_schedule_names_its_field(body, field) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_schedule(body)
    assert refused.value.message.startswith(field + ":")


@pytest.mark.parametrize("expr, says", [
    ("0 0 9 * * *", "'0 0 9 * * *' has 6 fields"),
    ("* * * *", "'* * * *' has 4 fields"),
    ("61 * * * *", "'61 * * * *' is not acceptable, out of range"),
    ("*/0 * * * *", "step '0' in field 0 is not acceptable"),
    ("@reboot", "or one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly"),
    ("0 0 L * *", "'L' in field 2 is not standard cron"),
    ("0 0 LW * *", "'LW' in field 2 is not standard cron"),
    ("0 0 * * fri#2", "'fri#2' in field 4 is not standard cron"),
    ("0 0 * * L5", "'L5' in field 4 is not standard cron"),
    ("R 0 * * *", "'R' in field 0 is not standard cron"),
    ("0 0 * jull *", "'jull' in field 3 is not standard cron"),
])
def test_a_refused_cron_expression_says_what_is_wrong(expr, says) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_schedule({"kind": "cron", "expr": expr})
    assert refused.value.message.startswith(
        "schedule.expr: must be a 5-field cron expression (minute hour day month weekday) or one of @yearly")
    assert refused.value.message.endswith(says)


def test_month_and_weekday_names_are_standard_cron() -> None:
    named = parse_schedule({"kind": "cron", "expr": "0 9 1-7/2 JAN-mar,dec mon-FRI,sun"})
    assert named.to_json() == {"kind": "cron", "expr": "0 9 1-7/2 JAN-mar,dec mon-FRI,sun", "tz": "UTC"}


def test_cron_nicknames_are_read_in_the_jobs_zone() -> None:
    start = datetime(2026, 3, 6, 12, tzinfo=timezone.utc)
    daily = parse_schedule({"kind": "cron", "expr": "@Daily", "tz": "America/New_York"})
    assert daily.to_json() == {"kind": "cron", "expr": "@daily", "tz": "America/New_York"}
    assert [d.isoformat() for d in walk(daily, start, 3)] == [
        "2026-03-07T00:00:00-05:00", "2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00"]
    assert walk(parse_schedule({"kind": "cron", "expr": "@hourly", "tz": "America/New_York"}), start, 1)[0] \
        == datetime(2026, 3, 6, 8, tzinfo=NEW_YORK)
    assert [d.isoformat() for d in walk(parse_schedule({"kind": "cron", "expr": "@monthly"}), start, 2)] == [
        "2026-03-31T20:00:00-04:00", "2026-04-30T20:00:00-04:00"]  # 00:00 UTC on the 1st


NOW = datetime(2026, 9, 21, 14, 13, 20, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("phrase, expected", [
    ("0 */5 * * *", {"kind": "cron", "expr": "0 */5 * * *", "tz": "UTC"}),
    ("every 5 minutes", {"kind": "every", "every_secs": 300}),
    ("Every minute", {"kind": "every", "every_secs": 60}),
    ("every 2 hours", {"kind": "every", "every_secs": 7200}),
    ("hourly", {"kind": "cron", "expr": "0 * * * *", "tz": "UTC"}),
    ("@weekly", {"kind": "cron", "expr": "@weekly", "tz": "UTC"}),
    ("daily at 9am", {"kind": "cron", "expr": "0 9 * * *", "tz": "UTC"}),
    ("daily at 09:30", {"kind": "cron", "expr": "30 9 * * *", "tz": "UTC"}),
    ("weekdays at 6pm", {"kind": "cron", "expr": "0 18 * * 1-5", "tz": "UTC"}),
    ("mondays at 8:15", {"kind": "cron", "expr": "15 8 * * 1", "tz": "UTC"}),
    ("in 20 minutes", {"kind": "at", "at": "2026-09-21T14:33:20Z"}),
    ("tomorrow at 9:00", {"kind": "at", "at": "2026-09-22T09:00:00Z"}),
    ("9:00 tomorrow", {"kind": "at", "at": "2026-09-22T09:00:00Z"}),
    ("tomorrow 9am", {"kind": "at", "at": "2026-09-22T09:00:00Z"}),
    ("at 5:30pm", {"kind": "at", "at": "2026-09-21T17:30:00Z"}),
    ("at 14:13", {"kind": "at", "at": "2026-09-22T14:13:00Z"}),  # passed a moment ago: tomorrow's
    ("weekly", {"kind": "cron", "expr": "0 0 * * 0", "tz": "UTC"}),
    ("2026-12-01T09:00:00Z", {"kind": "at", "at": "2026-12-01T09:00:00Z"}),
    ("at 2026-12-01T09:00:00Z", {"kind": "at", "at": "2026-12-01T09:00:00Z"}),
    ("2026-12-01 09:00:00+01:00", {"kind": "at", "at": "2026-12-01T08:00:00Z"}),
    ("0 9 * * MON", {"kind": "cron", "expr": "0 9 * * mon", "tz": "UTC"}),
    ("every hour", {"kind": "cron", "expr": "0 * * * *", "tz": "UTC"}),
    ("daily", {"kind": "cron", "expr": "0 0 * * *", "tz": "UTC"}),
    ("Every  Day", {"kind": "cron", "expr": "0 0 * * *", "tz": "UTC"}),
    ("every day at 23:59", {"kind": "cron", "expr": "59 23 * * *", "tz": "UTC"}),
    ("daily at 0:00", {"kind": "cron", "expr": "0 0 * * *", "tz": "UTC"}),
    ("every weekday at 12am", {"kind": "cron", "expr": "0 0 * * 1-5", "tz": "UTC"}),
    ("weekends at 12pm", {"kind": "cron", "expr": "0 12 * * 0,6", "tz": "UTC"}),
    ("fridays at 1am", {"kind": "cron", "expr": "0 1 * * 5", "tz": "UTC"}),
    ("today at 17:00", {"kind": "at", "at": "2026-09-21T17:00:00Z"}),
    ("today at 0:00", {"kind": "at", "at": "2026-09-21T00:00:00Z"}),  # asked for: kept, though past
    ("at 9:00 tomorrow", {"kind": "at", "at": "2026-09-22T09:00:00Z"}),
])
def test_schedule_create_phrases(phrase, expected) -> None:
    assert parse_phrase(phrase, now=NOW) == expected


def test_a_time_of_day_reached_this_very_second_is_tomorrows() -> None:
    on_the_minute = datetime(2026, 9, 21, 14, 13, tzinfo=timezone.utc).timestamp()
    assert parse_phrase("at 14:13", now=on_the_minute) == {"kind": "at", "at": "2026-09-22T14:13:00Z"}


def test_a_phrase_is_read_against_the_clock_when_no_time_is_given() -> None:
    before = time.time()
    at = datetime.fromisoformat(parse_phrase("in 1 minute")["at"].replace("Z", "+00:00")).timestamp()
    assert before + 59 <= at <= time.time() + 61


CANNOT_READ = ("; use a cron expression, 'every 5 minutes', 'daily at 9am', 'weekdays at 6pm', "
               "'tomorrow at 9:00' or an ISO 8601 time")


@pytest.mark.parametrize("phrase, says", [
    ("now and then", "schedule: cannot read 'now and then'" + CANNOT_READ),
    ("blursdays at 9am", "schedule: cannot read 'blursdays at 9am'" + CANNOT_READ),
    ("every 0 minutes", "schedule: the interval must be at least 1"),
    ("daily at 25:00", "schedule: 25:00 is not a time"),
    ("daily at 24", "schedule: 24:00 is not a time"),
    ("daily at 9:60", "schedule: 9:60 is not a time"),
    ("at 13pm", "schedule: 13pm is not a time"),
    ("daily at 0am", "schedule: 0am is not a time"),
    ("", "schedule: must be a cron expression or a phrase such as 'every 5 minutes'"),
    (None, "schedule: must be a cron expression or a phrase such as 'every 5 minutes'"),
])
def test_an_unreadable_phrase_is_refused(phrase, says) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_phrase(phrase, now=NOW)
    assert refused.value.message == says


def test_the_four_manifest_schedules() -> None:
    from agentd.agents.manifest import ManifestError, parse_manifest

    def schedule_of(toml: str) -> dict:
        return parse_manifest(f'name = "m"\n{toml}').schedule

    assert schedule_of("") == schedule_of('schedule = "reactive"') == {"kind": "reactive"}
    assert schedule_of('schedule = {periodic = {cron = "*/15  9-17 * * 1-5"}}') == {
        "kind": "periodic", "cron": "*/15 9-17 * * 1-5", "tz": "UTC", "message": ""}
    assert schedule_of('[schedule.continuous]\ncheck_interval_secs = 30\nmessage = "look around"\n') == {
        "kind": "continuous", "check_interval_secs": 30, "message": "look around"}
    # Proactive conditions are kept as written, for the trigger engine to read.
    conditions = 'schedule = {proactive = {conditions = ["memory:inbox/*", {content_match = "alert"}]}}'
    assert schedule_of(conditions) == {"kind": "proactive",
                                       "conditions": ["memory:inbox/*", {"content_match": "alert"}]}
    for bad, says in [('schedule = "sometimes"', "schedule: must be"),
                      ('schedule = {periodic = {cron = "* * *"}}', "schedule: periodic.cron: must be a 5-field"),
                      ('schedule = {periodic = {cron = "0 9 * * *", tz = "Nowhere/City"}}', "periodic.tz: unknown"),
                      ('schedule = {continuous = {check_interval_secs = 0}}', "continuous.check_interval_secs"),
                      ('schedule = {proactive = {conditions = "x"}}', "proactive.conditions: must be an array"),
                      ('schedule = {periodic = {cron = "0 9 * * *"}, continuous = {}}', "schedule: must be")]:
        with pytest.raises(ManifestError) as refused:
            parse_manifest(f'name = "m"\n{bad}\n')
        assert says in refused.value.message, (bad, refused.value.message)


@pytest.mark.parametrize("expr, zone, start, expected", [
    # 2027-03-28 02:00 CET jumps to 03:00 CEST: both half hours of the gap run, an hour later.
    ("*/30 2 * * *", "Europe/Berlin", datetime(2027, 3, 27, 1, 15, tzinfo=timezone.utc),
     ["03-27 02:30 CET", "03-28 03:00 CEST", "03-28 03:30 CEST", "03-29 02:00 CEST"]),
    # 2027-03-14 02:00 EST jumps to 03:00 EDT.
    ("15,45 2 * * *", "America/New_York", datetime(2027, 3, 13, 7, 30, tzinfo=timezone.utc),
     ["03-13 02:45 EST", "03-14 03:15 EDT", "03-14 03:45 EDT", "03-15 02:15 EDT"]),
    # The gap's 02:15 and the next hour's 03:15 are one instant: one run each, in time order.
    ("15,45 2,3 * * *", "America/New_York", datetime(2027, 3, 14, 6, tzinfo=timezone.utc),
     ["03-14 03:15 EDT", "03-14 03:45 EDT", "03-15 02:15 EDT", "03-15 02:45 EDT"]),
    # The repeated fall-back hour runs each of its slots once.
    ("*/30 1 * * *", "America/New_York", datetime(2026, 10, 31, 12, tzinfo=timezone.utc),
     ["11-01 01:00 EDT", "11-01 01:30 EDT", "11-02 01:00 EST", "11-02 01:30 EST"]),
    # Lord Howe Island moves by half an hour (2026-10-04 02:00 to 02:30): the gap's 02:10 runs
    # at 02:40, after 02:35, which exists.
    ("10,35 2 * * *", "Australia/Lord_Howe", datetime(2026, 10, 2, 12, tzinfo=timezone.utc),
     ["10-03 02:10 +1030", "10-03 02:35 +1030", "10-04 02:35 +11", "10-04 02:40 +11", "10-05 02:10 +11"]),
])
def test_every_slot_of_a_day_with_a_shift_runs_once(expr: str, zone: str, start: datetime,
                                                     expected: list[str]) -> None:
    due, got = start.timestamp(), []
    for _ in expected:
        due = parse_schedule({"kind": "cron", "expr": expr, "tz": zone}).next_after(due)
        got.append(datetime.fromtimestamp(due, ZoneInfo(zone)).strftime("%m-%d %H:%M %Z"))
    assert got == expected


def test_an_interval_and_a_single_time_have_their_own_next_due_times() -> None:
    every = parse_schedule({"kind": "every", "every_secs": 60})
    assert every.next_after(1000.0) == 1060.0
    assert every.next_after(1000.0, anchor=910.0) == 1030.0  # the interval keeps its phase
    at = parse_schedule({"kind": "at", "at": "2030-06-01T09:00:00Z"})
    when = datetime(2030, 6, 1, 9, tzinfo=timezone.utc).timestamp()
    assert (at.next_after(when - 1), at.next_after(when), at.next_after(when + 1)) == (when, None, None)
