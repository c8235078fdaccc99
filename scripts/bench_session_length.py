#!/usr/bin/env python3
"""What one message costs as a conversation grows: the daemon's CPU and the p50 latency of
`POST /api/agents/{id}/message` at several session lengths, one agent, fast fake upstream.

A message must cost the same whatever the length of the session before it: the
model is sent only the history window, and the store appends the new messages as rows.
The session is grown with real messages to each length in turn; at each, `--samples`
messages are timed (wall time per request, and the daemon's CPU time from /proc divided by
the messages). Figures only; nothing is asserted.

    python scripts/bench_session_length.py [--lengths 100,1000,3000,6000] [--samples 300] [--postgres]

`--postgres` runs the daemon on a PostgreSQL database of a temp cluster (initdb/pg_ctl, as
the tests start it; or AGENTD_TEST_DATABASE_URL): there every run reads its window from the
database, since other daemons may write the session too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_cpu import cpu_seconds  # noqa: E402
from bench_side_by_side import agentd_daemon, spawn_agents, start_process  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="100,1000,3000,6000",
                        help="session lengths (stored messages: two per exchange) to measure at")
    parser.add_argument("--samples", type=int, default=300, help="timed messages at each length")
    parser.add_argument("--postgres", action="store_true", help="the daemon on PostgreSQL, not SQLite")
    args = parser.parse_args()
    lengths = sorted(int(x) for x in args.lengths.split(","))
    upstream_proc, upstream = start_process([sys.executable, str(ROOT / "scripts" / "fast_upstream.py")])
    tmp = tempfile.TemporaryDirectory()
    daemon = None
    try:
        env = {}
        if args.postgres:
            import pgtest

            env["AGENTD_DATABASE_URL"] = pgtest.databases().new_url()
        daemon = agentd_daemon(Path(tmp.name), upstream, env=env)
        _, (agent_id,) = spawn_agents(daemon, 1, prefix="long")
        url = f"{daemon.url}/api/agents/{agent_id}/message"
        http = requests.Session()
        body = {"message": "a sentence of about the length people type " * 2}

        def send() -> None:
            http.post(url, json=body, timeout=30).raise_for_status()

        stored = 0
        print(f"{'stored messages':>16} {'p50 ms':>8} {'CPU ms/message':>15}")
        for length in lengths:
            while stored < length:
                send()
                stored += 2
            latencies = []
            before = cpu_seconds(daemon.proc.pid)
            for _ in range(args.samples):
                began = time.perf_counter()
                send()
                latencies.append((time.perf_counter() - began) * 1000)
            cpu = (cpu_seconds(daemon.proc.pid) - before) * 1000 / args.samples
            stored += 2 * args.samples
            print(f"{length:>16} {statistics.median(latencies):>8.2f} {cpu:>15.2f}", flush=True)
    finally:
        if daemon is not None:
            daemon.stop()
        upstream_proc.terminate()
        tmp.cleanup()


if __name__ == "__main__":
    main()
