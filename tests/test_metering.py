"""Metering beyond tests/api/test_core.py, value by value, in process on a real store: deferred
rows written in the caller's transaction, metering switched off, daemons sharing a database,
alert texts, report ordering and the per-day report (agentd/metering.py).

gpt-4o in agentd/data/models.json: $2.50 per million input tokens, $10.00 per million output.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from pony import orm

from agentd.errors import TooManyRequests
from agentd.llm.catalog import Catalog
from agentd.metering import Metering
from agentd.store import open_store
from support import store_url_for


class Now:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


MARCH = datetime(2026, 3, 10, 12, 0, tzinfo=timezone.utc)


@pytest.fixture()
def store(tmp_path: Path):
    s = open_store(tmp_path / "agentd.db", store_url_for(tmp_path))
    yield s
    s.close()


def usage_rows(store) -> list[tuple]:
    with orm.db_session:
        return [tuple(r) for r in store.db.select(
            "SELECT agent_id, agent_name, provider, model, input_tokens, output_tokens, cost_usd, priced, at "
            "FROM usage ORDER BY id")]


def test_a_recorded_call_is_one_exact_row(store) -> None:
    metering = Metering(store, Catalog.load(), now=Now(MARCH))
    assert metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10) == pytest.approx(0.0026, abs=1e-15)
    assert metering.record("b2", "beta", "local", "no-such-model", 5, 6) is None
    rows = usage_rows(store)
    assert [r[:6] for r in rows] == [("a1", "alpha", "openai", "gpt-4o", 1000, 10),
                                     ("b2", "beta", "local", "no-such-model", 5, 6)]
    assert rows[0][6] == pytest.approx(0.0026, abs=1e-15) and rows[1][6] == 0
    assert [bool(r[7]) for r in rows] == [True, False]
    assert [str(r[8])[:19] for r in rows] == ["2026-03-10 12:00:00"] * 2, "BUG: usage time is not UTC wall time"


def test_deferred_rows_are_written_by_the_caller_and_counted_at_once(store) -> None:
    metering = Metering(store, Catalog.load(), now=Now(MARCH))
    deferred: list[dict] = []
    cost = metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10, defer=deferred)
    assert cost == pytest.approx(0.0026, abs=1e-15)
    assert usage_rows(store) == [], "BUG: a deferred row was written before the run's commit"
    assert deferred == [{"agent_id": "a1", "agent_name": "alpha", "provider": "openai", "model": "gpt-4o",
                         "input_tokens": 1000, "output_tokens": 10, "cost_usd": cost, "priced": True,
                         "at": datetime(2026, 3, 10, 12, 0), "key_id": None}]
    assert metering.budget()["spent_usd"] == pytest.approx(0.0026), "BUG: a deferred call escapes the budget"
    metering.set_limit(0.0026)
    with pytest.raises(TooManyRequests):
        metering.check_budget()
    metering.record("a1", "alpha", "openai", "no-such-model", 1, 2, defer=deferred)
    store.write(lambda tx: metering.write_rows(tx, deferred))
    assert [(r[3], r[4], r[5], bool(r[7])) for r in usage_rows(store)] == \
        [("gpt-4o", 1000, 10, True), ("no-such-model", 1, 2, False)]
    assert metering.totals(*metering.period(None, None))["requests"] == 2


def test_disabled_metering_prices_but_records_nothing(store) -> None:
    metering = Metering(store, Catalog.load(), now=Now(MARCH))
    metering.enabled = False
    deferred: list[dict] = []
    assert metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10, defer=deferred) == \
        pytest.approx(0.0026, abs=1e-15), "the cost is still reported to the caller"
    assert deferred == [] and usage_rows(store) == [] and metering.budget()["spent_usd"] == 0


def test_alert_texts_and_fields_are_exact(store) -> None:
    clock = Now(MARCH)
    metering = Metering(store, Catalog.load(), now=clock)
    metering.set_limit(0.003)
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)      # 0.0026 = 86.7 %
    assert metering.budget()["alerts"] == [{
        "level": "warning", "threshold": 0.8, "limit_usd": 0.003, "at": "2026-03-10T12:00:00+00:00",
        "message": "80% of the monthly budget is spent: $0.0026 of $0.0030"}]
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)      # 0.0052
    alerts = metering.budget()["alerts"]
    assert [a["level"] for a in alerts] == ["warning", "critical"]
    assert alerts[1] == {"level": "critical", "threshold": 1.0, "limit_usd": 0.003, "at": "2026-03-10T12:00:00+00:00",
                         "message": "budget exhausted: $0.0052 of $0.0030 spent; new agent runs are refused "
                                    "until the period ends"}
    clock.at = datetime(2026, 3, 11, tzinfo=timezone.utc)
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)
    assert metering.budget()["alerts"] == alerts, "BUG: an alert fires again (or is rewritten) within the period"
    assert [a["level"] for a in store.get_setting("budget_alerts:2026-03-01")] == ["warning", "critical"], \
        "alerts are kept per period, under the period's first day"


def test_budget_report_is_exact(store) -> None:
    metering = Metering(store, Catalog.load(), now=Now(MARCH))
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)
    assert metering.budget() == {"limit_usd": 0.0, "spent_usd": 0.0026, "remaining_usd": 0.0, "limited": False,
                                 "alert_levels": [0.8, 1.0], "period_start": "2026-03-01T00:00:00+00:00",
                                 "period_end": "2026-04-01T00:00:00+00:00", "alerts": []}
    metering.set_limit(1)
    b = metering.budget()
    assert (b["limit_usd"], b["remaining_usd"], b["limited"]) == (1.0, 0.9974, True)
    metering.set_limit(0.001)
    assert metering.budget()["remaining_usd"] == 0.0, "BUG: an overspent budget reports a negative remainder"


def test_the_budget_refusal_names_spend_limit_and_time_to_the_period_end(store) -> None:
    metering = Metering(store, Catalog.load(), now=Now(datetime(2026, 3, 31, 23, 0, 0, tzinfo=timezone.utc)))
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)
    metering.set_limit(0.002)
    with pytest.raises(TooManyRequests) as caught:
        metering.check_budget()
    assert caught.value.message == "message delivery failed: quota exceeded: monthly budget reached: $0.0026 of $0.0020 spent this month"
    assert caught.value.retry_after == 3600 and caught.value.status == 429


def test_a_shared_database_reads_other_daemons_spend_and_limit(store) -> None:
    here = Metering(store, Catalog.load(), now=Now(MARCH))
    there = Metering(store, Catalog.load(), now=Now(MARCH))
    here.shared = True
    assert (here.budget()["limit_usd"], here.budget()["limited"], here.limit_usd) == (0.0, False, 0.0), \
        "BUG: a shared database without a limit reads as limited"
    there.record("b1", "beta", "openai", "gpt-4o", 1000, 10)
    there.set_limit(0.0026)
    assert here.budget()["spent_usd"] == pytest.approx(0.0026) and here.limit_usd == 0.0026, \
        "BUG: a daemon on a shared database ignores what the others spent"
    with pytest.raises(TooManyRequests):
        here.check_budget()
    alone = Metering(store, Catalog.load(), now=Now(MARCH))
    there.record("b1", "beta", "openai", "gpt-4o", 1000, 10)
    assert alone.budget()["spent_usd"] == pytest.approx(0.0026), "a single daemon keeps its own running total"
    there.set_limit(0)
    assert alone.limit_usd == 0.0026
    alone.follow_limit(0)
    assert alone.limit_usd == 0.0 and store.get_setting("budget_limit_usd") == 0.0
    alone.follow_limit(5)
    assert alone.limit_usd == 5.0 and store.get_setting("budget_limit_usd") == 0.0, \
        "following another daemon's limit writes nothing back"
    there.set_limit(5, [0.5, 1.0])
    assert store.get_setting("budget_alert_levels") == [0.5, 1.0]
    alone.follow_limit(5, store.get_setting("budget_alert_levels"))
    assert alone.alert_levels == [0.5, 1.0] and alone.budget()["alert_levels"] == [0.5, 1.0]
    alone.follow_limit(5, None)
    assert alone.alert_levels == [0.8, 1.0], "no stored levels: the default"



def test_a_shared_check_sums_the_spend_only_under_a_limit(store, caplog) -> None:
    here = Metering(store, Catalog.load(), now=Now(MARCH))
    there = Metering(store, Catalog.load(), now=Now(MARCH))
    here.shared = True
    there.record("b1", "beta", "openai", "gpt-4o", 1000, 10)
    caplog.set_level("INFO", logger="pony.orm.sql")
    orm.set_sql_debug(True)
    try:
        here.check_budget()  # no limit: nothing to refuse, and no need to add up the month
        assert not [r for r in caplog.records if "SUM(cost_usd)" in r.getMessage()], \
            "a check without a limit summed the month's usage"
        report = here.budget()  # the report shows the spend with or without a limit
        assert (report["spent_usd"], report["limited"]) == (pytest.approx(0.0026), False)
        there.record("b1", "beta", "openai", "gpt-4o", 1000, 10)  # spent since the report
        there.set_limit(0.004)
        with pytest.raises(TooManyRequests) as caught:
            here.check_budget()  # another daemon's limit and spend, both read by the check itself
        assert [r for r in caplog.records if "SUM(cost_usd)" in r.getMessage()]
    finally:
        orm.set_sql_debug(False)
    assert caught.value.message == "message delivery failed: quota exceeded: monthly budget reached: $0.0052 of $0.0040 spent this month"
    assert here.budget()["spent_usd"] == pytest.approx(0.0052)


def test_reports_are_ordered_by_spend_then_name(store) -> None:
    clock = Now(MARCH)
    metering = Metering(store, Catalog.load(), now=clock)
    metering.record("a1", "alpha", "openai", "zz-unpriced", 1, 1)
    metering.record("a1", "alpha", "openai", "aa-unpriced", 2, 2)
    metering.record("b2", "beta", "openai", "gpt-4o", 1000, 10)
    metering.record("b2", "beta-renamed", "openai", "gpt-4o-mini", 1000, 10)
    start, end = metering.period(None, None)
    models = metering.by_model(start, end)
    assert [m["model"] for m in models] == ["gpt-4o", "gpt-4o-mini", "aa-unpriced", "zz-unpriced"], \
        "BUG: by-model report not ordered by cost, then name"
    assert models[2] == {"model": "aa-unpriced", "input_tokens": 2, "output_tokens": 2, "cost_usd": 0.0,
                         "requests": 1}
    agents = metering.by_agent(start, end)
    assert [(a["agent_id"], a["agent_name"]) for a in agents] == [("b2", "beta-renamed"), ("a1", "alpha")]
    assert agents[1] == {"agent_id": "a1", "agent_name": "alpha", "spent_usd": 0.0, "input_tokens": 3,
                         "output_tokens": 3}


def test_spend_per_day_is_exact_and_oldest_first(store) -> None:
    clock = Now(datetime(2026, 3, 2, 23, 59, 59, tzinfo=timezone.utc))
    metering = Metering(store, Catalog.load(), now=clock)
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)
    clock.at = datetime(2026, 3, 1, 0, 0, tzinfo=timezone.utc)
    metering.record("a1", "alpha", "openai", "gpt-4o", 2000, 30)
    metering.record("a1", "alpha", "openai", "gpt-4o", 1, 0)
    clock.at = datetime(2026, 3, 3, 0, 0, tzinfo=timezone.utc)
    metering.record("a1", "alpha", "openai", "gpt-4o", 4000, 0)
    start, end = datetime(2026, 3, 1, tzinfo=timezone.utc), datetime(2026, 3, 3, tzinfo=timezone.utc)
    assert metering.by_day(start, end) == [
        {"day": "2026-03-01", "cost_usd": 0.0053025, "input_tokens": 2001, "output_tokens": 30, "requests": 2},
        {"day": "2026-03-02", "cost_usd": 0.0026, "input_tokens": 1000, "output_tokens": 10, "requests": 1}], \
        "BUG: the per-day spend report is wrong (window, grouping or order)"
    assert metering.by_day(end, datetime(2026, 4, 1, tzinfo=timezone.utc)) == [
        {"day": "2026-03-03", "cost_usd": 0.01, "input_tokens": 4000, "output_tokens": 0, "requests": 1}]


def test_report_sums_are_rounded_to_ten_decimals(store) -> None:
    metering = Metering(store, Catalog.load(), now=Now(MARCH))
    for _ in range(3):
        metering.record("a1", "alpha", "openai", "gpt-4o", 1, 0)     # 0.0000025 each
    start, end = metering.period(None, None)
    assert metering.totals(start, end)["total_cost_usd"] == 0.0000075
    assert metering.by_model(start, end)[0]["cost_usd"] == 0.0000075
    assert metering.by_agent(start, end)[0]["spent_usd"] == 0.0000075
    assert metering.by_day(start, end)[0]["cost_usd"] == 0.0000075
    assert metering.budget()["spent_usd"] == 0.0000075


def test_spending_without_a_limit_raises_no_alert_later(store) -> None:
    metering = Metering(store, Catalog.load(), now=Now(MARCH))
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)     # no limit yet: 0.0026
    metering.set_limit(0)
    metering.set_limit(1)
    assert metering.budget()["alerts"] == [], "BUG: spend without a limit left alerts behind"
    metering.set_limit(0.0026 / 0.8)
    assert [a["level"] for a in metering.budget()["alerts"]] == ["warning"], \
        "BUG: an alert recorded while unlimited keeps the real one from firing"


def test_a_negative_limit_reports_nothing_remaining(store) -> None:
    metering = Metering(store, Catalog.load(), now=Now(MARCH))
    metering.follow_limit(-1)
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)
    b = metering.budget()
    assert (b["remaining_usd"], b["limited"], b["alerts"]) == (0.0, False, [])
    metering.check_budget()   # not a limit: never refused


def test_remaining_budget_is_reported_to_ten_decimals(store) -> None:
    metering = Metering(store, Catalog.load(), now=Now(MARCH))
    metering.set_limit(1.00000000004)
    metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10)
    assert metering.budget()["remaining_usd"] == 0.9974, "remaining_usd is money: 10 decimals, like every amount"
