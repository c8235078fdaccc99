#!/usr/bin/env python3
"""Catalog and metering benchmark.

Prints the latency of GET /api/models and GET /api/models/{alias}, and what usage
recording costs per model call: messages/s of one agent against the fake LLM with
recording on and off (two daemons, same machine), as a ratio and as added ms; and
GET /api/usage latency with 100,000 usage records.
Figures only; nothing is asserted.

    python scripts/bench_catalog.py [--seconds 3] [--requests 200]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import time
from datetime import datetime, timedelta, timezone

import requests

from benchlib import bench_daemon, fake_llm, percentile, summary, timed_loop


def latency(session: requests.Session, url: str, count: int) -> tuple[float, float]:
    """(p50, p99) in ms of `count` sequential GETs."""
    values = []
    for _ in range(count):
        began = time.perf_counter()
        session.get(url).raise_for_status()
        values.append((time.perf_counter() - began) * 1000)
    return statistics.median(values), percentile(values, 99)


def messages_per_second(daemon, seconds: float) -> tuple[float, float]:
    agent = daemon.post("/api/agents", json={"manifest_toml": 'name = "meter"\nprofile = "minimal"\n'}).json()
    session = requests.Session()
    url = f"{daemon.url}/api/agents/{agent['agent_id']}/message"

    def call(_: int) -> None:
        session.post(url, json={"message": "hi"}).raise_for_status()

    def fresh_session(_: int, calls: int) -> None:
        if calls % 10 == 0:  # keep the session short, as in bench_agents.py
            session.post(f"{daemon.url}/api/agents/{agent['agent_id']}/session/reset").raise_for_status()

    return summary(timed_loop(call, 1, seconds, fresh_session), seconds)


def fill_usage(daemon, rows: int) -> None:
    """Write usage rows straight into the daemon's database (WAL allows a second writer)."""
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    with sqlite3.connect(daemon.home / "data" / "agentd.db", timeout=30) as db:
        db.executemany(
            "INSERT INTO usage (agent_id, agent_name, provider, model, input_tokens, output_tokens, cost_usd, "
            "priced, at) VALUES (?, ?, 'openai', ?, ?, ?, ?, 1, ?)",
            ((f"agent-{i % 50}", f"a{i % 50}", ("gpt-4o", "gpt-4o-mini", "claude-sonnet-4-6")[i % 3], 100 + i % 7,
              20 + i % 5, 0.0012, now - timedelta(seconds=i * 20)) for i in range(rows)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--usage-rows", type=int, default=100_000)
    args = parser.parse_args()
    with fake_llm() as fake_url:
        with bench_daemon(fake_url) as daemon:
            session = requests.Session()
            count = len(session.get(f"{daemon.url}/api/models").json())
            for path in ("/api/models", "/api/models/sonnet", "/api/models/gpt-4o", "/api/models/aliases"):
                p50, p99 = latency(session, daemon.url + path, args.requests)
                print(f"GET {path:<22} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms"
                      + (f"  ({count} models)" if path == "/api/models" else ""))
            on_rate, on_p50 = messages_per_second(daemon, args.seconds)
            usage = session.get(f"{daemon.url}/api/usage").json()
            fill_usage(daemon, args.usage_rows)
            for path in ("/api/usage", "/api/usage/by-model", "/api/budget/agents", "/api/budget"):
                p50, p99 = latency(session, daemon.url + path, 20)
                print(f"GET {path:<22} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  (with {args.usage_rows:,} more usage rows)")
        with bench_daemon(fake_url, env={"AGENTD_BENCH_NO_METERING": "1"}) as daemon:
            off_rate, off_p50 = messages_per_second(daemon, args.seconds)
    print(f"1 agent, messages/s with usage recording on: {on_rate:.0f} (p50 {on_p50:.2f} ms); "
          f"off: {off_rate:.0f} (p50 {off_p50:.2f} ms)")
    print(f"recording on/off throughput ratio: {on_rate / off_rate:.3f}; "
          f"added per model call: {on_p50 - off_p50:.3f} ms (p50); rows recorded: {usage['requests']}")


if __name__ == "__main__":
    main()
