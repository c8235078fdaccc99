#!/usr/bin/env python3
"""Scheduler benchmark: what 10,000 enabled cron jobs cost an idle daemon, and how late due
jobs fire.

Starts the real daemon (fake LLM behind it) with `--jobs / 50` agents and measures its CPU
(utime + stime of every thread, from /proc) while idle for `--seconds`; creates `--jobs`
enabled jobs (50 per agent, the default `max_jobs_per_agent`) due far in the future (a yearly
cron expression) and measures the idle CPU again; then
creates `--due` one-shot jobs due a few seconds ahead, all at the same second, and reports
the firing lag of each (the run's `started_at` minus its `due_at`). Figures only; nothing is
asserted.

    python scripts/bench_scheduler.py [--jobs 10000] [--seconds 20] [--due 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

from benchlib import bench_daemon, fake_llm, percentile

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def idle_cpu(pid: int, seconds: float) -> float:
    """The daemon's CPU use while nobody talks to it, in % of one core."""
    time.sleep(2)  # what the last requests left behind (a checkpoint, a heartbeat) settles first
    before, began = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - began) * 100


def ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--due", type=int, default=20)
    args = parser.parse_args()
    with fake_llm() as fake, bench_daemon(fake) as d:
        pid = d.proc.pid
        with ThreadPoolExecutor(8) as pool:
            agents = list(pool.map(lambda i: d.post("/api/agents", json={
                "manifest_toml": f'name = "bench-{i:04d}"\n'}).json()["agent_id"], range(-(-args.jobs // 50))))
        due_agent = d.post("/api/agents", json={"manifest_toml": 'name = "bench-due"\n'}).json()["agent_id"]
        without = idle_cpu(pid, args.seconds)
        print(f"idle CPU without jobs:        {without:6.3f} % of one core ({args.seconds:.0f} s)")

        def create(i: int) -> None:
            d.post("/api/cron/jobs", json={
                "name": f"job-{i:05d}", "agent_id": agents[i // 50], "schedule": {"kind": "cron", "expr": "0 0 1 1 *"},
                "action": {"kind": "agent_turn", "message": f"yearly {i}"}}).raise_for_status()

        began = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(args.jobs)))
        print(f"created {args.jobs} enabled jobs in {time.perf_counter() - began:.1f} s")
        with_jobs = idle_cpu(pid, args.seconds)
        print(f"idle CPU with {args.jobs} jobs:  {with_jobs:6.3f} % of one core")
        print(f"added by the jobs:            {with_jobs - without:+6.3f} % of one core "
              f"(ratio {with_jobs / without if without else float('inf'):.2f}x)")

        due = datetime.fromtimestamp(int(time.time()) + 5, timezone.utc).isoformat().replace("+00:00", "Z")
        ids = [d.post("/api/cron/jobs", json={
            "name": f"due-{i}", "agent_id": due_agent, "schedule": {"kind": "at", "at": due},
            "action": {"kind": "agent_turn", "message": f"due {i}"}}).json()["id"] for i in range(args.due)]
        time.sleep(max(0.0, ts(due) - time.time()) + 3)
        lags = []
        for job_id in ids:
            runs = d.get(f"/api/cron/jobs/{job_id}/runs").json()
            if runs:
                lags.append((ts(runs[-1]["started_at"]) - ts(runs[-1]["due_at"])) * 1000)
        print(f"{len(lags)} of {args.due} jobs due at the same second fired; lag after the due time: "
              f"p50 {statistics.median(lags):.1f} ms, p99 {percentile(lags, 99):.1f} ms, max {max(lags):.1f} ms"
              if lags else f"none of {args.due} jobs fired")


if __name__ == "__main__":
    main()
